package ratelimit

import (
	"context"
	"hash/maphash"
	"math/bits"
	"sync"
	"time"
)

// defaultMemorySlots is the MemoryStore size used when none is given: 65,536
// windows of 16 bytes, 1 MiB in all.
const defaultMemorySlots = 1 << 16

// memShardSlots is the number of slots per shard at full size: enough shards
// (256 for the default size) that cores rarely meet on one lock.
const memShardSlots = 256

// MemoryStore is a Store in bounded process memory for a single instance
// that wants no Redis. Its table is fixed when it is created: a number of
// slots (a score and the millisecond it was written), split into shards each
// with its own lock. A key picks its shard by a hash of the key and each of
// its windows picks a slot in that shard by a hash of the key and the
// window's period, so all windows of one key are decided under one lock, in
// one atomic step. The hash is keyed with a per-process random seed, so a
// client cannot aim at a slot; two keys that meet in a slot share a budget.
// No key ever allocates: a million distinct keys leave the table as it was.
//
// Instants are truncated to whole unix milliseconds (see the package doc).
//
// A decision at the zero instant uses the real Clock (see Clock); a Limiter
// passes its own clock's instant.
//
// Create one with NewMemoryStore; the zero value is also usable and sizes
// itself to the default 65,536 slots on first use. A MemoryStore is safe for
// concurrent use.
type MemoryStore struct {
	once       sync.Once
	seed       maphash.Seed
	slots      []memSlot  // len fixed at construction
	shards     []memShard // one lock per shard of slots
	shardShift uint       // a key's shard is hash >> shardShift
	slotBits   uint       // log2 of slots per shard
	size       int        // requested size, read by init
}

// memSlot is one window's state.
type memSlot struct {
	score float64
	at    int64 // unix milliseconds of the last write
}

// memShard is one lock, padded to its own cache lines so that cores taking
// neighbouring locks do not slow each other down (false sharing).
type memShard struct {
	mu sync.Mutex
	_  [128 - 8]byte
}

// NewMemoryStore returns a store with at least slots slots (rounded up to a
// power of two); slots ≤ 0 means 65,536 (1 MiB).
func NewMemoryStore(slots int) *MemoryStore {
	m := &MemoryStore{size: slots}
	m.once.Do(m.init)
	return m
}

func (m *MemoryStore) init() {
	n := m.size
	if n <= 0 {
		n = defaultMemorySlots
	}
	if n > 1<<40 {
		n = 1 << 40
	}
	total := bits.Len(uint(n - 1)) // log2 of n rounded up to a power of two
	shardBits := 0
	if total > 8 { // memShardSlots = 2^8
		shardBits = total - 8
	}
	if shardBits > 8 { // at most 256 shards; more locks buy nothing on real core counts
		shardBits = 8
	}
	m.seed = maphash.MakeSeed()
	m.slots = make([]memSlot, 1<<total)
	m.shards = make([]memShard, 1<<shardBits)
	m.shardShift = uint(64 - shardBits) // 64 means every key is shard 0
	m.slotBits = uint(total - shardBits)
}

// Decide implements Store. It never fails: the windows were validated when
// they were prepared. ctx is not consulted: the decision does not block.
func (m *MemoryStore) Decide(_ context.Context, key string, ws *Windows, now time.Time) (Decision, error) {
	return m.decide(key, ws, now, nil), nil
}

// decide is Decide with each window's score after the decision copied to
// out when out is not nil: the conformance suite reads them, the hot path
// does not.
func (m *MemoryStore) decide(key string, ws *Windows, now time.Time, out []float64) Decision {
	m.once.Do(m.init)
	if now.IsZero() {
		now = Clock(nil).Now()
	}
	n := ws.Len()
	if n == 0 {
		return Decision{Allowed: true}
	}
	var (
		idxBuf   [MaxWindows]uint64
		scoreBuf [MaxWindows]float64
		atBuf    [MaxWindows]int64
	)
	idx, score, at := idxBuf[:n], scoreBuf[:n], atBuf[:n]
	sh := &m.shards[m.slotsOf(key, ws, idx)]
	sh.mu.Lock()
	m.read(idx, score, at)
	allowed, wait := decide(ws, score, at, now.UnixMilli(), out)
	if allowed {
		m.write(idx, score, at)
	}
	sh.mu.Unlock()
	return Decision{Allowed: allowed, Wait: wait}
}

