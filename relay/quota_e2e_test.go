//go:build !race

package relay

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fiatjaf/eventstore/slicestore"
	"github.com/fiatjaf/khatru"
	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
)

// With a small quota, one author past it is refused while another author
// on the same connection is accepted, and the refused author is admitted
// again in the next window. Charged on khatru's OK true only, and once per
// event however often it is re-sent.
func TestE2EQuota(t *testing.T) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}})
	r := connect(t, serve(t, g.Wrap(newKhatru(t))))
	keys := nostrtest.ApartKeys(q, clk.Now(), 2)
	skA, skB := keys[0], keys[1]

	first := nostrtest.Note(t, skA, "a0")
	// The same event sent again is accepted again by khatru (OK true, no
	// "duplicate:"), and charged once.
	for i := range 3 {
		if err := nostrtest.Publish(t, r, first); err != nil {
			t.Fatalf("A's event, sent %d times: %v", i+1, err)
		}
	}
	if err := nostrtest.Publish(t, r, nostrtest.Note(t, skA, "a1")); err != nil {
		t.Fatalf("A's second event within quota: %v", err)
	}
	// A tampered event is refused by khatru and not charged to B.
	bad := nostrtest.Note(t, skB, "b")
	bad.Content = "tampered"
	if err := nostrtest.Publish(t, r, bad); err == nil {
		t.Fatal("tampered event accepted")
	}
	err = nostrtest.Publish(t, r, nostrtest.Note(t, skA, "a3"))
	if err == nil || err.Error() != "msg: rate-limited: quota: 2 events per 60s for this pubkey; retry in 60s" {
		t.Fatalf("A past quota: %v, want rate-limited retry in 60s", err)
	}
	for i := range 2 {
		if err := nostrtest.Publish(t, r, nostrtest.Note(t, skB, "b")); err != nil {
			t.Fatalf("B's event %d on the same connection: %v", i, err)
		}
	}
	clk.Advance(time.Minute)
	if err := nostrtest.Publish(t, r, nostrtest.Note(t, skA, "a, next window")); err != nil {
		t.Fatalf("A in the next window: %v", err)
	}
}

// ["EVENT",<A's event>,<B's event>] is not canonical, and is answered by
// the gate, never forwarded: khatru (go-nostr's 3-element form) stores the
// last object, B, so a gate that read the first and charged A would let B
// publish past its spent quota, its OK matching nothing pending.
func TestE2EQuotaTwoEventFrame(t *testing.T) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}})
	url := serve(t, g.Wrap(newKhatru(t)))
	r := connect(t, url)
	keys := nostrtest.ApartKeys(q, clk.Now(), 2)
	skA, skB := keys[0], keys[1]
	if err := nostrtest.Publish(t, r, nostrtest.Note(t, skB, "b spends its quota")); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, url)
	var stored []string
	for i := range 20 {
		a := nostrtest.Note(t, skA, fmt.Sprint("a ", i))
		b := nostrtest.Note(t, skB, fmt.Sprint("b past its quota ", i))
		fa, _ := nostr.EventEnvelope{Event: a}.MarshalJSON()
		fb, _ := nostr.EventEnvelope{Event: b}.MarshalJSON()
		frame := append(fa[:len(fa)-1:len(fa)-1], append([]byte{','}, fb[len(`["EVENT",`):]...)...)
		if got := send(t, c, frame); got != `["OK","`+a.ID+`",false,"`+"invalid: frame is not in NIP-01's exact shape"+`"]` {
			t.Fatalf("two-event frame answered %s", got)
		}
		stored = append(stored, b.ID)
	}
	if got := query(t, r, nostr.Filter{IDs: stored}); len(got) != 0 {
		t.Fatalf("%d of B's events stored past its quota", len(got))
	}
}

