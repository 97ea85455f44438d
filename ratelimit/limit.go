// Package ratelimit is sluice's limiter core: EWMA budgets with a half-life,
// the exact backoff a refused client is told, a Store interface that decides
// every window of one key in one atomic step, a bounded in-memory Store, a
// Limiter that remembers refused clients locally, and a per-actor write Quota.
//
// The package imports nothing outside the standard library. Redis lives in
// ratelimit/redisstore; WebSocket and Nostr live in relay.
//
// # The math
//
// A budget is a score S written at time t. At time now it has decayed to
// S·2^(-(now-t)/T), where T is the limit's Period (a half-life). A message of
// cost c is admitted when decayed+c ≤ R (the limit's Rate); then decayed+c is
// written. A refused message writes nothing, so the wait a client is told
// stays true however often it knocks. The wait until the same message would
// be admitted is T·log2(decayed/(R−c)).
//
// # Time resolution and numerical honesty
//
// Decisions are made on whole milliseconds, the resolution of Redis TIME and
// of the instants the Redis store's script is given: the memory store
// truncates every instant to its unix millisecond, so one step table of
// instants gives the same decisions on every store.
//
// A Decision's Wait is a whole number of milliseconds: the smallest w ≥ 1 ms
// such that the very admission test the store runs, run at now+w against the
// unchanged score, admits. It is found from T·log2(S/(R−c)) rounded up and
// then checked by running that test at now+w and now+w−1ms (and searched
// for, when R is so close to c that adding c absorbs most of R−c), so float
// error in log and exp can neither make a client that obeys the wait be
// refused nor let one that comes back 1 ms sooner in. Admission itself
// compares decayed+c ≤ R with no tolerance.
//
// # Bounded memory
//
// MemoryStore, the Limiter's table of refused clients and Quota are fixed
// tables sized at construction, indexed by hash/maphash with a per-process
// random seed: a client cannot choose which slot its key lands in, and no
// key, however many, makes any of them grow. Keys that share a slot share a
// budget; the sizes make that rare.
package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Sentinel errors. Store implementations wrap them with %w; test with errors.Is.
var (
	// ErrUnavailable means the store could not decide: a timeout, a refused
	// connection, an open breaker or a reply it could not read. A caller must
	// fail closed and must not report it as a rate limit.
	ErrUnavailable = errors.New("ratelimit: store unavailable")
	// ErrInvalidLimit is wrapped by Limit.Validate.
	ErrInvalidLimit = errors.New("ratelimit: invalid limit")
)

// Limit is one EWMA window: a message of cost Cost is admitted while the
// decayed score plus Cost stays at or below Rate; the score halves every
// Period. The zero Cost means 1.
type Limit struct {
	Rate   float64       // R: the most the score may reach
	Period time.Duration // T: the half-life of the score
	Cost   float64       // c: what one message adds; 0 means 1
	// Shadow marks a window that is decided, stored and counted like any
	// other but never refuses: the stores ignore it, and a policy
	// (relay/policy) decides such windows apart and lets the message pass.
	Shadow bool
}

// PerPeriod returns a Limit of rate messages of cost 1 with half-life period.
func PerPeriod(rate float64, period time.Duration) Limit {
	return Limit{Rate: rate, Period: period, Cost: 1}
}

// cost returns the effective cost: 0 means 1.
func (l Limit) cost() float64 {
	if l.Cost == 0 {
		return 1
	}
	return l.Cost
}

// EffectiveCost returns the cost one message adds (Cost, or 1 when Cost is 0).
func (l Limit) EffectiveCost() float64 { return l.cost() }

// Validate reports whether the limit can ever admit a message and has a
// finite wait: Period > 0 (and at least a millisecond, the key resolution),
// Rate and Cost finite, and Rate > Cost > 0. Rate ≤ Cost is refused because
// the backoff T·log2(S/(R−c)) would be undefined.
func (l Limit) Validate() error {
	c := l.cost()
	switch {
	case l.Period < time.Millisecond:
		return fmt.Errorf("%w: period %v must be at least 1ms", ErrInvalidLimit, l.Period)
	case l.Period%time.Millisecond != 0:
		return fmt.Errorf("%w: period %v must be a whole number of milliseconds", ErrInvalidLimit, l.Period)
	case math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) || math.IsNaN(c) || math.IsInf(c, 0):
		return fmt.Errorf("%w: rate and cost must be finite numbers", ErrInvalidLimit)
	case c <= 0:
		return fmt.Errorf("%w: cost %v must be greater than 0", ErrInvalidLimit, c)
	case l.Rate <= c:
		return fmt.Errorf("%w: rate %v must be greater than cost %v", ErrInvalidLimit, l.Rate, c)
	}
	return nil
}

// Burst returns how many messages the limit admits at one instant from rest:
// ⌊R/c⌋, counted the way a store counts them (by adding c to the score until
// it would pass R), so that float sums such as 0.1+0.1+0.1 > 0.3 give the
// answer a store gives. It returns 0 for a limit that Validate refuses.
func (l Limit) Burst() int {
	c := l.cost()
	if l.Validate() != nil {
		return 0
	}
	n := math.Floor(l.Rate / c)
	if n > 1<<20 {
		return int(n) // too many to count one by one; float sums are exact enough here
	}
	k, s := 0, 0.0
	for s+c <= l.Rate {
		s += c
		k++
	}
	return k
}

// Interval returns the steady-state spacing of admitted messages once the
// burst is spent: −T·log2(1 − c/R). A client that obeys every wait is spaced
// by this rounded up to whole milliseconds, the resolution of decisions. It
// returns 0 for a limit that Validate refuses.
func (l Limit) Interval() time.Duration {
	if l.Validate() != nil {
		return 0
	}
	return time.Duration(-float64(l.Period) * math.Log2(1-l.cost()/l.Rate))
}

// Sustained returns the steady-state rate in messages per second, about
// R·ln2/(c·T) when R ≫ c. It returns 0 for a limit that Validate refuses.
func (l Limit) Sustained() float64 {
	iv := l.Interval()
	if iv <= 0 {
		return 0
	}
	return float64(time.Second) / float64(iv)
}

// String renders the limit as in the config ("10/1s"), with its cost when
// that is not 1 ("10/1s cost 2"). Burst, Interval and Sustained say what it
// means.
func (l Limit) String() string {
	s := strconv.FormatFloat(l.Rate, 'g', -1, 64) + "/" + l.Period.String()
	if c := l.cost(); c != 1 {
		s += " cost " + strconv.FormatFloat(c, 'g', -1, 64)
	}
	if l.Shadow {
		s += " (shadow)"
	}
	return s
}

// validateLimits checks the limits of one key for NewWindows, at
// configuration time, so that deciding them need not. An empty list is
// valid and means the key passes free.
func validateLimits(limits []Limit) error {
	if len(limits) > MaxWindows {
		return fmt.Errorf("%w: %d windows, at most %d", ErrInvalidLimit, len(limits), MaxWindows)
	}
	for i, l := range limits {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("limit %d (%v): %w", i+1, l, err)
		}
		for _, p := range limits[:i] {
			if p.Period/time.Millisecond == l.Period/time.Millisecond {
				return fmt.Errorf("%w: two limits with period %v would share one key", ErrInvalidLimit, l.Period)
			}
		}
	}
	return nil
}
