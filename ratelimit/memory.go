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
	idx, score, at := idxBuf[:], scoreBuf[:], atBuf[:]

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

	sh := &m.shards[shard]
	sh.mu.Lock()
	for i := range n {
		s := &m.slots[idx[i]]
		score[i], at[i] = s.score, s.at
	}
	allowed, wait := decide(ws, score[:n], at[:n], now.UnixMilli(), out)
	if allowed {
		for i := range n {
			s := &m.slots[idx[i]]
			s.score, s.at = score[i], at[i]
		}
	}
	sh.mu.Unlock()
	return Decision{Allowed: allowed, Wait: wait}
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
