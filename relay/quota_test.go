package relay

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

func pubkeyN(n int) string { return nostrtest.PubkeyN(n) }

var apartPubkeys = nostrtest.ApartPubkeys

// eventFrame returns event n of pubkey (its content is n), with its id
// the event's hash, and remembers that id as event n's (evID): the
// tests name events by number. Its created_at (in 2100) is ahead of
// every test clock, so the quota never finds it older than its window
// (such an event is not charged to its author).
func eventFrame(n int, pubkey string) string {
	f := withID(fmt.Sprintf(`["EVENT",{"id":"%064x","pubkey":"%s","created_at":4102444800,"kind":1,"tags":[],"content":"%d","sig":"%s"}]`, 0, pubkey, n, testSig))
	eventIDs.Store(n, idOf(f))
	return f
}

// eventIDs holds the id of the event eventFrame built last under each
// number.
var eventIDs sync.Map

// evID returns the id of the event eventFrame built last as number n.
func evID(n int) hex32 {
	v, ok := eventIDs.Load(n)
	if !ok {
		panic(fmt.Sprintf("no event %d built yet", n))
	}
	id, _ := scan.DecodeHex32(v.(string))
	return id
}

// isEv reports whether id is that of event n, for n in [from, to].
func isEv(id hex32, from, to int) bool {
	for n := from; n <= to; n++ {
		if v, ok := eventIDs.Load(n); ok && v.(string) == fmt.Sprintf("%x", id[:]) {
			return true
		}
	}
	return false
}

func okReply(n int, accepted bool, reason string) string {
	return okFor(evID(n), accepted, reason)
}

// The quota counts what the relay accepted, per actor: the event's author,
// or the authenticated pubkey; past it the gate refuses with the window's
// remainder; the next window starts afresh; allow-listed authors are
// exempt; an event the gate cannot attribute is not forwarded.
func TestGateQuota(t *testing.T) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	allowed := pubkeyN(99)
	rec := newRecorder()
	rec.answerOK = func(id hex32) bool { return !isEv(id, 5, 5) } // the relay refuses event 5
	rec.okReason = func(id hex32) string {                        // events 40-42: the relay had them
		if isEv(id, 40, 42) {
			return "duplicate: have it"
		}
		return ""
	}
	c := dialRaw(t, serveSelf(t, Options{UpstreamVerifies: true, Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now), Identity: policy.Identity{AllowPubkeys: []string{allowed}}}}, func(g *Gate) http.Handler { return g.Wrap(rec) }))

	step := func(frame, want string) {
		t.Helper()
		if err := c.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
			t.Fatal(err)
		}
		if got := readText(t, c); got != want {
			t.Fatalf("%s\n got %s\nwant %s", frame, got, want)
		}
	}
	actors := apartPubkeys(q, clk.Now(), 4)
	a, b, cc, d := actors[0], actors[1], actors[2], actors[3]
	over := "rate-limited: quota: 2 events per 60s for this pubkey; retry in 60s"
	step(eventFrame(1, a), okReply(1, true, ""))
	step(eventFrame(2, a), okReply(2, true, ""))
	step(eventFrame(3, a), okReply(3, false, over))
	step(eventFrame(4, b), okReply(4, true, "")) // same connection, other author
	// An event the relay refused is not charged.
	step(eventFrame(5, cc), okReply(5, false, ""))
	step(eventFrame(6, cc), okReply(6, true, ""))
	step(eventFrame(7, cc), okReply(7, true, ""))
	step(eventFrame(8, cc), okReply(8, false, over))
	// Events the relay already had add nothing and are not charged.
	for i := 40; i < 43; i++ {
		step(eventFrame(i, d), okReply(i, true, "duplicate: have it"))
	}
	step(eventFrame(43, d), okReply(43, true, ""))
	step(eventFrame(44, d), okReply(44, true, ""))
	step(eventFrame(45, d), okReply(45, false, over))
	// Allow-listed author: never counted.
	for i := 20; i < 25; i++ {
		step(eventFrame(i, allowed), okReply(i, true, ""))
	}
	// Two pubkeys: the relay might keep either, so the gate forwards neither.
	dup := fmt.Sprintf(`["EVENT",{"id":"%064x","pubkey":"%s","pubkey":"%s"}]`, 30, a, b)
	step(dup, okFor(hex32{31: 30}, false, "invalid: event must have exactly the fields id, pubkey, created_at, kind, tags, content and sig, each once, in NIP-01's types"))

	// The next window starts afresh; the wait told was the remainder.
	clk.Advance(30 * time.Second)
	step(eventFrame(9, a), okReply(9, false, "rate-limited: quota: 2 events per 60s for this pubkey; retry in 30s"))
	clk.Advance(30 * time.Second)
	step(eventFrame(10, a), okReply(10, true, ""))

	for _, f := range rec.frames(0) {
		for _, id := range []int{3, 8, 9, 30} {
			if strings.Contains(f, fmt.Sprintf("%064x", id)) {
				t.Errorf("refused event %d reached the relay", id)
			}
		}
	}
}

