package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// defaultBlockedSlots is the size of a Limiter's refused-until table:
// 16,384 clients-and-types at 32 bytes each.
const defaultBlockedSlots = 1 << 14

// blockedWays is the number of slots a key may use: one bucket.
const blockedWays = 4

// statStripes spreads the Limiter's counters over padded cells so that
// counting does not make every core write one cache line.
const statStripes = 16

// Limiter is a Store plus a bounded local table of clients already told to
// wait. When the store refuses a key with wait w, the Limiter remembers
// "refused until now+w" for that key; until then further messages for it are
// refused locally, with the remaining wait, without a store call, so a flood
// from a blocked client costs the store nothing. Refusals write nothing in
// the store, so the local answer is the one the store would give.
//
// The table is fixed-size and lock-free: a key hashes (with a per-process
// random seed) to a bucket of four slots, each holding a 64-bit
// fingerprint of a key and its instant, and a key whose fingerprint is in
// none of them simply asks the store. A full bucket evicts the entry that
// ends first, so two blocked flooders that share a bucket do not push each
// other out on every message. Another key can only evict an entry (costing
// one store call), never refuse the wrong client.
//
// A Limiter is safe for concurrent use. Create one with NewLimiter.
type Limiter struct {
	store   Store
	clock   Clock
	seed    maphash.Seed
	blocked []blockedBucket
	mask    uint64 // bucket index mask
	stats   [statStripes]statStripe
}

// LimiterStats counts what a Limiter did since it was created.
type LimiterStats struct {
	// StoreCalls is the number of decisions asked of the store.
	StoreCalls uint64
	// StoreErrors is how many of those failed (and were refused closed).
	StoreErrors uint64
	// LocalRefusals is the number of messages refused from the local
	// table without a store call.
	LocalRefusals uint64
}

// blockedBucket holds blockedWays refused-until entries, laid out so that
// the fields a lookup reads for every message (seq and fp, 64 bytes) share
// one cache line and until is only read on a match. Each entry is guarded
// by a sequence lock: seq[i] is odd while a writer fills fp[i] and until[i],
// and a reader that sees it change or odd ignores the entry. Every field is
// atomic so that readers never race.
type blockedBucket struct {
	seq   [blockedWays]atomic.Uint64
	fp    [blockedWays]atomic.Uint64 // fingerprint of the key; 0 means empty
	until [blockedWays]atomic.Int64  // unix nanoseconds of the Limiter's clock
	_     [128 - 3*8*blockedWays]byte
}

type statStripe struct {
	storeCalls, storeErrors, localRefusals atomic.Uint64
	_                                      [64 - 24]byte
}

// NewLimiter returns a Limiter over store. A nil store means a new
// MemoryStore of the default size.
//
// clock is the one clock of everything built on this Limiter (a Gate,
// Hooks read it through Now). Nil means the real, monotonic Clock, and
// then the store's own clock decides (Redis TIME; the memory store reads
// the same real Clock); a non-nil Clock's instants are passed to the
// store, which is how tests run step tables.
func NewLimiter(store Store, clock Clock) *Limiter {
	return newLimiter(store, clock, 0)
}

// newLimiter is NewLimiter with a refused-until table of slots entries
// (rounded up to a power of two, at least 4); 0 or less means 16,384.
func newLimiter(store Store, clock Clock, slots int) *Limiter {
	if store == nil {
		store = NewMemoryStore(0)
	}
	n := slots
	if n <= 0 {
		n = defaultBlockedSlots
	}
	if n > 1<<30 {
		n = 1 << 30
	}
	n = max(1<<bits.Len(uint(n-1)), blockedWays)
	l := &Limiter{
		store:   store,
		clock:   clock,
		seed:    maphash.MakeSeed(),
		blocked: make([]blockedBucket, n/blockedWays),
		mask:    uint64(n/blockedWays - 1),
	}
	return l
}

// Store returns the store the Limiter decides on.
func (l *Limiter) Store() Store { return l.store }

// Now returns the current instant of the Limiter's clock (see
// NewLimiter).
func (l *Limiter) Now() time.Time { return l.clock.Now() }

// Allow decides one message for key against windows at the Limiter's
// clock. A refusal is a Decision; err != nil (wrapping ErrUnavailable) only
// when the store failed, and then the Decision refuses with no wait: the
// caller must fail closed and must not call it a rate limit. No windows
// (nil or empty) admits without a store call.
func (l *Limiter) Allow(ctx context.Context, key string, windows *Windows) (Decision, error) {
	return l.allowAt(ctx, key, windows, time.Time{})
}

