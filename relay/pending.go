package relay

import (
	"sync"
	"time"

	"github.com/sluice-relay/sluice/relay/wire"
)

// This file holds what the gate needs for the actor quota: bounded
// per-connection tables of forwarded event ids awaiting the relay's OK, and
// of the ids already charged, so that a re-sent event the relay accepts
// again is not charged twice.

// hex32 is an event id or a pubkey, decoded from its 64 hex digits.
type hex32 = wire.Hex32

// DefaultPending is how many forwarded EVENTs per connection the gate
// remembers while it waits for the relay's OK. A client that has more in
// flight than this loses the oldest entries: those events, if accepted,
// are not charged to the quota. 256 covers any honest client (relays
// answer in milliseconds) and bounds the table at ~25 KiB per connection.
const DefaultPending = 256

// idTable is a bounded table of event ids and a value each, holding the
// DefaultPending ids added last: adding past that evicts the oldest. Its
// ring is allocated by the first add (most connections only read, and
// 8 KiB each would add up). It is safe for concurrent use.
type idTable[V any] struct {
	mu   sync.Mutex
	byID map[hex32]idEntry[V]
	ring *[DefaultPending]hex32
	next int // the ring slot written next, and evicted first
	full bool
}

type idEntry[V any] struct {
	v    V
	slot int // the ring slot that holds this id, so eviction spares a re-added id
}

// add remembers id → v, evicting the oldest entry when full.
func (t *idTable[V]) add(id hex32, v V) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID == nil {
		t.byID = make(map[hex32]idEntry[V], 16)
		t.ring = new([DefaultPending]hex32)
	}
	if t.full {
		old := t.ring[t.next]
		if e, ok := t.byID[old]; ok && e.slot == t.next {
			delete(t.byID, old)
		}
	}
	t.ring[t.next] = id
	t.byID[id] = idEntry[V]{v: v, slot: t.next}
	t.next++
	if t.next == len(t.ring) {
		t.next, t.full = 0, true
	}
}

// get returns the value for id.
func (t *idTable[V]) get(id hex32) (V, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[id]
	return e.v, ok
}

// take returns and forgets the value for id.
func (t *idTable[V]) take(id hex32) (V, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[id]
	if ok {
		delete(t.byID, id)
	}
	return e.v, ok
}

// len returns the number of ids held.
func (t *idTable[V]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// pending holds the forwarded EVENTs awaiting the relay's OK and the actor
// each will be charged to: the client reader adds, the relay reader takes.
type pending = idTable[string]

// charged holds the event ids charged to the quota on one connection and
// when, so that the relay accepting the same event again (khatru answers a
// re-sent event OK true, without "duplicate:") within the quota window
// costs its actor nothing more. It keeps the DefaultPending ids charged
// last: a client re-sending more distinct events than that in one window
// is charged again for the oldest.
type charged struct{ at idTable[time.Time] }

// seen reports whether id was charged less than window before now.
func (c *charged) seen(id hex32, now time.Time, window time.Duration) bool {
	at, ok := c.at.get(id)
	return ok && now.Sub(at) < window
}

// add records id as charged at now.
func (c *charged) add(id hex32, now time.Time) { c.at.add(id, now) }