// Once the relay accepts a connection's AUTH (verified by the gate), its
// events are charged to the authenticated pubkey whoever signed them, and
// an allow-listed authenticated pubkey passes the message limits too.
func TestGateQuotaAuthenticatedActor(t *testing.T) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	trustedSK, trusted := newKey(t)
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(3.5, time.Second)}
	rec := newRecorder()
	rec.answerOK = func(hex32) bool { return true }
	rec.challenge = "chal"
	url := serveSelf(t, Options{UpstreamVerifies: true, Limiter: memLimiter(clk), Policy: policy.Config{Limits: &l, Quota: q.WithClock(clk.Now), Identity: policy.Identity{AllowPubkeys: []string{trusted}}}}, func(g *Gate) http.Handler { return g.Wrap(rec) })

	step := func(c *websocket.Conn, frame, want string) {
		t.Helper()
		if err := c.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
			t.Fatal(err)
		}
		if got := readText(t, c); got != want {
			t.Fatalf("%s\n got %s\nwant %s", frame, got, want)
		}
	}
	dial := func() *websocket.Conn {
		c := dialRaw(t, url)
		if got := readText(t, c); got != `["AUTH","chal"]` {
			t.Fatalf("relay's challenge: %s", got)
		}
		return c
	}
	auth := func(c *websocket.Conn, sk string) {
		t.Helper()
		frame, id := signedAuth(t, sk, "chal", url, clk.Now())
		step(c, frame, okFor(id, true, ""))
	}

	c := dial()
	xSK, _ := newKey(t)
	auth(c, xSK)
	step(c, eventFrame(1, pubkeyN(1)), okReply(1, true, ""))
	step(c, eventFrame(2, pubkeyN(2)), okReply(2, true, ""))
	step(c, eventFrame(3, pubkeyN(3)), okReply(3, false, "rate-limited: quota: 2 events per 60s for this pubkey; retry in 60s"))

	// An allow-listed, authenticated connection passes limits and quota.
	c2 := dial()
	auth(c2, trustedSK)
	for i := 10; i < 20; i++ {
		step(c2, eventFrame(i, pubkeyN(i)), okReply(i, true, ""))
	}
	// Claiming the allow-listed pubkey without authenticating buys no
	// message limit: the fourth event in the burst is refused. (The
	// client's EVENT budget is shared by its connections: let it rest.)
	clk.Advance(time.Minute)
	c3 := dial()
	for i := 30; i < 33; i++ {
		step(c3, eventFrame(i, trusted), okReply(i, true, ""))
	}
	step(c3, eventFrame(33, trusted), okReply(33, false, "rate-limited: slow down; retry in 1s"))
}

// Without a quota, an allow-listed pubkey still counts once the connection
// has authenticated as it; an AUTH the relay refused buys nothing.
func TestGateAuthAllowlistWithoutQuota(t *testing.T) {
	clk := nostrtest.NewClock()
	trustedSK, trusted := newKey(t)
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Second)}
	rec := newRecorder()
	rec.challenge = "chal"
	url := serveSelf(t, Options{UpstreamVerifies: true, Limiter: memLimiter(clk), Policy: policy.Config{Limits: &l, Identity: policy.Identity{AllowPubkeys: []string{trusted}}}}, func(g *Gate) http.Handler { return g.Wrap(rec) })
	refused, refusedID := signedAuth(t, trustedSK, "chal", url, clk.Now())
	accepted, acceptedID := signedAuth(t, trustedSK, "chal", url, clk.Now().Add(time.Second))
	rec.answerOK = func(id hex32) bool { return id != refusedID }
	c := dialRaw(t, url)
	if got := readText(t, c); got != `["AUTH","chal"]` {
		t.Fatalf("relay's challenge: %s", got)
	}
	step := func(frame, want string) {
		t.Helper()
		_ = c.WriteMessage(websocket.TextMessage, []byte(frame))
		if got := readText(t, c); got != want {
			t.Fatalf("%s\n got %s\nwant %s", frame, got, want)
		}
	}
	step(refused, okFor(refusedID, false, ""))
	step(eventFrame(1, trusted), okReply(1, true, ""))
	step(eventFrame(2, trusted), okReply(2, false, "rate-limited: slow down; retry in 1s"))
	step(accepted, okFor(acceptedID, true, ""))
	for i := 3; i < 8; i++ {
		step(eventFrame(i, trusted), okReply(i, true, ""))
	}
}