// maxStackBudgets is how many budgets of one message DecideAll decides
// without touching the heap: a frame pays its type, a kind class and up
// to four aggregates.
const maxStackBudgets = 8

// DecideAll decides budgets as one message (see Limiter.AllowAll) in one
// critical section: the locks of every shard the budgets' slots are in,
// taken in ascending order (so two messages never wait on each other in a
// cycle), held while every budget is decided and, when all admit, written.
// It never fails; ctx is not consulted.
func (m *MemoryStore) DecideAll(_ context.Context, budgets []Budget, now time.Time) (Decision, error) {
	m.once.Do(m.init)
	if now.IsZero() {
		now = Clock(nil).Now()
	}
	type part struct {
		idx   [MaxWindows]uint64
		score [MaxWindows]float64
		at    [MaxWindows]int64
		shard uint64
	}
	var buf [maxStackBudgets]part
	parts := buf[:0]
	if len(budgets) > maxStackBudgets {
		parts = make([]part, 0, len(budgets))
	}
	var shardBuf [maxStackBudgets]uint64
	shards := shardBuf[:0]
	for i, b := range budgets {
		if b.Room != nil {
			return Decision{By: i}, errNoRoom
		}
		parts = append(parts, part{})
		p := &parts[len(parts)-1]
		n := b.Windows.Len()
		if n == 0 {
			continue
		}
		p.shard = m.slotsOf(b.Key, b.Windows, p.idx[:n])
		i := 0
		for i < len(shards) && shards[i] < p.shard {
			i++
		}
		if i == len(shards) || shards[i] != p.shard {
			shards = append(shards, 0)
			copy(shards[i+1:], shards[i:])
			shards[i] = p.shard
		}
	}
	if len(shards) == 0 {
		return Decision{Allowed: true}, nil
	}
	for _, sh := range shards {
		m.shards[sh].mu.Lock()
	}
	ms := now.UnixMilli()
	d := Decision{Allowed: true}
	var wait time.Duration
	for i, b := range budgets {
		n := b.Windows.Len()
		if n == 0 {
			continue
		}
		p := &parts[i]
		m.read(p.idx[:n], p.score[:n], p.at[:n])
		ok, w := decide(b.Windows, p.score[:n], p.at[:n], ms, nil)
		if !ok {
			d.Allowed = false
			if w > wait || d.Wait == 0 {
				wait, d.Wait, d.By = w, w, i
			}
		}
	}
	if d.Allowed {
		// Written in order: two budgets whose windows meet in one slot
		// share it (see MemoryStore), the later write standing.
		for i, b := range budgets {
			if n := b.Windows.Len(); n > 0 {
				m.write(parts[i].idx[:n], parts[i].score[:n], parts[i].at[:n])
			}
		}
	}
	for _, sh := range shards {
		m.shards[sh].mu.Unlock()
	}
	return d, nil
}

// slotsOf fills idx with the slot of each window of key (len(idx) is
// ws.Len()) and returns their shard, whose lock guards them.
func (m *MemoryStore) slotsOf(key string, ws *Windows, idx []uint64) uint64 {
	n := len(idx)
	h := maphash.String(m.seed, key)
	shard := h >> m.shardShift
	base := shard << m.slotBits
	mask := uint64(1)<<m.slotBits - 1
	for i := range n {
		p := ws.win[i].period
		j := mix64(h^p*0x9e3779b97f4a7c15) & mask
		// Two windows of one key with different periods must not share
		// a slot, or one would overwrite the other: probe past it. Equal
		// periods share, as they share one key in Redis.
		if n <= 1<<m.slotBits {
			for k := 0; k < i; k++ {
				if idx[k] == base+j && ws.win[k].period != p {
					j = (j + 1) & mask
					k = -1
				}
			}
		}
		idx[i] = base + j
	}
	return shard
}

// read and write copy the slots idx to and from score and at; the caller
// holds their shard's lock.
func (m *MemoryStore) read(idx []uint64, score []float64, at []int64) {
	for i, j := range idx {
		s := &m.slots[j]
		score[i], at[i] = s.score, s.at
	}
}

func (m *MemoryStore) write(idx []uint64, score []float64, at []int64) {
	for i, j := range idx {
		s := &m.slots[j]
		s.score, s.at = score[i], at[i]
	}
}

// mix64 is the splitmix64 finaliser: it spreads a keyed hash and a period
// into a slot index without losing the seed's unpredictability.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
