package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Defaults of a Penalty's zero fields, and how long a key's strikes are
// remembered.
const (
	defaultPenaltyThreshold = 10
	defaultPenaltyHalfLife  = 10 * time.Minute
	defaultPenaltyBan       = time.Minute
	defaultPenaltyMaxBan    = time.Hour
	// PenaltyMemory is how long a key's penalty record outlives its last
	// violation or the end of its last ban: a client that comes back within
	// it resumes its escalation (its next ban twice its last), one that
	// stays away longer starts again from Penalty.Ban.
	PenaltyMemory = 24 * time.Hour
)

// penaltySlack is how close to Penalty.Threshold a score reaches it: the
// decay over the milliseconds between violations must not make the last of
// the threshold's one-point violations fall short.
const penaltySlack = 0.01

// Penalty is the escalating penalty box: violations (a connection cut for
// knocking, invalid frames, failed AUTHs, refused upgrades) add points to
// a score per client and per aggregate that halves every HalfLife; a score
// reaching Threshold bans that key for Ban, and every further ban within
// PenaltyMemory lasts twice the one before, up to MaxBan. A zero field means
// its default: 10 points, 10 minutes, 1 minute, 1 hour. Bans are enforced at
// the upgrade (HTTP 429 with the ban's remaining time as Retry-After).
type Penalty struct {
	Threshold float64
	HalfLife  time.Duration
	Ban       time.Duration
	MaxBan    time.Duration
}

// WithDefaults returns p with each zero field set to its default.
func (p Penalty) WithDefaults() Penalty {
	if p.Threshold == 0 {
		p.Threshold = defaultPenaltyThreshold
	}
	if p.HalfLife == 0 {
		p.HalfLife = defaultPenaltyHalfLife
	}
	if p.Ban == 0 {
		p.Ban = defaultPenaltyBan
	}
	if p.MaxBan == 0 {
		p.MaxBan = max(defaultPenaltyMaxBan, p.Ban)
	}
	return p
}

// Validate reports what is wrong with p (its zero fields taken as their
// defaults): a threshold that is not positive and finite, a half-life or
// ban under a second or not whole milliseconds (the store's resolution),
// a MaxBan shorter than Ban or longer than PenaltyMemory.
func (p Penalty) Validate() error {
	d := p.WithDefaults()
	var errs []error
	if !(d.Threshold > 0) || math.IsInf(d.Threshold, 0) {
		errs = append(errs, fmt.Errorf("threshold must be a positive number of points, got %v", p.Threshold))
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"half-life", d.HalfLife}, {"ban", d.Ban}, {"max ban", d.MaxBan}} {
		if f.v < time.Second || f.v%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("%s must be at least 1s in whole milliseconds, got %v", f.name, f.v))
		}
	}
	if d.MaxBan < d.Ban || d.MaxBan > PenaltyMemory {
		errs = append(errs, fmt.Errorf("max ban must be from the ban (%v) to %v, got %v", d.Ban, PenaltyMemory, d.MaxBan))
	}
	return errors.Join(errs...)
}

// banFor returns the length of a key's ban after strikes earlier ones:
// Ban doubled per strike, capped at MaxBan. p has its defaults.
func (p Penalty) banFor(strikes int) time.Duration {
	if strikes >= 40 {
		return p.MaxBan
	}
	return min(p.Ban<<strikes, p.MaxBan)
}

// Guard keeps what a gate knows of each client beyond its budgets: the
// connections it holds open and its penalty record. Keys are clients (as
// the gate's identity makes them) and aggregate prefixes; a store that
// shards by key keeps each one's state together.
//
// Hold counts one more open connection of client and Release one fewer;
// Hold refuses when client or one of aggs is banned (ok false, wait the
// ban's remaining time) or when client would hold more than max (ok false,
// wait 0; max 0 or less means no cap). Violate adds points to each of
// keys (the client, then its aggregates) under p: banned is the key that
// is banned, "" for none, wait its ban's remaining time and started
// whether this call started the ban (exactly one call does per ban).
// Close stops what the Guard runs in the background. An error wraps
// ErrUnavailable: the gate fails closed at the upgrade.
//
// A Guard is safe for concurrent use.
type Guard interface {
	Hold(ctx context.Context, client string, aggs []string, max int) (wait time.Duration, ok bool, err error)
	Release(client string)
	Violate(ctx context.Context, keys []string, points float64, p Penalty) (banned string, wait time.Duration, started bool, err error)
	Close() error
}

