package relay

import (
	"sync"
	"time"

	"github.com/sluice-relay/sluice/relay/wire"
)

// This file holds what the gate needs for the actor quota: a bounded
// per-connection table of forwarded event ids awaiting the relay's OK, and
// one of the ids already charged, so that a re-sent event the relay
// accepts again is not charged twice.

// hex32 is an event id or a pubkey, decoded from its 64 hex digits.
type hex32 = wire.Hex32

// DefaultPending is how many forwarded EVENTs per connection the gate
// remembers while it waits for the relay's OK. A client that has more in
// flight than this loses the oldest entries: those events, if accepted,
// are not charged to the quota. 256 covers any honest client (relays
// answer in milliseconds) and bounds the table at ~25 KiB per connection.
const DefaultPending = 256

// pending is a bounded table of forwarded event ids and the actor each
// one will be charged to. The client reader adds, the relay reader takes;
// it is safe for concurrent use.
type pending struct {
	mu   sync.Mutex
	byID map[hex32]pendingEntry
	// ring is allocated by the first add: most connections only read,
	// and 8 KiB each would add up.
	ring *[DefaultPending]hex32
	next int // the ring slot written next, and evicted first
	full bool
}

type pendingEntry struct {
	actor string
	slot  int // the ring slot that holds this id, so eviction spares a re-added id
}

// add remembers id → actor, evicting the oldest entry when full.
func (p *pending) add(id hex32, actor string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byID == nil {
		p.byID = make(map[hex32]pendingEntry, 16)
		p.ring = new([DefaultPending]hex32)
	}
	if p.full {
		old := p.ring[p.next]
		if e, ok := p.byID[old]; ok && e.slot == p.next {
			delete(p.byID, old)
		}
	}
	p.ring[p.next] = id
	p.byID[id] = pendingEntry{actor: actor, slot: p.next}
	p.next++
	if p.next == len(p.ring) {
		p.next, p.full = 0, true
	}
}

// take returns and forgets the actor for id.
func (p *pending) take(id hex32) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byID[id]
	if ok {
		delete(p.byID, id)
	}
	return e.actor, ok
}

// len returns the number of ids awaiting an answer.
func (p *pending) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byID)
}

// DefaultCharged is how many charged event ids per connection the gate
// remembers, so that the relay accepting the same event again (khatru
// answers a re-sent event OK true, without "duplicate:") within the quota
// window costs its actor nothing more. A client re-sending more distinct
// events than this in one window is charged again for the oldest.
const DefaultCharged = 256

// charged is a ring of the event ids charged to the quota on one
// connection and when. It is used by the relay reader only.
type charged struct {
	ring *[DefaultCharged]chargedEntry // allocated by the first charge
	next int
}

type chargedEntry struct {
	id hex32
	at time.Time
}

// seen reports whether id was charged less than window before now.
func (c *charged) seen(id hex32, now time.Time, window time.Duration) bool {
	if c.ring == nil {
		return false
	}
	for i := range c.ring {
		e := &c.ring[i]
		if e.id == id && !e.at.IsZero() && now.Sub(e.at) < window {
			return true
		}
	}
	return false
}

// add records id as charged at now, evicting the oldest entry.
func (c *charged) add(id hex32, now time.Time) {
	if c.ring == nil {
		c.ring = new([DefaultCharged]chargedEntry)
	}
	c.ring[c.next] = chargedEntry{id: id, at: now}
	c.next = (c.next + 1) % DefaultCharged
}
