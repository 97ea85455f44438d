package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"
)

// quotaSlots is the number of slots in every Quota's table; it is not
// configurable. A power of two, so that a hash picks a slot with a mask.
const quotaSlots = 1024

// maxQuotaEvents is the largest events-per-window a Quota accepts: the count
// shares one 64-bit word with the window number.
const maxQuotaEvents = 1<<22 - 1

// ErrInvalidQuota is wrapped by NewQuota.
var ErrInvalidQuota = errors.New("ratelimit: invalid quota")

const (
	quotaCountBits = 22 // up to 4,194,303 events per window
	quotaWinBits   = 64 - quotaCountBits
	quotaWinMask   = 1<<quotaWinBits - 1
	quotaCountMask = maxQuotaEvents
	quotaHalf      = 1 << (quotaWinBits - 1) // serial-number comparison
)

// Quota is the in-process ActorQuota: a per-actor fixed-window budget on
// validated events, at most Events events per actor in each window of
// Window (windows aligned on the unix epoch), where the actor is the
// event's pubkey or the NIP-42 authenticated one. Events a relay accepts
// are permanent, so this caps how fast one actor can turn a session into
// storage, independently of the per-type message limits. It counts for one
// process; redisstore.Quota is the same budget shared by every instance.
//
// The attack it is built for is an actor rotating names: a client that mints
// a fresh pubkey per event would pass any per-actor budget, and a table keyed
// by actor would grow with every name. So the table does not grow: actors are
// hashed, with a per-process random seed that a client cannot aim with, into
// 1,024 fixed slots, and actors that land in one slot share its budget. The
// bound is therefore 1,024 × Events accepted events per window however many
// names an attacker rotates through, and no actor ever allocates memory.
// What the bound does not buy: it does not stop a rotating attacker, it only
// bounds one; honest actors that share a slot with a busy one share its
// budget (the limits are generous so that this is harmless); and a fixed
// window lets one actor spend up to twice Events across a window boundary.
//
// Each slot is one atomic word holding the window number and that window's
// count, updated by compare-and-swap: no lock, and a window rollover cannot
// lose a count or reset a newer window on behalf of a late caller. Time
// comes from the Quota's Clock (WithClock); it never fails, and the context
// is not consulted.
//
// A nil *Quota admits everything. A Quota is safe for concurrent use when
// its clock is; the zero Quota is not usable, use NewQuota.
type Quota struct {
	t     *quotaTable
	clock Clock
}

// quotaTable is a Quota's counts, shared by the Quotas WithClock makes.
type quotaTable struct {
	events uint64
	window int64 // nanoseconds
	seed   maphash.Seed
	slots  [quotaSlots]atomic.Uint64
	seen   [1 << seenBits]atomic.Uint64 // ids charged, by id and window
}

var _ ActorQuota = (*Quota)(nil)

// NewQuota returns a quota of events per window on the real Clock.
// events ≤ 0, events above 2²²−1 (4,194,303) or window ≤ 0 is an error wrapping
// ErrInvalidQuota; a nil *Quota (or ActorQuota) is no quota.
func NewQuota(events int, window time.Duration) (*Quota, error) {
	switch {
	case events <= 0:
		return nil, fmt.Errorf("%w: events %d must be at least 1 (no quota is a nil quota)", ErrInvalidQuota, events)
	case events > maxQuotaEvents:
		return nil, fmt.Errorf("%w: events %d must be at most %d", ErrInvalidQuota, events, maxQuotaEvents)
	case window <= 0:
		return nil, fmt.Errorf("%w: window %v must be positive", ErrInvalidQuota, window)
	}
	return &Quota{t: &quotaTable{events: uint64(events), window: int64(window), seed: maphash.MakeSeed()}}, nil
}

// WithClock returns a Quota that shares q's counts and reads the time from
// clock: pass the Limiter's (Limiter.Now), so that the quota runs on the
// one clock; nil means the real Clock. A nil q gives nil.
func (q *Quota) WithClock(clock Clock) *Quota {
	if q == nil {
		return nil
	}
	return &Quota{t: q.t, clock: clock}
}

// Events returns the events allowed per actor per window; 0 for a nil Quota (no quota).
func (q *Quota) Events() int {
	if q == nil {
		return 0
	}
	return int(q.t.events)
}