// allowAt is Allow at the instant now (tests pass fixed instants); the
// zero now means the Limiter's clock.
func (l *Limiter) allowAt(ctx context.Context, key string, windows *Windows, now time.Time) (Decision, error) {
	if windows.Len() == 0 {
		return Decision{Allowed: true}, nil
	}
	storeNow := now // zero: the store's own clock decides
	if now.IsZero() {
		now = l.clock.Now()
		if l.clock != nil {
			storeNow = now
		}
	}
	nowNs := now.UnixNano()
	h := maphash.String(l.seed, key)
	fp := h // the whole hash; the index is only some of its bits
	if fp == 0 {
		fp = 1 // 0 marks the empty slot
	}
	bucket := &l.blocked[(h>>32)&l.mask]
	st := &l.stats[h>>60]

	if until, ok := bucket.load(fp); ok && nowNs < until {
		st.localRefusals.Add(1)
		return Decision{Wait: time.Duration(until - nowNs), Local: true}, nil
	}

	st.storeCalls.Add(1)
	d, err := l.store.Decide(ctx, key, windows, storeNow)
	if err != nil {
		st.storeErrors.Add(1)
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return Decision{}, err
	}
	if !d.Allowed && d.Wait > 0 {
		bucket.remember(fp, nowNs, nowNs+int64(d.Wait))
	}
	return d, nil
}

// AllowAll decides one message that pays every one of budgets, at the
// Limiter's clock, as one decision: admitted only if every budget admits,
// and only then is any of them charged; refused, nothing is written and
// Wait is the largest wait among the refusing budgets (Decision.By names
// it). It is one critical section on the memory store and one round trip
// on Redis (per master on a Cluster; see redisstore.Store.DecideAll). A
// budget in the local table of refused clients refuses the message
// without a store call; a store refusal enters the refusing budget's key
// there. Budgets with no windows pass free; errors are as for Allow.
func (l *Limiter) AllowAll(ctx context.Context, budgets []Budget) (Decision, error) {
	return l.allowAllAt(ctx, budgets, time.Time{})
}

func (l *Limiter) allowAllAt(ctx context.Context, budgets []Budget, now time.Time) (Decision, error) {
	var only, charged int
	rooms := false
	for i, b := range budgets {
		if b.Room != nil {
			only, charged, rooms = i, charged+1, true
		} else if b.Windows.Len() > 0 {
			only, charged = i, charged+1
		}
	}
	switch {
	case charged == 0:
		return Decision{Allowed: true}, nil
	case charged == 1 && !rooms:
		d, err := l.allowAt(ctx, budgets[only].Key, budgets[only].Windows, now)
		if !d.Allowed {
			d.By = only
		}
		return d, err
	}
	storeNow := now
	if now.IsZero() {
		now = l.clock.Now()
		if l.clock != nil {
			storeNow = now
		}
	}
	nowNs := now.UnixNano()
	var fpBuf [maxStackBudgets]uint64
	fps := fpBuf[:0]
	for i, b := range budgets {
		h := l.budgetHash(b)
		fp := max(h, 1) // 0 marks the empty slot
		fps = append(fps, fp)
		if b.Windows.Len() == 0 && b.Room == nil {
			continue
		}
		if until, ok := l.blocked[(h>>32)&l.mask].load(fp); ok && nowNs < until {
			l.stats[h>>60].localRefusals.Add(1)
			return Decision{Wait: time.Duration(until - nowNs), Local: true, By: i}, nil
		}
	}
	st := &l.stats[fps[0]>>60]
	st.storeCalls.Add(1)
	var d Decision
	var err error
	if ms, ok := l.store.(multiStore); ok {
		d, err = ms.DecideAll(ctx, budgets, storeNow)
	} else {
		d, err = l.oneByOne(ctx, budgets, storeNow)
	}
	if err != nil {
		st.storeErrors.Add(1)
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return Decision{By: d.By}, err
	}
	if !d.Allowed && d.Wait > 0 && d.By >= 0 && d.By < len(fps) {
		fp := fps[d.By]
		h := l.budgetHash(budgets[d.By])
		l.blocked[(h>>32)&l.mask].remember(fp, nowNs, nowNs+int64(d.Wait))
	}
	return d, nil
}

