package relay

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// This file holds what the gate needs for the actor quota: bounded
// per-connection tables of forwarded event ids awaiting the relay's OK, and
// of the ids already charged, so that a re-sent event the relay accepts
// again is not charged twice; and the settlement of those tables: the
// charge when the relay's OK is seen, or, when it is not, when the relay's
// store says it stored the event (settleAged, settlePending).

// hex32 is an event id or a pubkey, decoded from its 64 hex digits.
type hex32 = scan.Hex32

// maxPending is how many forwarded EVENTs per connection the gate
// remembers while it waits for the relay's OK. 256 covers any honest
// client (relays answer in milliseconds) and bounds the table at ~25 KiB
// per connection. When the relay says which events it stored
// (Options.Stored, as in sluice relay), an EVENT past it is refused
// ("blocked: too many events awaiting the relay's answer") rather than
// forwarded, and an event awaiting its OK for settleAge (settleAged), or
// still awaiting it when the connection ends (settlePending), is charged
// if the relay stored it: khatru stores an event before it writes the OK,
// and a client can keep the OKs from the gate (behind a reply it does not
// read) for as long as it likes, or hang up. Without Stored (behind Proxy)
// the gate cannot tell which of them the relay stored: an EVENT past the
// bound is refused the same way, and when the client goes with events
// awaiting their OK the gate reads the relay's answers on for up to
// drainAnswers, charging those it accepted (drainUpstream). Either way an
// event no OK has named pendingHold after it was forwarded leaves the
// table uncharged (expirePending).
const maxPending = 256

// maxActorPending is how many events of one actor (an authenticated
// pubkey, else the event's author) from one client (its address, as
// Identity keys it) may await the relay's OK at once across the gate's
// connections: the quota is charged when the relay has answered or, if it
// has not, when the relay's store says it stored them (Options.Stored:
// settleAged, one to two seconds on; settlePending, when the connection
// ends), or, without Stored, when its OK arrives, read after the client
// has gone if need be (drainUpstream), so events in flight have passed the
// quota's check without counting yet. A further EVENT of the actor from
// that client is refused ("blocked: …") until one is answered, or has
// waited pendingHold for an answer that names it. 64 is more
// than an honest client has in flight (relays answer in milliseconds); it
// bounds what one actor's events can exceed its quota by to 64 per client
// address and gate process. Counted per client, not per actor alone: the
// gate does not check signatures, and events forged in a victim's name
// whose OKs a client keeps from the gate would otherwise hold the victim
// up everywhere.
const maxActorPending = 64

// addInflight counts one more event of actor in flight (see
// maxActorPending), or reports false, counting nothing, when the actor has
// maxActorPending already; takeInflight counts one settled.
func (g *Gate) addInflight(actor string) bool {
	g.inflightMu.Lock()
	defer g.inflightMu.Unlock()
	if g.inflight[actor] >= maxActorPending {
		return false
	}
	g.inflight[actor]++
	return true
}

func (g *Gate) takeInflight(actor string) {
	g.inflightMu.Lock()
	defer g.inflightMu.Unlock()
	if n := g.inflight[actor]; n > 1 {
		g.inflight[actor] = n - 1
	} else {
		delete(g.inflight, actor)
	}
}

// settleAge is how long at least an event may await the relay's OK, with
// Options.Stored, before the gate asks the relay's store whether it stored
// it, and charges it if so (at most twice that: one timer per connection,
// due settleAge after it is armed, takes every event at least this old).
// khatru writes the OK after the save, and a client can keep the OK from
// the gate for as long as it keeps the relay's writer waiting on it,
// longer than the store remembers its saves.
const settleAge = time.Second

// pendingHold is how long an event may await the relay's OK before it
// leaves the table of events awaiting one, uncharged, whatever the relay
// answered meanwhile: relays do not all answer with an OK that names the
// event (some refuse with a NOTICE, an OK whose id is "" or another
// event's, or nothing at all), and an entry that waited for such an answer
// would hold its connection's place and its actor's count in flight
// (maxActorPending) for the life of the connection. The settling timer
// (settleAged, every settleAge while events await their OK) takes them
// out, so an event leaves at most pendingHold + settleAge after it was
// forwarded. An OK that comes later charges nothing: behind a relay that
// never answers with the event's id, the quota counts nothing.
const pendingHold = 5 * time.Second

