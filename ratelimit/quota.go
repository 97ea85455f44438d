package ratelimit

import (
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"
)

// QuotaSlots is the number of slots in every Quota's table; it is not
// configurable. A power of two, so that a hash picks a slot with a mask.
const QuotaSlots = 1024

// MaxQuotaEvents is the largest events-per-window a Quota accepts: the count
// shares one 64-bit word with the window number.
const MaxQuotaEvents = 1<<22 - 1

// ErrInvalidQuota is wrapped by NewQuota.
var ErrInvalidQuota = errors.New("ratelimit: invalid quota")

const (
	quotaCountBits = 22 // up to 4,194,303 events per window
	quotaWinBits   = 64 - quotaCountBits
	quotaWinMask   = 1<<quotaWinBits - 1
	quotaCountMask = MaxQuotaEvents
	quotaHalf      = 1 << (quotaWinBits - 1) // serial-number comparison
)

// Quota is a per-actor fixed-window budget on validated events: at most
// Events events per actor in each window of Window (windows aligned on the
// unix epoch), where the actor is the event's pubkey or the NIP-42
// authenticated one. Events a relay accepts are permanent, so this caps how
// fast one actor can turn a session into storage, independently of the
// per-type message limits.
//
// The attack it is built for is an actor rotating names: a client that mints
// a fresh pubkey per event would pass any per-actor budget, and a table keyed
// by actor would grow with every name. So the table does not grow: actors are
// hashed, with a per-process random seed that a client cannot aim with, into
// QuotaSlots fixed slots, and actors that land in one slot share its
// budget. The bound is therefore slots × Events accepted events per window
// however many names an attacker rotates through (1,024 × 600 = 614,400 a
// minute with the defaults), and no actor ever allocates memory. What the
// bound does not buy: it does not stop a rotating attacker, it only bounds
// one; honest actors that share a slot with a busy one share its budget (the
// limits are generous so that this is harmless); and a fixed window lets one
// actor spend up to twice Events across a window boundary.
//
// Each slot is one atomic word holding the window number and that window's
// count, updated by compare-and-swap: no lock, and a window rollover cannot
// lose a count or reset a newer window on behalf of a late caller. Time is
// passed in, never read.
//
// A nil *Quota admits everything, as does the one Unlimited returns. A Quota
// is safe for concurrent use; the zero Quota is not usable, use NewQuota.
type Quota struct {
	events    uint64
	window    int64 // nanoseconds
	unlimited bool
	seed      maphash.Seed
	slots     [QuotaSlots]atomic.Uint64
}

// NewQuota returns a quota of events per window over QuotaSlots slots.
// events ≤ 0, events > MaxQuotaEvents or window ≤ 0 is an error wrapping
// ErrInvalidQuota; use Unlimited for no quota.
func NewQuota(events int, window time.Duration) (*Quota, error) {
	switch {
	case events <= 0:
		return nil, fmt.Errorf("%w: events %d must be at least 1 (use Unlimited for no quota)", ErrInvalidQuota, events)
	case events > MaxQuotaEvents:
		return nil, fmt.Errorf("%w: events %d must be at most %d", ErrInvalidQuota, events, MaxQuotaEvents)
	case window <= 0:
		return nil, fmt.Errorf("%w: window %v must be positive", ErrInvalidQuota, window)
	}
	return &Quota{events: uint64(events), window: int64(window), seed: maphash.MakeSeed()}, nil
}

// Unlimited returns a Quota that admits every event. A nil *Quota does the
// same; this one says so explicitly in configuration code.
func Unlimited() *Quota { return &Quota{unlimited: true} }

// IsUnlimited reports whether q admits everything (q is nil or from Unlimited).
func (q *Quota) IsUnlimited() bool { return q == nil || q.unlimited }

// Events returns the events allowed per actor per window; 0 when unlimited.
func (q *Quota) Events() int {
	if q.IsUnlimited() {
		return 0
	}
	return int(q.events)
}

// Window returns the window length; 0 when unlimited.
func (q *Quota) Window() time.Duration {
	if q.IsUnlimited() {
		return 0
	}
	return time.Duration(q.window)
}

// Exceeded reports whether actor has used its quota for the window containing
// now, and if so how long until the next window, when it starts afresh.
func (q *Quota) Exceeded(actor string, now time.Time) (bool, time.Duration) {
	if q.IsUnlimited() {
		return false, 0
	}
	full, ns := q.windowOf(now)
	win := uint64(full) & quotaWinMask
	word := q.slot(actor).Load()
	sw, count := word>>quotaCountBits, word&quotaCountMask
	ahead := (sw - win) & quotaWinMask // how far the slot's window is past ours
	if word == 0 || ahead >= quotaHalf || count < q.events {
		return false, 0 // empty, an older window (ours is fresh), or room left
	}
	next := (full+int64(ahead)+1)*q.window - ns
	return true, time.Duration(next)
}

// Add charges one validated event to actor in the window containing now; it
// reports false when the actor was already at its limit (the event is not
// counted).
func (q *Quota) Add(actor string, now time.Time) bool {
	if q.IsUnlimited() {
		return true
	}
	full, _ := q.windowOf(now)
	win := uint64(full) & quotaWinMask
	slot := q.slot(actor)
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
			if count >= q.events {
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
func (q *Quota) windowOf(now time.Time) (int64, int64) {
	ns := now.UnixNano()
	w := ns / q.window
	if ns%q.window < 0 {
		w-- // floor, for instants before 1970
	}
	return w, ns
}

func (q *Quota) slot(actor string) *atomic.Uint64 {
	return &q.slots[maphash.String(q.seed, actor)&(QuotaSlots-1)]
}
