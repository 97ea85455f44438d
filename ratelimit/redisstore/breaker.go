package redisstore

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Breaker defaults applied for zero BreakerOptions fields.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCoolDown = time.Second
)

// BreakerOptions configures the circuit breaker. The zero value means the
// defaults: open after DefaultBreakerFailures consecutive failures, for
// DefaultBreakerCoolDown.
type BreakerOptions struct {
	// Failures is how many consecutive failed calls open the breaker; 0
	// means DefaultBreakerFailures, a negative value disables the breaker
	// (every decision then reaches for Redis).
	Failures int
	// CoolDown is how long the breaker stays open before it lets one probe
	// through; 0 means DefaultBreakerCoolDown. An outage then costs at most
	// about one dial attempt per CoolDown (times the client's retries), plus
	// the Failures calls that opened it.
	CoolDown time.Duration

	// now is the breaker's clock; nil means time.Now. Tests set it.
	now func() time.Time
}

// BreakerState is the state of a Store's breaker.
type BreakerState int

// Breaker states.
const (
	// BreakerClosed: calls go to Redis.
	BreakerClosed BreakerState = iota
	// BreakerOpen: calls fail at once with ErrBreakerOpen.
	BreakerOpen
	// BreakerHalfOpen: the cool-down has passed; the next call is a probe.
	BreakerHalfOpen
)

// String returns "closed", "open" or "half-open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("BreakerState(%d)", int(s))
}

// breaker is lock-free: the closed path, taken by every decision while Redis
// is healthy, costs one atomic load before the call and at most two after.
type breaker struct {
	threshold int64 // ≤ 0: disabled
	coolDown  time.Duration
	now       func() time.Time

	fails     atomic.Int64
	openUntil atomic.Int64 // UnixNano; 0 means closed
	probing   atomic.Bool  // a half-open probe is in flight
}

func newBreaker(o BreakerOptions) (*breaker, error) {
	if o.CoolDown < 0 {
		return nil, fmt.Errorf("%w: breaker cool-down %v is negative", ErrConfig, o.CoolDown)
	}
	b := &breaker{threshold: int64(o.Failures), coolDown: o.CoolDown, now: o.now}
	if b.threshold == 0 {
		b.threshold = DefaultBreakerFailures
	}
	if b.coolDown == 0 {
		b.coolDown = DefaultBreakerCoolDown
	}
	if b.now == nil {
		b.now = time.Now
	}
	return b, nil
}

// allow reports whether a call may go to Redis, and whether it is the
// half-open probe (whose outcome alone decides the next state).
func (b *breaker) allow() (probe, ok bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return false, true
	}
	if b.now().UnixNano() < until {
		return false, false
	}
	if b.probing.CompareAndSwap(false, true) {
		return true, true
	}
	return false, false
}

// done records a call's outcome. A call abandoned by its caller counts for
// nothing, but a probe must still hand back the probe slot.
func (b *breaker) done(probe, success, callerGaveUp bool) {
	if b.threshold <= 0 {
		return
	}
	switch {
	case success:
		// Loads first: on the healthy path nothing is written, so decisions
		// on many cores do not bounce one cache line between them.
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		if b.openUntil.Load() != 0 {
			b.openUntil.Store(0)
		}
	case callerGaveUp:
	case probe:
		b.openUntil.Store(b.now().Add(b.coolDown).UnixNano())
	default:
		if b.fails.Add(1) >= b.threshold {
			// Only the call that crosses the threshold while closed opens it;
			// stragglers failing after it do not push the cool-down out.
			b.openUntil.CompareAndSwap(0, b.now().Add(b.coolDown).UnixNano())
		}
	}
	if probe {
		b.probing.Store(false)
	}
}

func (b *breaker) state() BreakerState {
	until := b.openUntil.Load()
	switch {
	case until == 0:
		return BreakerClosed
	case b.now().UnixNano() < until:
		return BreakerOpen
	}
	return BreakerHalfOpen
}