// An actor cannot publish past its quota by keeping its OKs from the gate:
// a client keeps khatru's writer busy with a reply it does not read (a REQ
// for large stored events into a small receive buffer), publishes, and
// hangs up. khatru stores each event before it writes the OK, and the OKs
// wait behind the unread reply and die with the connection, so a gate
// that charges only on the OKs it sees charges nothing. With the relay's
// store telling the gate what it stored (Options.Stored, as sluice relay
// has it), the events left unanswered are charged when the connection
// ends, and the actor's next event is refused. Behind Proxy the gate has
// no store to ask: it reads the relay's answers on after the client has
// gone (drainUpstream), and charges the events the relay accepted. Since
// the gate stops reading a client that is behind on its answers, most
// events wait in the client's socket and die with it: either way no more
// than the quota's worth may be stored uncharged.
func TestE2EQuotaUnansweredEventsCharged(t *testing.T) {
	t.Run("relay", func(t *testing.T) { unansweredEventsCharged(t, false) })
	t.Run("proxy", func(t *testing.T) { unansweredEventsCharged(t, true) })
}

func unansweredEventsCharged(t *testing.T, proxy bool) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	saved := map[[32]byte]bool{}
	stored := func(id [32]byte) bool { mu.Lock(); defer mu.Unlock(); ok := saved[id]; delete(saved, id); return ok }
	kr := khatru.NewRelay()
	kr.Log = log.New(io.Discard, "", 0)
	st := &slicestore.SliceStore{}
	if err := st.Init(); err != nil {
		t.Fatal(err)
	}
	kr.StoreEvent = append(kr.StoreEvent, st.SaveEvent, func(_ context.Context, ev *nostr.Event) error {
		var k [32]byte
		if _, err := hex.Decode(k[:], []byte(ev.ID)); err == nil {
			mu.Lock()
			saved[k] = true
			mu.Unlock()
		}
		return nil
	})
	kr.QueryEvents = append(kr.QueryEvents, st.QueryEvents)
	// What the attacker's REQ fetches: 200 events of 60 KB from another key.
	other := nostr.GeneratePrivateKey()
	big := strings.Repeat("x", 60000)
	for i := range 200 {
		ev := nostrtest.Note(t, other, fmt.Sprint(i, big))
		if err := st.SaveEvent(context.Background(), &ev); err != nil {
			t.Fatal(err)
		}
	}
	var url string
	if proxy {
		h, err := newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}, QueueBytes: 64 << 20}).Proxy(serve(t, kr))
		if err != nil {
			t.Fatal(err)
		}
		url = serve(t, h)
	} else {
		url = serve(t, newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}, Stored: stored, QueueBytes: 64 << 20}).Wrap(kr))
	}
	sk := nostrtest.ApartKeys(q, clk.Now(), 1)[0]
	pk, _ := nostr.GetPublicKey(sk)
	c := dialSmall(t, url)
	if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","fill",{"limit":200}]`)); err != nil {
		t.Fatal(err)
	}
	// The attack's own pacing, a second of real time (khatru serves real
	// sockets): the reply waits unread (the queue's bound is raised so
	// that the client is not cut for it).
	time.Sleep(time.Second)
	for i := range 30 {
		b, err := nostr.EventEnvelope{Event: nostrtest.Note(t, sk, fmt.Sprint("event ", i))}.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.WriteMessage(websocket.TextMessage, b); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // real time for khatru to store them; their OKs wait
	_ = c.NetConn().Close()
	r := connect(t, url)
	// The gate stops reading a client that is behind on its answers, so
	// the events may never reach the relay; those that do are charged.
	got := query(t, r, nostr.Filter{Authors: []string{pk}, Limit: 500})
	if len(got) <= 2 {
		return
	}
	if !quotaSpent(t, q.WithClock(clk.Now), pk) {
		t.Fatalf("20 s after the attack, %d events of the actor stored and its quota of 2 not spent", len(got))
	}
	if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, "after")); err == nil || !strings.Contains(err.Error(), "rate-limited: ") {
		t.Fatalf("the actor's first event after the attack: %v, want the quota's refusal", err)
	}
}

// quotaSpent waits up to 20 s for actor to be over quota ql and reports
// whether it is. It polls because khatru's goroutines and the sockets of
// an end-to-end test run outside a synctest bubble; 20 s is a "did it
// happen at all" bound, far past the gate's last settling look.
func quotaSpent(t *testing.T, ql ratelimit.ActorQuota, actor string) bool {
	t.Helper()
	for start := time.Now(); time.Since(start) < 20*time.Second; time.Sleep(10 * time.Millisecond) {
		if quotaOver(t, ql, actor) {
			return true
		}
	}
	return false
}