// TestGateQuotaChargesOnlyStored: with Options.Stored, an accepted event
// the relay did not store (khatru's OK true for a duplicate, or for an older
// replaceable event it keeps a newer one of) costs its author nothing, so
// sending someone's public events again cannot spend their quota; one it
// stored is charged as before.
func TestGateQuotaChargesOnlyStored(t *testing.T) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var stored storedSet
	rec := newRecorder()
	rec.answerOK = func(hex32) bool { return true }
	url := serve(t, newGate(t, Options{UpstreamVerifies: true, Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)},
		Stored: stored.take}).Wrap(rec))
	victim := apartPubkeys(q, clk.Now(), 1)[0]
	store := stored.mark
	step := func(c *websocket.Conn, id int, accepted bool, reason string) {
		t.Helper()
		_ = c.WriteMessage(websocket.TextMessage, []byte(eventFrame(id, victim)))
		if got, want := readText(t, c), okReply(id, accepted, reason); got != want {
			t.Fatalf("event %d\n got %s\nwant %s", id, got, want)
		}
	}
	c := dialRaw(t, url)
	store(1)
	step(c, 1, true, "") // stored: 1 of 2
	for range 3 {        // the same event again, from fresh connections: the relay has it
		step(dialRaw(t, url), 1, true, "")
	}
	step(c, 2, true, "") // not stored (an older replaceable, say): free
	store(3)
	step(c, 3, true, "") // stored: 2 of 2
	store(4)
	step(c, 4, false, "rate-limited: quota: 2 events per 60s for this pubkey; retry in 60s")
}

// storedSet is Options.Stored over a set the test fills: true once for
// each id marked.
// storedSet is a relay store's answer to Options.Stored, for events named
// by number (eventFrame): an event marked stored is reported once.
type storedSet struct {
	mu  sync.Mutex
	ids map[int]bool
}

func (s *storedSet) mark(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[int]bool{}
	}
	s.ids[n] = true
}

func (s *storedSet) take(id [32]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := range s.ids {
		if isEv(id, n, n) {
			delete(s.ids, n)
			return true
		}
	}
	return false
}

// Events the relay stored but whose OK the gate never saw (the client kept
// the OKs behind a reply it did not read, then hung up, or holds them
// there: khatru stores an event before it writes the OK) are charged once
// the connection has ended, or once they have waited settleAge, and not
// before: a gate that charges only on an OK lets an actor with a quota of
// 2 publish these 5 for nothing. In a synctest bubble, on the bubble's
// clock.
func TestGateQuotaChargesStoredEventsLeftUnanswered(t *testing.T) {
	t.Run("connection ends", func(t *testing.T) { synctest.Test(t, func(t *testing.T) { chargesUnanswered(t, true) }) })
	t.Run("connection stays", func(t *testing.T) { synctest.Test(t, func(t *testing.T) { chargesUnanswered(t, false) }) })
}

