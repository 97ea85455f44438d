package redisstore

import (
	"fmt"
	"github.com/sluice-relay/sluice/ratelimit"
	"sync"
	"sync/atomic"
	"time"
)

// Breaker defaults applied for zero breakerOptions fields (Options
// describes the breaker they make).
const (
	defaultBreakerFailures    = 5
	defaultBreakerFailureRate = 0.5
	defaultBreakerWindow      = time.Second
	defaultBreakerCoolDown    = 100 * time.Millisecond
)

// breakerOptions tunes the circuit breaker; the zero value means the
// defaults.
type breakerOptions struct {
	// Failures is how many failed round trips within Window (at least
	// FailureRate of them) open the breaker; 0 means 5,
	// a negative value disables the breaker (every decision then reaches
	// for Redis).
	Failures int
	// FailureRate is the share of a window's round trips that must have
	// failed, in (0, 1]; 0 means 0.5.
	FailureRate float64
	// Window is how far back the breaker looks; 0 means one second.
	Window time.Duration
	// CoolDown is the longest the breaker stays open before it lets one
	// probe through; 0 means 100 ms. The first probe comes
	// after a tenth of it, so that decisions resume within about that of
	// Redis answering again; each failed probe doubles the wait, up to
	// CoolDown, and a good one starts it over. An outage then costs a few
	// dial attempts in its first second and about one per CoolDown after
	// (times the client's retries), plus the failed round trips that
	// opened it.
	CoolDown time.Duration

	// now is the breaker's clock; nil means the real, monotonic one
	// (ratelimit.Clock): a host clock stepped back must not hold it open.
	now func() time.Time
}

// breakerState is the state of a breaker.
type breakerState int

// Breaker states.
const (
	// breakerClosed: calls go to Redis.
	breakerClosed breakerState = iota
	// breakerOpen: calls fail at once, as unavailable, without reaching Redis.
	breakerOpen
	// breakerHalfOpen: the cool-down has passed; the next call is a probe.
	breakerHalfOpen
)

// String returns "closed", "open" or "half-open" (Store.BreakerState).
func (s breakerState) String() string {
	switch s {
	case breakerClosed:
		return "closed"
	case breakerOpen:
		return "open"
	case breakerHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("breakerState(%d)", int(s))
}

// outcome is what one round trip says about Redis.
type outcome uint8

const (
	outcomeOK      outcome = iota // Redis answered
	outcomeFailed                 // Redis did not answer (in time, or as the script)
	outcomeIgnored                // the caller gave up: says nothing
)

// breakerBuckets is how many slices a window is counted in.
const breakerBuckets = 10

// breaker: allow, on every decision, is one atomic load while closed;
// record, once per round trip, takes a mutex held for a few counter
// updates.
type breaker struct {
	threshold int64 // ≤ 0: disabled
	rate      float64
	slice     int64 // ns per bucket
	coolDown  time.Duration
	now       func() time.Time

	mu      sync.Mutex
	buckets [breakerBuckets]struct{ epoch, ok, failed int64 }

	openUntil atomic.Int64 // UnixNano; 0 means closed
	probing   atomic.Bool  // a half-open probe is in flight
	wait      atomic.Int64 // the cool-down after the next failed probe, ns
}

// firstCoolDown is the wait before the first probe of an outage.
func (b *breaker) firstCoolDown() time.Duration {
	return max(b.coolDown/10, time.Millisecond)
}

func newBreaker(o breakerOptions) (*breaker, error) {
	if o.CoolDown < 0 || o.Window < 0 || o.FailureRate < 0 || o.FailureRate > 1 {
		return nil, fmt.Errorf("%w: breaker cool-down %v, window %v and failure rate %v must not be negative (and the rate at most 1)", errConfig, o.CoolDown, o.Window, o.FailureRate)
	}
	b := &breaker{threshold: int64(o.Failures), rate: o.FailureRate, coolDown: o.CoolDown, now: o.now}
	if b.threshold == 0 {
		b.threshold = defaultBreakerFailures
	}
	if b.rate == 0 {
		b.rate = defaultBreakerFailureRate
	}
	window := o.Window
	if window == 0 {
		window = defaultBreakerWindow
	}
	b.slice = max(int64(window)/breakerBuckets, 1)
	if b.coolDown == 0 {
		b.coolDown = defaultBreakerCoolDown
	}
	if b.now == nil {
		b.now = ratelimit.Clock(nil).Now
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

// record counts one round trip's outcome. A probe's outcome decides alone:
// success closes the breaker (with a fresh window), failure opens it for
// another cool-down; an ignored probe hands its slot back.
func (b *breaker) record(probe bool, o outcome) {
	if b.threshold <= 0 {
		return
	}
	if probe {
		switch o {
		case outcomeOK:
			b.mu.Lock()
			b.buckets = [breakerBuckets]struct{ epoch, ok, failed int64 }{}
			b.mu.Unlock()
			b.openUntil.Store(0)
		case outcomeFailed:
			wait := time.Duration(b.wait.Load())
			b.wait.Store(int64(min(2*wait, b.coolDown)))
			b.openUntil.Store(b.now().Add(wait).UnixNano())
		}
		b.probing.Store(false)
		return
	}
	if o == outcomeIgnored {
		return
	}
	now := b.now().UnixNano()
	epoch := now / b.slice
	b.mu.Lock()
	bk := &b.buckets[epoch%breakerBuckets]
	if bk.epoch != epoch {
		bk.epoch, bk.ok, bk.failed = epoch, 0, 0
	}
	if o == outcomeOK {
		bk.ok++
		b.mu.Unlock()
		return
	}
	bk.failed++
	var ok, failed int64
	for i := range b.buckets {
		if e := b.buckets[i].epoch; e > epoch-breakerBuckets && e <= epoch {
			ok += b.buckets[i].ok
			failed += b.buckets[i].failed
		}
	}
	b.mu.Unlock()
	if failed >= b.threshold && float64(failed) >= b.rate*float64(ok+failed) {
		// Only a call that finds it closed opens it; stragglers failing
		// after it do not push the cool-down out.
		first := b.firstCoolDown()
		if b.openUntil.CompareAndSwap(0, time.Unix(0, now).Add(first).UnixNano()) {
			b.wait.Store(int64(min(2*first, b.coolDown)))
		}
	}
}

func (b *breaker) state() breakerState {
	until := b.openUntil.Load()
	switch {
	case until == 0:
		return breakerClosed
	case b.now().UnixNano() < until:
		return breakerOpen
	}
	return breakerHalfOpen
}
