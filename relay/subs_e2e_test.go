//go:build !race

package relay

import (
	"context"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
)

// listenersFor publishes a kind-1 note from another connection and counts
// the copies of it that reach c: one per listener khatru holds for c. The
// COUNT that follows is answered after every copy, since khatru writes an
// event to its listeners before it answers the publisher's OK.
func listenersFor(t *testing.T, url string, c *websocket.Conn) int {
	t.Helper()
	ev := nostrtest.Note(t, nostr.GeneratePrivateKey(), "count the listeners")
	if err := nostrtest.Publish(t, connect(t, url), ev); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteMessage(websocket.TextMessage, []byte(`["COUNT","sync",{"ids":["`+ev.ID+`"]}]`)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		got := readText(t, c)
		switch {
		case strings.HasPrefix(got, `["EVENT",`) && strings.Contains(got, ev.ID):
			n++
		case strings.HasPrefix(got, `["COUNT","sync",`):
			return n
		}
	}
}

// khatru does not replace a subscription when a REQ reuses its id: it adds
// the new REQ's filters as more listeners under the same id, and a CLOSE
// removes them all. A connection must not hold more at the relay than the
// cap by reusing one id (the gate counted a reuse as no new place, so one
// connection could hold any number of listeners, each costing the relay a
// match on every event it accepts).
func TestE2ESubscriptionCapReusedID(t *testing.T) {
	const max = 3
	url := serve(t, newGate(t, Options{Limits: &Limits{}, MaxSubscriptions: max}).Wrap(newKhatru(t)))
	c := dialRaw(t, url)
	for range 10 {
		got := send(t, c, []byte(`["REQ","a",{"kinds":[1]}]`))
		if !strings.HasPrefix(got, `["EOSE","a"]`) && !strings.HasPrefix(got, `["CLOSED","a",`) {
			t.Fatalf("REQ a answered %s", got)
		}
	}
	if n := listenersFor(t, url, c); n > max {
		t.Fatalf("the relay holds %d listeners for one connection, past the cap of %d", n, max)
	}
}

// khatru answers a REQ one of whose filters a RejectFilter hook refuses
// with CLOSED, but keeps the listeners of the filters before it. The relay's
// CLOSED must not free a place at the gate while the relay still holds
// them.
func TestE2ESubscriptionCapPartialCLOSED(t *testing.T) {
	const max = 2
	kr := newKhatru(t)
	kr.RejectFilter = append(kr.RejectFilter, func(_ context.Context, f nostr.Filter) (bool, string) {
		return len(f.Kinds) == 1 && f.Kinds[0] == 4, "blocked: no direct messages here"
	})
	url := serve(t, newGate(t, Options{Limits: &Limits{}, MaxSubscriptions: max}).Wrap(kr))
	c := dialRaw(t, url)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		got := send(t, c, []byte(`["REQ","`+id+`",{"kinds":[1]},{"kinds":[4]}]`))
		if !strings.HasPrefix(got, `["CLOSED","`+id+`",`) {
			t.Fatalf("REQ %s answered %s", id, got)
		}
	}
	if n := listenersFor(t, url, c); n > max {
		t.Fatalf("the relay holds %d listeners for one connection, past the cap of %d", n, max)
	}
}

// A CLOSE khatru handles while the REQ's query runs removes nothing: the
// listener is added when the query ends and stays, so REQ then CLOSE,
// repeated, held any number of listeners past the cap (each costing the
// relay a match on every event it accepts). The gate keeps the place
// until khatru's EOSE and closes the subscription there again.
func TestE2ESubscriptionCapCloseBeforeEOSE(t *testing.T) {
	const max = 1
	kr := newKhatru(t)
	release := make(chan struct{})
	kr.QueryEvents = append([]func(context.Context, nostr.Filter) (chan *nostr.Event, error){
		func(_ context.Context, f nostr.Filter) (chan *nostr.Event, error) {
			ch := make(chan *nostr.Event)
			if f.Search != "slow" {
				close(ch)
				return ch, nil
			}
			go func() { <-release; close(ch) }() // a query that takes its time
			return ch, nil
		}}, kr.QueryEvents...)
	url := serve(t, newGate(t, Options{Limits: &Limits{}, MaxSubscriptions: max}).Wrap(kr))
	c := dialRaw(t, url)
	for _, f := range []string{`["REQ","a",{"search":"slow"}]`, `["CLOSE","a"]`} {
		if err := c.WriteMessage(websocket.TextMessage, []byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	if got := send(t, c, []byte(`["REQ","b",{"kinds":[1]}]`)); !strings.HasPrefix(got, `["CLOSED","b","blocked:`) {
		t.Fatalf("REQ b with a closed before its EOSE, cap %d: %s, want CLOSED blocked", max, got)
	}
	close(release)
	if got := strings.TrimSpace(readText(t, c)); got != `["EOSE","a"]` {
		t.Fatalf("got %s, want khatru's EOSE for a", got)
	}
	if got := strings.TrimSpace(send(t, c, []byte(`["REQ","b",{"kinds":[1]}]`))); got != `["EOSE","b"]` {
		t.Fatalf("REQ b after a's EOSE: %s, want EOSE", got)
	}
	if n := listenersFor(t, url, c); n > max {
		t.Fatalf("the relay holds %d listeners for one connection, past the cap of %d", n, max)
	}
}
