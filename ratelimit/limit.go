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
	// ErrBadReply means the store answered with something that is not a list
	// of scores. It is always wrapped together with ErrUnavailable.
	ErrBadReply = errors.New("ratelimit: malformed store reply")
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

// Burst returns how many messages the limit admits from rest: ⌊R/c⌋.
func (l Limit) Burst() int {
	return int(math.Floor(l.Rate/l.cost() + 1e-9))
}

// Interval returns the steady-state spacing of admitted messages once the
// burst is spent: −T·log2(1 − c/R).
func (l Limit) Interval() time.Duration {
	return time.Duration(-float64(l.Period) * math.Log2(1-l.cost()/l.Rate))
}

// Sustained returns the steady-state rate in messages per second.
func (l Limit) Sustained() float64 {
	return float64(time.Second) / float64(l.Interval())
}

// String renders the limit as in the config ("10/1s") and what it means.
func (l Limit) String() string {
	s := strconv.FormatFloat(l.Rate, 'g', -1, 64) + "/" + l.Period.String()
	if c := l.cost(); c != 1 {
		s += " cost " + strconv.FormatFloat(c, 'g', -1, 64)
	}
	return s
}

// Decay returns score s written at written, as seen at now, under half-life period.
// An instant before written is treated as written (clocks never run backwards
// for a score).
func Decay(s float64, written, now time.Time, period time.Duration) float64 {
	dt := now.Sub(written)
	if dt <= 0 {
		return s
	}
	return s * math.Exp2(-float64(dt)/float64(period))
}

// Wait returns how long a refused message of limit l must wait, given the
// current decayed score: T·log2(decayed/(R−c)), or 0 when it would be
// admitted now.
func (l Limit) Wait(decayed float64) time.Duration {
	room := l.Rate - l.cost()
	if decayed <= room {
		return 0
	}
	return time.Duration(math.Ceil(float64(l.Period) * math.Log2(decayed/room)))
}

// RetrySeconds renders a wait for the wire: whole seconds rounded up, never 0.
func RetrySeconds(wait time.Duration) int64 {
	s := int64((wait + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}