func chargesUnanswered(t *testing.T, end bool) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var stored storedSet
	rec := newRecorder() // answers no EVENT: the OKs the client kept from the gate
	pn, url := servePipe(t, newGate(t, Options{UpstreamVerifies: true, Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}, Stored: stored.take}).Wrap(rec))
	ql := q.WithClock(clk.Now)
	actor := apartPubkeys(q, clk.Now(), 1)[0]
	c := pn.dialWS(t, url)
	for id := 1; id <= 5; id++ {
		stored.mark(id)
		if err := c.WriteMessage(websocket.TextMessage, []byte(eventFrame(id, actor))); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.frames(5); len(got) != 5 {
		t.Fatalf("the relay got %d of the 5 events (nothing was charged yet: all pass the quota)", len(got))
	}
	if end {
		_ = c.Close()
		synctest.Wait() // the connection's end, seen by the gate
	} else {
		time.Sleep(settleAge - time.Millisecond)
		synctest.Wait()
		if quotaOver(t, ql, actor) {
			t.Fatal("the events were charged before they had awaited their OK for settleAge")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
	}
	if !quotaOver(t, ql, actor) {
		t.Fatalf("connection ended: %v; the 5 stored events have not spent the actor's quota of 2", end)
	}
	c2 := pn.dialWS(t, url)
	_ = c2.WriteMessage(websocket.TextMessage, []byte(eventFrame(6, actor)))
	if got, want := readText(t, c2), okReply(6, false, "rate-limited: quota: 2 events per 60s for this pubkey; retry in 60s"); got != want {
		t.Fatalf("the actor's next event:\n got %s\nwant %s", got, want)
	}
}

// An actor has at most maxActorPending events awaiting the relay's OK
// across the gate's connections, with Options.Stored or without: each has
// passed the quota's check without counting yet, so more would let the
// actor past its quota by as many as it can keep unanswered.
func TestGateQuotaBoundsActorsUnansweredEvents(t *testing.T) {
	t.Run("Stored", func(t *testing.T) { boundsUnanswered(t, true) })
	t.Run("without Stored", func(t *testing.T) { boundsUnanswered(t, false) })
}

func boundsUnanswered(t *testing.T, withStored bool) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(1000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var stored storedSet
	rec := newRecorder() // answers no EVENT
	id := &policy.Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	opts := Options{UpstreamVerifies: true, Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now), Identity: *id}, Stored: stored.take}
	if !withStored {
		opts.Stored = nil
	}
	url := serve(t, newGate(t, opts).Wrap(rec))
	keys := apartPubkeys(q, clk.Now(), 2)
	actor, other := keys[0], keys[1]
	// Across connections, each with fewer than maxOwed unanswered (past
	// that the gate stops reading the connection for a while).
	var conns []*websocket.Conn
	for range maxActorPending/(maxOwed-1) + 1 {
		conns = append(conns, dialRaw(t, url))
	}
	a, b := conns[0], conns[1]
	for id := 1; id <= maxActorPending; id++ {
		c := conns[id%len(conns)]
		if err := c.WriteMessage(websocket.TextMessage, []byte(eventFrame(id, actor))); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.frames(maxActorPending); len(got) != maxActorPending {
		t.Fatalf("the relay got %d of the actor's first %d events", len(got), maxActorPending)
	}
	_ = a.WriteMessage(websocket.TextMessage, []byte(eventFrame(maxActorPending+1, actor)))
	if got, want := readText(t, a), okReply(maxActorPending+1, false, reasonActorPending); got != want {
		t.Fatalf("the actor's event past %d unanswered:\n got %s\nwant %s", maxActorPending, got, want)
	}
	// Another actor is not held up, and the same event sent again before
	// its OK is not counted twice.
	_ = b.WriteMessage(websocket.TextMessage, []byte(eventFrame(maxActorPending+2, other)))
	_ = b.WriteMessage(websocket.TextMessage, []byte(eventFrame(maxActorPending+2, other)))
	if got := rec.frames(maxActorPending + 2); len(got) != maxActorPending+2 {
		t.Fatalf("the relay got %d events, want the other actor's two as well", len(got))
	}
	// The count is per client: the gate does not check signatures, so
	// events in the actor's name from elsewhere (forged, their OKs kept
	// from the gate) do not hold up the actor's own, from its address.
	own, _, err := websocket.DefaultDialer.Dial(url, http.Header{"X-Forwarded-For": {"203.0.113.9"}})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	_ = own.WriteMessage(websocket.TextMessage, []byte(eventFrame(maxActorPending+3, actor)))
	if got := rec.frames(maxActorPending + 3); len(got) != maxActorPending+3 {
		t.Fatalf("the relay got %d events: the actor's event from another address was held up", len(got))
	}
}

