//go:build !race

package relay

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/relay/policy"
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
	// khatru writes an event to its listeners before it answers the
	// publisher, so they are all queued for c by now; the gate's answer
	// to a frame it refuses itself comes after them. (A COUNT, the
	// relay's own barrier, would be refused at the subscription cap.)
	if err := c.WriteMessage(websocket.TextMessage, []byte(`["CLOSE"]`)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		got := readText(t, c)
		switch {
		case strings.HasPrefix(got, `["EVENT",`) && strings.Contains(got, ev.ID):
			n++
		case strings.HasPrefix(got, `["NOTICE","invalid:`):
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
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxSubscriptions: max}).Wrap(newKhatru(t)))
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
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxSubscriptions: max}).Wrap(kr))
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
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxSubscriptions: max}).Wrap(kr))
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
	// khatru's EOSE for a frees its place; the client closed a, so the
	// EOSE does not reach it, and REQ b is refused until the gate has read
	// it.
	for {
		got := strings.TrimSpace(send(t, c, []byte(`["REQ","b",{"kinds":[1]}]`)))
		if got == `["EOSE","b"]` {
			break
		}
		if !strings.HasPrefix(got, `["CLOSED","b","blocked:`) {
			t.Fatalf("REQ b after a's query ended: %s, want EOSE or CLOSED blocked", got)
		}
	}
	if n := listenersFor(t, url, c); n > max {
		t.Fatalf("the relay holds %d listeners for one connection, past the cap of %d", n, max)
	}
}

// What the relay sends under a subscription the client was told is
// closed — by its own CLOSE or by the relay's CLOSED — does not reach the
// client, in either mode, however the relay writes it: an EVENT in three
// fragments with a ping among them written a byte at a time, one whose id
// is escaped, one of 100 KiB in one write, an EOSE; the ping, and what the
// relay sends under other ids or that names none (a NOTICE past what the
// gate reads to decide), reach it whole, and a REQ under the id opens it
// again.
func TestGateDropsWhatFollowsClosed(t *testing.T) {
	big := `["EVENT","s",{"content":"` + strings.Repeat("x", 100<<10) + `"}]`
	notice := `["NOTICE","` + strings.Repeat("n", 2*judgeBytes) + `"]`
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			reads := make(chan string, 8)
			h := rawHandler(func(ws *websocket.Conn, raw net.Conn) {
				next := func(want string) bool {
					_, b, err := ws.ReadMessage()
					if err != nil {
						return false
					}
					reads <- string(b)
					return string(b) == want
				}
				write := func(b []byte) bool { _, err := raw.Write(b); return err == nil }
				if !next(`["REQ","s",{}]`) || !write(serverFrame(opText, true, []byte(`["EOSE","s"]`))) {
					return
				}
				if !next(`["REQ","u",{}]`) || !write(serverFrame(opText, true, []byte(`["CLOSED","u","error: no"]`))) {
					return
				}
				if !next(`["CLOSE","u"]`) || !next(`["CLOSE","s"]`) {
					return
				}
				var out []byte
				out = append(out, serverFrame(opText, false, []byte(`["EVENT",`))...)
				out = append(out, serverFrame(opPing, true, []byte("p"))...)
				out = append(out, serverFrame(opContinuation, false, []byte(`"s",{"id":"a"`))...)
				out = append(out, serverFrame(opContinuation, true, []byte(`}]`))...)
				for i := range out {
					if !write(out[i : i+1]) {
						return
					}
				}
				other := serverFrame(opText, true, []byte(`["EVENT","t",{"id":"b"}]`))
				if !write(other[:7]) || !write(other[7:]) {
					return
				}
				for _, m := range []string{`["EVENT","\u0073",{"id":"c"}]`, notice, `["EOSE","s"]`, big, `["EVENT","u",{"id":"d"}]`, `["NOTICE","end"]`} {
					if !write(serverFrame(opText, true, []byte(m))) {
						return
					}
				}
				if !next(`["REQ","s",{}]`) || !write(serverFrame(opText, true, []byte(`["EVENT","s",{"id":"e"}]`))) {
					return
				}
				_, _, _ = ws.ReadMessage()
			})
			c := dialRaw(t, hostileTarget(t, mode, h, Options{Policy: policy.Config{Limits: &policy.Limits{}}}))
			pings := make(chan string, 1)
			c.SetPingHandler(func(p string) error {
				select {
				case pings <- p:
				default:
				}
				return nil
			})
			if got := send(t, c, []byte(`["REQ","s",{}]`)); got != `["EOSE","s"]` {
				t.Fatalf("REQ s answered %s", got)
			}
			if got := send(t, c, []byte(`["REQ","u",{}]`)); got != `["CLOSED","u","error: no"]` {
				t.Fatalf("REQ u answered %s", got)
			}
			// The gate sends the relay CLOSE u before it reads this.
			if err := c.WriteMessage(websocket.TextMessage, []byte(`["CLOSE","s"]`)); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{`["EVENT","t",{"id":"b"}]`, notice, `["NOTICE","end"]`} {
				if got := readText(t, c); got != want {
					if len(got) > 80 {
						got = got[:80] + "…"
					}
					t.Fatalf("client read %s, want %.80s", got, want)
				}
			}
			if mode == "relay" {
				select {
				case p := <-pings:
					if p != "p" {
						t.Errorf("ping %q", p)
					}
				default:
					t.Error("the ping inside the dropped EVENT did not reach the client")
				}
			}
			if got := send(t, c, []byte(`["REQ","s",{}]`)); got != `["EVENT","s",{"id":"e"}]` {
				t.Fatalf("REQ s again answered %s", got)
			}
			for _, want := range []string{`["REQ","s",{}]`, `["REQ","u",{}]`, `["CLOSE","u"]`, `["CLOSE","s"]`, `["REQ","s",{}]`} {
				if got := <-reads; got != want {
					t.Fatalf("relay read %s, want %s", got, want)
				}
			}
		})
	}
}