// memoryGuardKeys bounds a memory Guard's penalty records. A client that
// keeps violating fills it with records that outlive its bans by
// PenaltyMemory; when full, a record that bans nobody is evicted first
// (costing its owner its escalation), so bans already given hold.
const memoryGuardKeys = 1 << 16

// NewMemoryGuard returns a Guard of one process: connections counted in a
// map with an entry per client holding one, penalty records in a table of
// at most 65,536 keys, on clock (nil: the real one; pass the Limiter's).
func NewMemoryGuard(clock Clock) Guard {
	return &memoryGuard{clock: clock, conns: make(map[string]int), pen: make(map[string]*penaltyRecord)}
}

type memoryGuard struct {
	clock Clock
	mu    sync.Mutex
	conns map[string]int
	pen   map[string]*penaltyRecord
}

// penaltyRecord is one key's penalty state, as the Redis store keeps it.
type penaltyRecord struct {
	score   float64
	at      time.Time // of score
	until   time.Time // of the ban; zero: none yet
	strikes int
	forget  time.Time // when the record is dropped
}

func (g *memoryGuard) Hold(_ context.Context, client string, aggs []string, maxConns int) (time.Duration, bool, error) {
	now := g.clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := -1; i < len(aggs); i++ {
		k := client
		if i >= 0 {
			k = aggs[i]
		}
		if r := g.pen[k]; r != nil && now.Before(r.until) {
			return r.until.Sub(now), false, nil
		}
	}
	if maxConns > 0 {
		if g.conns[client] >= maxConns {
			return 0, false, nil
		}
		g.conns[client]++
	}
	return 0, true, nil
}

func (g *memoryGuard) Release(client string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if n, ok := g.conns[client]; ok {
		if n <= 1 {
			delete(g.conns, client)
		} else {
			g.conns[client] = n - 1
		}
	}
}

func (g *memoryGuard) Violate(_ context.Context, keys []string, points float64, p Penalty) (string, time.Duration, bool, error) {
	p = p.WithDefaults()
	now := g.clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	banned, wait, started := "", time.Duration(0), false
	for _, k := range keys {
		r := g.pen[k]
		if r != nil && !now.Before(r.forget) {
			delete(g.pen, k)
			r = nil
		}
		if r == nil {
			if len(g.pen) >= memoryGuardKeys {
				g.evict(now)
			}
			r = &penaltyRecord{at: now}
			g.pen[k] = r
		}
		w, s := r.add(now, points, p)
		if w > wait {
			banned, wait, started = k, w, s
		}
	}
	return banned, wait, started, nil
}

// add adds points to r at now under p and returns the remaining ban (0
// for none) and whether this call started it. A banned key gains nothing:
// its ban already answers for what it does meanwhile.
func (r *penaltyRecord) add(now time.Time, points float64, p Penalty) (time.Duration, bool) {
	if now.Before(r.until) {
		return r.until.Sub(now), false
	}
	if d := now.Sub(r.at); d > 0 {
		r.score *= math.Exp2(-d.Seconds() / p.HalfLife.Seconds())
	}
	r.score += points
	r.at = now
	r.forget = now.Add(PenaltyMemory)
	if r.score+penaltySlack < p.Threshold {
		return 0, false
	}
	ban := p.banFor(r.strikes)
	r.strikes++
	r.score = 0
	r.until = now.Add(ban)
	r.forget = r.until.Add(PenaltyMemory)
	return ban, true
}

// evict drops expired records, or else one that bans nobody, or else any.
// g.mu is held.
func (g *memoryGuard) evict(now time.Time) {
	var idle, any string
	for k, r := range g.pen {
		if !now.Before(r.forget) {
			delete(g.pen, k)
			continue
		}
		any = k
		if idle == "" && !now.Before(r.until) {
			idle = k
		}
	}
	if len(g.pen) < memoryGuardKeys {
		return
	}
	if idle != "" {
		delete(g.pen, idle)
	} else {
		delete(g.pen, any)
	}
}

func (g *memoryGuard) Close() error { return nil }
