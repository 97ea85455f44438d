//go:build !race

package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/wire"
)

// (issue 5, item 5) With a small quota, one author past it is refused while
// another author on the same connection is accepted, and the refused author
// is admitted again in the next window. Charged on khatru's OK true only,
// and once per event however often it is re-sent (issue 10).
func TestE2EQuota(t *testing.T) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, Options{Limiter: memLimiter(clk), Limits: &Limits{}, Quota: q.Local(clk.Now)})
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
	if err == nil || err.Error() != "msg: rate-limited: slow down; retry in 60s" {
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

// ["EVENT",<A's event>,<B's event>]: the gate read the first object and
// charged A, khatru (go-nostr's 3-element form) stored the last, B, whose
// OK matched nothing pending: 20 of 20 such events were stored after B's
// quota was spent. Such a frame is not canonical now, and is answered by
// the gate.
func TestE2EQuotaTwoEventFrame(t *testing.T) {
	clk := nostrtest.NewClock()
	q, err := ratelimit.NewQuota(1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, Options{Limiter: memLimiter(clk), Limits: &Limits{}, Quota: q.Local(clk.Now)})
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
		if got := send(t, c, frame); got != `["OK","`+a.ID+`",false,"`+wire.ReasonShape+`"]` {
			t.Fatalf("two-event frame answered %s", got)
		}
		stored = append(stored, b.ID)
	}
	if got := query(t, r, nostr.Filter{IDs: stored}); len(got) != 0 {
		t.Fatalf("%d of B's events stored past its quota", len(got))
	}
}