// Window returns the window length; 0 for a nil Quota (no quota).
func (q *Quota) Window() time.Duration {
	if q == nil {
		return 0
	}
	return time.Duration(q.t.window)
}

// Exceeded reports whether actor has used its quota for the current
// window, and if so how long until the next window, when it starts afresh.
// The error is always nil.
func (q *Quota) Exceeded(_ context.Context, actor string) (bool, time.Duration, error) {
	if q == nil {
		return false, 0, nil // before reading a clock it may not have
	}
	over, wait := q.exceeded(actor, q.clock.Now())
	return over, wait, nil
}

// Add charges one validated event to actor in the current window; it
// reports false when the actor was already at its limit (the event is not
// counted). An id charged before in this window, or an event created more
// than Window ago, reports true and counts nothing (see ActorQuota). The
// seen-set is fixed-size like the counts: 16,384 one-word entries hashed
// with the per-process seed, so an id whose entry a later one took is
// charged again if re-sent in the window. The error is always nil.
func (q *Quota) Add(_ context.Context, actor, id string, createdAt int64) (bool, error) {
	if q == nil {
		return true, nil
	}
	return q.addEvent(actor, id, createdAt, q.clock.Now()), nil
}

// addEvent is Add at the instant now.
func (q *Quota) addEvent(actor, id string, createdAt int64, now time.Time) bool {
	t := q.t
	if createdAt > 0 && createdAt < (now.UnixNano()-t.window)/int64(time.Second) {
		return true // older than the window: not its author's charge
	}
	if id == "" {
		return q.add(actor, now)
	}
	full, _ := t.windowOf(now)
	fp := mix64(maphash.String(t.seed, id)^uint64(full)*0x9e3779b97f4a7c15) | 1
	slot := &t.seen[fp>>(64-seenBits)]
	for {
		old := slot.Load()
		if old == fp {
			return true // charged in this window already
		}
		if slot.CompareAndSwap(old, fp) {
			break
		}
	}
	return q.add(actor, now)
}

// seenBits sizes a Quota's seen-set: 2^14 entries of 8 bytes.
const seenBits = 14

// exceeded is Exceeded at the instant now.
func (q *Quota) exceeded(actor string, now time.Time) (bool, time.Duration) {
	if q == nil {
		return false, 0
	}
	t := q.t
	full, ns := t.windowOf(now)
	win := uint64(full) & quotaWinMask
	word := t.slot(actor).Load()
	sw, count := word>>quotaCountBits, word&quotaCountMask
	ahead := (sw - win) & quotaWinMask // how far the slot's window is past ours
	if word == 0 || ahead >= quotaHalf || count < t.events {
		return false, 0 // empty, an older window (ours is fresh), or room left
	}
	next := (full+int64(ahead)+1)*t.window - ns
	return true, time.Duration(next)
}

// add is Add at the instant now.
func (q *Quota) add(actor string, now time.Time) bool {
	if q == nil {
		return true
	}
	t := q.t
	full, _ := t.windowOf(now)
	win := uint64(full) & quotaWinMask
	slot := t.slot(actor)
	for {
		old := slot.Load()
		sw, count := old>>quotaCountBits, old&quotaCountMask
		var neu uint64
		if ahead := (sw - win) & quotaWinMask; old == 0 || ahead >= quotaHalf {
			// Empty, or the slot's window is older than ours: ours starts
			// afresh. The CAS fails if anyone moved the slot meanwhile.
			neu = win<<quotaCountBits | 1
		} else {
			// Our window, or a newer one a faster caller already opened
			// (we are late): charge it there rather than roll it back.
			if count >= t.events {
				return false
			}
			neu = old + 1
		}
		if slot.CompareAndSwap(old, neu) {
			return true
		}
	}
}

// windowOf returns the number of the window containing now and now in unix
// nanoseconds. Slots keep the number modulo 2^42 and compare it as a serial
// number, so a slot left alone for 2^41 windows (70 years of 1 ms windows)
// could look current: harmless.
func (t *quotaTable) windowOf(now time.Time) (int64, int64) {
	ns := now.UnixNano()
	w := ns / t.window
	if ns%t.window < 0 {
		w-- // floor, for instants before 1970
	}
	return w, ns
}

func (t *quotaTable) slot(actor string) *atomic.Uint64 {
	return &t.slots[maphash.String(t.seed, actor)&(quotaSlots-1)]
}