// budgetHash is b's hash in the local table: its key's, and for a Room
// its Events too. Two quotas of one window (the global one and a tier's)
// count one actor at one key, and a refusal by the smaller one must not
// answer for the larger one.
func (l *Limiter) budgetHash(b Budget) uint64 {
	h := maphash.String(l.seed, b.Key)
	if b.Room != nil {
		h ^= uint64(b.Room.Events) * 0x9e3779b97f4a7c15
	}
	return h
}

// oneByOne decides budgets on a store that cannot decide them at once
// (not one of sluice's): in order, stopping at the first refusal or error,
// so a message refused by a later budget has paid the earlier ones.
func (l *Limiter) oneByOne(ctx context.Context, budgets []Budget, now time.Time) (Decision, error) {
	for i, b := range budgets {
		if b.Room != nil { // before anything is charged
			return Decision{By: i}, errNoRoom
		}
	}
	for i, b := range budgets {
		if b.Windows.Len() == 0 {
			continue
		}
		d, err := l.store.Decide(ctx, b.Key, b.Windows, now)
		if err != nil || !d.Allowed {
			d.By = i
			return d, err
		}
	}
	return Decision{Allowed: true}, nil
}

// Refused reports whether key is in the local table of refused clients at
// the Limiter's clock, and the wait that is left: what Allow would answer
// for key without a store call, whatever the limits. A caller with work to
// do before it can call Allow (reading a whole frame to learn its cost,
// say) asks this first, so a refused client costs it nothing. A true
// answer counts as a local refusal in Stats.
func (l *Limiter) Refused(key string) (time.Duration, bool) {
	nowNs := l.clock.Now().UnixNano()
	h := maphash.String(l.seed, key)
	fp := h
	if fp == 0 {
		fp = 1
	}
	until, ok := l.blocked[(h>>32)&l.mask].load(fp)
	if !ok || nowNs >= until {
		return 0, false
	}
	l.stats[h>>60].localRefusals.Add(1)
	return time.Duration(until - nowNs), true
}

// Forget empties the local table of refused clients: the next message of
// each asks the store again. A policy reload calls it, since a wait told
// under the old limits need not be true under the new ones (a loosened
// limit must admit at once). It is safe to call while the Limiter is in
// use; an entry written concurrently may survive, costing nothing but one
// stale local answer.
func (l *Limiter) Forget() {
	for i := range l.blocked {
		b := &l.blocked[i]
		for j := range blockedWays {
			q := b.seq[j].Load()
			if q&1 != 0 || b.fp[j].Load() == 0 || !b.seq[j].CompareAndSwap(q, q+1) {
				continue
			}
			b.fp[j].Store(0)
			b.until[j].Store(0)
			b.seq[j].Store(q + 2)
		}
	}
}

// Stats returns the Limiter's counters. They are read one by one, not as a
// snapshot, and only ever grow.
func (l *Limiter) Stats() LimiterStats {
	var s LimiterStats
	for i := range l.stats {
		st := &l.stats[i]
		s.StoreCalls += st.storeCalls.Load()
		s.StoreErrors += st.storeErrors.Load()
		s.LocalRefusals += st.localRefusals.Load()
	}
	return s
}

// load returns the instant until which key fp is refused, when the bucket
// holds an entry for it that was not being written while read.
func (b *blockedBucket) load(fp uint64) (int64, bool) {
	for i := range blockedWays {
		q := b.seq[i].Load()
		if q&1 != 0 || b.fp[i].Load() != fp {
			continue
		}
		until := b.until[i].Load()
		if b.seq[i].Load() != q {
			return 0, false
		}
		return until, true
	}
	return 0, false
}

// remember records key fp as refused until until: in its own entry if it
// has one, else in one that is empty or has expired at now, else in place
// of the entry that ends first. The reads that choose are hints; the write
// itself is guarded.
func (b *blockedBucket) remember(fp uint64, now, until int64) {
	victim, victimUntil := 0, int64(math.MaxInt64)
	for i := range blockedWays {
		if b.fp[i].Load() == fp {
			victim = i
			break
		}
		u := b.until[i].Load()
		if u <= now {
			u = math.MinInt64 // empty or expired: take the first such
		}
		if u < victimUntil {
			victim, victimUntil = i, u
		}
	}
	b.store(victim, fp, until)
}

// store writes entry i unless another writer holds it; losing that race
// only costs the key one more store call later.
func (b *blockedBucket) store(i int, fp uint64, until int64) {
	q := b.seq[i].Load()
	if q&1 != 0 || !b.seq[i].CompareAndSwap(q, q+1) {
		return
	}
	b.fp[i].Store(fp)
	b.until[i].Store(until)
	b.seq[i].Store(q + 2)
}