// quotaOver reports whether actor is over quota ql now.
func quotaOver(t *testing.T, ql ratelimit.ActorQuota, actor string) bool {
	t.Helper()
	over, _, err := ql.Exceeded(context.Background(), actor)
	if err != nil {
		t.Fatal(err)
	}
	return over
}

// A connection's pending table, once drained at its end (settlePending),
// takes no more: an EVENT its reader was still deciding would otherwise be
// added after the drain, and its actor's count in flight never released.
func TestPendingDrainedTakesNoMore(t *testing.T) {
	var p pending
	a, b := hex32{1}, hex32{2}
	if !p.addOpen(a, pendingEvent{actor: "x"}) {
		t.Fatal("an open table refused an entry")
	}
	if got := p.drain(); len(got) != 1 || got[0].id != a || got[0].v.actor != "x" {
		t.Fatalf("drained %v, want the one entry", got)
	}
	if p.addOpen(b, pendingEvent{actor: "y"}) || p.len() != 0 {
		t.Fatalf("a drained table took an entry (len %d)", p.len())
	}
}

// When a connection ends, the events it left unanswered that the relay
// never stored (refused, say, in an OK the client kept from the gate) are
// given up after the last look (settleAfter): their actor's count in
// flight is released then, and not before (a store may save an event
// after the connection has gone), and nothing keeps asking about them. A
// gate that never gives up keeps the actor's count held for ever. In a
// synctest bubble, on the bubble's clock.
func TestGateQuotaGivesUpUnstoredEventsAtEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := nostrtest.NewClock()
		q, err := ratelimit.NewQuota(1000, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var stored storedSet // nothing is stored
		rec := newRecorder() // answers no EVENT
		g := newGate(t, Options{UpstreamVerifies: true, Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}, Stored: stored.take})
		pn, url := servePipe(t, g.Wrap(rec))
		actor := apartPubkeys(q, clk.Now(), 1)[0]
		c := pn.dialWS(t, url)
		for id := 1; id <= 3; id++ {
			_ = c.WriteMessage(websocket.TextMessage, []byte(eventFrame(id, actor)))
		}
		if got := rec.frames(3); len(got) != 3 {
			t.Fatalf("the relay got %d of the 3 events", len(got))
		}
		inflight := func() int {
			g.inflightMu.Lock()
			defer g.inflightMu.Unlock()
			return len(g.inflight)
		}
		_ = c.Close()
		last := settleAfter[len(settleAfter)-1]
		time.Sleep(last - time.Millisecond)
		synctest.Wait()
		if inflight() == 0 {
			t.Fatal("the events were given up before the last look")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if n := inflight(); n != 0 {
			t.Fatalf("%v after the connection ended, %d actors still have events counted in flight", last, n)
		}
	})
}

// Behind Proxy, when a client goes with events the relay has not
// answered, the gate reads the relay's answers on (drainUpstream), but not
// for ever: a relay that never answers gets the close drainAnswers after
// the client went, not at its read deadline two ping intervals on, and not
// before (a gate that does not drain closes it at once). In a synctest
// bubble, on the bubble's clock; the handler is Proxy's, its upstream
// dialled over the bubble's pipes.
func TestProxyDrainEndsWhenTheRelayNeverAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := nostrtest.NewClock()
		q, err := ratelimit.NewQuota(10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		rec := newRecorder() // answers no EVENT
		relayNet, relayURL := servePipe(t, rec)
		up, _, err := newURLUpstream(relayURL)
		if err != nil {
			t.Fatal(err)
		}
		up.dialer.NetDialContext = relayNet.dial
		g := newGate(t, Options{UpstreamVerifies: true, Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}})
		pn, url := servePipe(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.serveWS(w, r, up) }))
		c := pn.dialWS(t, url)
		actor := apartPubkeys(q, clk.Now(), 1)[0]
		if err := c.WriteMessage(websocket.TextMessage, []byte(eventFrame(1, actor))); err != nil {
			t.Fatal(err)
		}
		if got := rec.frames(1); len(got) != 1 {
			t.Fatalf("the relay got %d events", len(got))
		}
		start := time.Now()
		_ = c.Close()
		code := rec.closed()
		took := time.Since(start)
		if code != closeGoingAway || took != drainAnswers {
			t.Fatalf("the relay's side: close %d after %v, want %d after drainAnswers (%v)", code, took, closeGoingAway, drainAnswers)
		}
	})
}