// settleAfter are the delays, after a connection ended, at which the gate
// asks the relay's store (Options.Stored) about the events still awaiting
// their OK: the relay may still be storing the last of them.
var settleAfter = [...]time.Duration{0, 100 * time.Millisecond, time.Second, 5 * time.Second}

// idTable is a bounded table of event ids and a value each, holding the
// maxPending ids added last: adding past that evicts the oldest. Its
// ring is allocated by the first add (most connections only read, and
// 8 KiB each would add up). It is safe for concurrent use.
type idTable[V any] struct {
	mu     sync.Mutex
	byID   map[hex32]idEntry[V]
	ring   *[maxPending]hex32
	next   int // the ring slot written next, and evicted first
	full   bool
	closed bool // by close or drain: addOpen adds nothing more
}

type idEntry[V any] struct {
	v    V
	slot int // the ring slot that holds this id, so eviction spares a re-added id
}

// add remembers id → v, evicting the oldest entry when full.
func (t *idTable[V]) add(id hex32, v V) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.addLocked(id, v)
}

// addOpen is add unless the table was closed (its connection has ended):
// then it adds nothing and reports false.
func (t *idTable[V]) addOpen(id hex32, v V) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.addLocked(id, v)
	return true
}

func (t *idTable[V]) addLocked(id hex32, v V) {
	if t.byID == nil {
		t.byID = make(map[hex32]idEntry[V], 16)
		t.ring = new([maxPending]hex32)
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

// room reports whether add would keep every id held: not full, or the
// oldest slot's id already taken.
func (t *idTable[V]) room() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.full {
		return true
	}
	e, ok := t.byID[t.ring[t.next]]
	return !ok || e.slot != t.next
}

// takeIf forgets every entry for which take, called with the table
// locked, reports true.
func (t *idTable[V]) takeIf(take func(id hex32, v V) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, e := range t.byID {
		if take(id, e.v) {
			delete(t.byID, id)
		}
	}
}

// idValue is one entry of an idTable.
type idValue[V any] struct {
	id hex32
	v  V
}

// close makes addOpen add nothing more.
func (t *idTable[V]) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
}

// drain returns every entry and empties the table for good (addOpen).
func (t *idTable[V]) drain() []idValue[V] {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	out := make([]idValue[V], 0, len(t.byID))
	for id, e := range t.byID {
		out = append(out, idValue[V]{id, e.v})
	}
	clear(t.byID)
	t.next, t.full = 0, false
	return out
}

