package ratelimit

import "time"

// Clock returns the current instant. It is injected once, where a Limiter
// (or a Gate, or Hooks, through their Limiter) is made, and handed down to
// everything that reads time on its behalf; tests pass fixed instants.
//
// A nil Clock means the real one: the wall clock read once when the process
// started, advanced by the monotonic clock since. Everything the host
// measures — the Limiter's refused-until table, the memory store's decays,
// the in-process quota's windows — is then immune to the host's wall clock
// stepping (NTP, a resumed VM): a step backwards neither lengthens a
// refusal nor overstates a "retry in", a step forwards neither ends one
// early. The price is that its instants drift from the wall clock by
// whatever the host's clock is corrected by while the process runs, which
// only shifts where in-process quota windows start. Redis TIME, read by the
// Redis store's script, stays the one clock shared by every instance.
type Clock func() time.Time

// processStart anchors the real clock.
var processStart = time.Now()

// Now returns the current instant of c.
func (c Clock) Now() time.Time {
	if c == nil {
		return processStart.Add(time.Since(processStart))
	}
	return c()
}