// len returns the number of ids held.
func (t *idTable[V]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// pending holds the forwarded EVENTs awaiting the relay's OK, the actor
// each will be charged to and when it was forwarded: the client reader
// adds, the relay reader takes (and, with Options.Stored, settleAged and
// settlePending).
type pending = idTable[pendingEvent]

type pendingEvent struct {
	actor   string
	at      time.Time // forwarded (the host's monotonic clock)
	created int64     // the event's created_at (the quota's rule for old events)
}

// charged holds the event ids charged to the quota on one connection and
// when, so that the relay accepting the same event again (khatru answers a
// re-sent event OK true, without "duplicate:") within the quota window
// costs its actor nothing more. It keeps the maxPending ids charged
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

// inflightKey is what the gate counts an event in flight under (see
// maxActorPending): its actor from this connection's client, so that
// events that name a pubkey they do not come from (the gate does not
// check signatures; khatru refuses them, in an OK that may be kept from
// the gate) hold up that pubkey only from the sender's address.
func (c *conn) inflightKey(actor string) string { return c.who + " " + actor }

// charge charges pe.actor's quota q for event id, which the relay accepted
// (and stored, with Options.Stored), unless this connection charged it
// within the quota's window. A failed charge leaves the event uncounted:
// the relay has it already, and refusing later events for it would punish
// the actor for our outage.
func (c *conn) charge(ctx context.Context, q ratelimit.ActorQuota, id hex32, pe pendingEvent) {
	now := c.g.now()
	if c.charged.seen(id, now, q.Window()) {
		return
	}
	if _, err := q.Add(ctx, pe.actor, id.String(), pe.created); err != nil {
		c.g.log.Debug("quota charge failed", "client", c.who, "err", err)
	}
	c.charged.add(id, now)
}

// armSettle makes settleAged due in settleAge, unless it is already or the
// connection has ended.
func (c *conn) armSettle() {
	c.settleMu.Lock()
	defer c.settleMu.Unlock()
	if c.settling == nil && !c.ended {
		c.settling = time.AfterFunc(settleAge, c.settleAged)
	}
}

// settleAged settles the events that have awaited the relay's OK for
// settleAge or more, with Options.Stored (see settleAge), gives up those
// that have awaited it for pendingHold, and is due again while any event
// awaits its OK.
func (c *conn) settleAged() {
	c.settleMu.Lock()
	c.settling = nil
	c.settleMu.Unlock()
	if c.g.stored != nil {
		c.settleStored(settleAge)
	}
	c.expirePending(pendingHold)
	if c.pending.len() > 0 {
		c.armSettle()
	}
}

// expirePending takes the events that have awaited the relay's OK for age
// or more from the table, uncharged, and from their actors' counts in
// flight (see pendingHold).
func (c *conn) expirePending(age time.Duration) {
	cut := time.Now().Add(-age)
	var gone []string
	c.pending.takeIf(func(_ hex32, pe pendingEvent) bool {
		if pe.at.After(cut) {
			return false
		}
		gone = append(gone, pe.actor)
		return true
	})
	for _, actor := range gone {
		c.g.takeInflight(c.inflightKey(actor))
	}
	if len(gone) > 0 {
		c.g.log.Debug("events left unanswered by the relay", "client", c.who, "events", len(gone), "after", age.String())
	}
}

// settleStored charges every pending event that has awaited its OK for age
// or more and that the relay's store says it stored, taking it from the
// table and from its actor's count in flight.
func (c *conn) settleStored(age time.Duration) {
	q := c.subject(c.g.current().p).Quota()
	cut := time.Now().Add(-age)
	var due []idValue[pendingEvent]
	c.pending.takeIf(func(id hex32, pe pendingEvent) bool {
		if pe.at.After(cut) || !c.g.stored(id) {
			return false
		}
		due = append(due, idValue[pendingEvent]{id, pe})
		return true
	})
	for _, e := range due {
		c.g.takeInflight(c.inflightKey(e.v.actor))
		if q != nil {
			ctx, cancel := context.WithTimeout(context.Background(), c.g.writeTimeout)
			c.charge(ctx, q, e.id, e.v)
			cancel()
		}
	}
}

// settlePending charges, once the connection has ended, the events it
// forwarded whose OK the gate never saw but that the relay stored (see
// maxPending): with Options.Stored asking the relay's store at each of
// settleAfter, and giving up on the rest (a goroutine for at most
// settleAfter's last delay, holding the connection's pending table and
// nothing else of it); without it (behind Proxy) giving up at once on
// those drainUpstream did not see answered.
func (c *conn) settlePending() {
	c.settleMu.Lock()
	c.ended = true
	if c.settling != nil {
		c.settling.Stop()
		c.settling = nil
	}
	if c.subTimer != nil {
		c.subTimer.Stop()
		c.subTimer = nil
	}
	c.settleMu.Unlock()
	c.pending.close() // an EVENT decided meanwhile is not forwarded
	if c.pending.len() == 0 {
		return
	}
	if c.g.stored == nil {
		// Behind Proxy the relay's answers were read on after the
		// client went (drainUpstream); what is left is given up.
		c.giveUpPending()
		return
	}
	go func() {
		defer c.giveUpPending() // never seen stored (refused, or not yet)
		var waited time.Duration
		for _, d := range settleAfter {
			if d > waited {
				select {
				case <-time.After(d - waited):
				case <-c.g.stopped:
					return
				}
				waited = d
			}
			if c.settleStored(0); c.pending.len() == 0 {
				return
			}
		}
	}()
}

// giveUpPending empties the ended connection's table of events awaiting
// their OK, uncharged, and releases their actors' counts in flight.
func (c *conn) giveUpPending() {
	for _, e := range c.pending.drain() {
		c.g.takeInflight(c.inflightKey(e.v.actor))
	}
}
