package relay

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// serveMode serves relay behind g as mode says ("wrap": g.Wrap; "proxy":
// g.Proxy in front of relay served on its own) and returns the gate's URL.
func serveMode(t *testing.T, g *Gate, mode string, relay http.Handler) string {
	t.Helper()
	if mode == "wrap" {
		return serve(t, g.Wrap(relay))
	}
	h, err := g.Proxy(serve(t, relay))
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, h)
}

// readPolicy is a policy whose REQ windows never refuse, with the read
// budget read and clients told apart by X-Forwarded-For from loopback.
func readPolicy(read []ratelimit.Limit) policy.Config {
	var l policy.Limits
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(1e6, time.Second)}
	l.Message[wire.TypeCLOSE] = nil
	l.Read = read
	return policy.Config{Limits: &l, Identity: policy.Identity{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Header:         "X-Forwarded-For",
	}}
}

// dialAs dials url as the client at ip (X-Forwarded-For).
func dialAs(t *testing.T, url, ip string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.DefaultDialer.Dial(url, http.Header{"X-Forwarded-For": {ip}})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readAnswer sends req under id on c and reads until the subscription
// ends: it returns the bytes of the EVENT messages received and the
// CLOSED reason ("" when it ended with EOSE).
func readAnswer(t *testing.T, c *websocket.Conn, id, filter string) (events int, closed string) {
	t.Helper()
	if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","`+id+`",`+filter+`]`)); err != nil {
		t.Fatalf("write: %v", err)
	}
	for {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, b, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("read under %s: %v", id, err)
		}
		var msg []json.RawMessage
		if json.Unmarshal(b, &msg) != nil || len(msg) < 2 {
			t.Fatalf("relay message %.80q", b)
		}
		var label, sub string
		_ = json.Unmarshal(msg[0], &label)
		_ = json.Unmarshal(msg[1], &sub)
		if sub != id {
			continue // a late message under an earlier subscription
		}
		switch label {
		case "EVENT":
			events += len(b)
		case "EOSE":
			_ = c.WriteMessage(websocket.TextMessage, []byte(`["CLOSE","`+id+`"]`))
			return events, ""
		case "CLOSED":
			var reason string
			_ = json.Unmarshal(msg[2], &reason)
			return events, reason
		}
	}
}

// retryIn reads N of "…; retry in Ns".
func retryIn(t *testing.T, reason string) time.Duration {
	t.Helper()
	i := strings.LastIndex(reason, "retry in ")
	n, err := strconv.Atoi(strings.TrimSuffix(reason[i+len("retry in "):], "s"))
	if i < 0 || err != nil {
		t.Fatalf("no wait in %q", reason)
	}
	return time.Duration(n) * time.Second
}

const readSpent = "rate-limited: read budget spent; retry in "

// reqRelay is a relay that hands each REQ's subscription id (its JSON
// literal) to answer, which writes what it sends on c and returns false
// when a write failed; it ignores every other frame.
func reqRelay(answer func(c *websocket.Conn, id string) bool) http.Handler {
	up := websocket.Upgrader{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			_, m, err := c.ReadMessage()
			if err != nil {
				return
			}
			var msg []json.RawMessage
			if json.Unmarshal(m, &msg) != nil || len(msg) < 2 || string(msg[0]) != `"REQ"` {
				continue
			}
			if !answer(c, string(msg[1])) {
				return
			}
		}
	})
}

// scrapeRelay answers every REQ with events EVENTs of about size bytes
// and an EOSE, as fast as it can write them, and counts the REQs it gets.
func scrapeRelay(events, size int, reqs *atomic.Int64) http.Handler {
	body := strings.Repeat("x", size)
	return reqRelay(func(c *websocket.Conn, id string) bool {
		reqs.Add(1)
		for range events {
			if c.WriteMessage(websocket.TextMessage, []byte(`["EVENT",`+id+`,{"content":"`+body+`"}]`)) != nil {
				return false
			}
		}
		return c.WriteMessage(websocket.TextMessage, []byte(`["EOSE",`+id+`]`)) == nil
	})
}

// TestReadBudgetSpent: four connections of one client reading as fast as
// a relay writes, Wrap and Proxy, under -race: each is refused once the
// client's read budget is spent, having received at most the budget and
// the stated overshoot (readmeter.go: holdBytes, whatever the
// connections), and its further REQs do not reach the relay.
func TestReadBudgetSpent(t *testing.T) {
	for _, mode := range []string{"wrap", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			const budget = 1 << 20
			clk := nostrtest.NewClock()
			lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), clk.Now)
			var reqs atomic.Int64
			relay := scrapeRelay(50, 8<<10, &reqs)
			g := newGate(t, Options{Limiter: lim, Policy: readPolicy([]ratelimit.Limit{ratelimit.PerPeriod(budget, time.Minute)})})
			url := serveMode(t, g, mode, relay)
			const conns = 4
			var received atomic.Int64
			var wg sync.WaitGroup
			cs := make([]*websocket.Conn, conns)
			for i := range cs {
				cs[i] = dialAs(t, url, "198.51.100.10")
			}
			for i, c := range cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; n < 100; n++ {
						got, closed := readAnswer(t, c, fmt.Sprintf("s%d-%d", i, n), `{"kinds":[1],"limit":500}`)
						received.Add(int64(got))
						if strings.HasPrefix(closed, readSpent) {
							return
						}
					}
					t.Errorf("connection %d never refused", i)
				}()
			}
			wg.Wait()
			if got, most := received.Load(), int64(budget+holdBytes); got > most {
				t.Errorf("received %d bytes, budget %d and overshoot: at most %d", got, budget, most)
			}
			before := reqs.Load()
			for i, c := range cs {
				if _, closed := readAnswer(t, c, fmt.Sprint("again", i), `{"ids":["`+strings.Repeat("0", 64)+`"]}`); !strings.HasPrefix(closed, readSpent) {
					t.Errorf("spent connection %d: REQ answered %q", i, closed)
				}
			}
			if reqs.Load() != before {
				t.Errorf("%d REQs of a spent client reached the relay", reqs.Load()-before)
			}
		})
	}
}

// TestReadSpentComeBack: a client whose read budget is spent and whose
// connections have all closed comes back on a new connection: its REQs
// are refused with the wait and not forwarded, and it is sent nothing
// (its new account here starts spent), Wrap and Proxy.
func TestReadSpentComeBack(t *testing.T) {
	for _, mode := range []string{"wrap", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			clk := nostrtest.NewClock()
			lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), clk.Now)
			var reqs atomic.Int64
			relay := scrapeRelay(50, 8<<10, &reqs)
			g := newGate(t, Options{Limiter: lim, Policy: readPolicy([]ratelimit.Limit{ratelimit.PerPeriod(1<<20, time.Minute)})})
			url := serveMode(t, g, mode, relay)
			const ip = "198.51.100.11"
			c := dialAs(t, url, ip)
			var closed string
			for n := 0; !strings.HasPrefix(closed, readSpent) && n < 100; n++ {
				_, closed = readAnswer(t, c, fmt.Sprint("s", n), `{"kinds":[1],"limit":500}`)
			}
			if !strings.HasPrefix(closed, readSpent) {
				t.Fatalf("never refused: %q", closed)
			}
			c.Close()
			// The gate lets the account go once it has seen the close: a
			// real connection's end, waited for (bounded).
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				g.reads.mu.Lock()
				n := len(g.reads.accts)
				g.reads.mu.Unlock()
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the closed connection's account is still held")
				}
			}
			before := reqs.Load()
			again := dialAs(t, url, ip)
			got, closed := readAnswer(t, again, "back", `{"kinds":[1],"limit":500}`)
			if !strings.HasPrefix(closed, readSpent) || got != 0 {
				t.Errorf("back on a new connection: %d bytes, %q; want nothing, refused", got, closed)
			}
			if reqs.Load() != before {
				t.Errorf("%d REQs of the spent client reached the relay", reqs.Load()-before)
			}
			// At the wait it was told, it reads again.
			clk.Advance(retryIn(t, closed))
			if got, closed := readAnswer(t, again, "later", `{"kinds":[1],"limit":500}`); got == 0 || reqs.Load() != before+1 {
				t.Errorf("at the hinted second: %d bytes, %q, %d REQs forwarded", got, closed, reqs.Load()-before)
			}
		})
	}
}

// staleRelay holds its answer to a REQ under "late" back until the next
// REQ comes: then it sends lateEvents EVENTs of 8 KiB under "late" (a
// subscription the client has closed meanwhile) before answering the new
// REQ with 10 EVENTs of 8 KiB and an EOSE.
func staleRelay(lateEvents int) http.Handler {
	ev := func(id string) []byte {
		return []byte(`["EVENT",` + id + `,{"content":"` + strings.Repeat("x", 8<<10) + `"}]`)
	}
	late := false // one connection in the test
	return reqRelay(func(c *websocket.Conn, id string) bool {
		if id == `"late"` {
			late = true
			return true
		}
		for range lateEvents {
			if late && c.WriteMessage(websocket.TextMessage, ev(`"late"`)) != nil {
				return false
			}
		}
		late = false
		for range 10 {
			if c.WriteMessage(websocket.TextMessage, ev(id)) != nil {
				return false
			}
		}
		return c.WriteMessage(websocket.TextMessage, []byte(`["EOSE",`+id+`]`)) == nil
	})
}

// TestReadStaleSubscriptionNotCharged: what the relay sends under a
// subscription the client has closed is dropped by the gate, and not
// charged to the client's read budget: 1.6 MiB sent under it after the
// client's CLOSE, against a 1 MiB budget, leave the client's next 80 KiB
// answered in full, Wrap and Proxy. (Counted, they would spend the budget
// before the next answer: the gate lets at most the budget and holdBytes
// be owed.)
func TestReadStaleSubscriptionNotCharged(t *testing.T) {
	for _, mode := range []string{"wrap", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			clk := nostrtest.NewClock()
			lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), clk.Now)
			relay := staleRelay(200)
			g := newGate(t, Options{Limiter: lim, Policy: readPolicy([]ratelimit.Limit{ratelimit.PerPeriod(1<<20, time.Minute)})})
			url := serveMode(t, g, mode, relay)
			c := dialAs(t, url, "198.51.100.12")
			for _, m := range []string{`["REQ","late",{"kinds":[1]}]`, `["CLOSE","late"]`} {
				if err := c.WriteMessage(websocket.TextMessage, []byte(m)); err != nil {
					t.Fatal(err)
				}
			}
			got, closed := readAnswer(t, c, "next", `{"kinds":[1],"limit":10}`)
			if closed != "" || got < 80<<10 {
				t.Errorf("after 1.6 MiB under a closed subscription: %d bytes, closed %q; want 10 events and EOSE", got, closed)
			}
		})
	}
}

// A connection that ends owing less than closeBytes (what a relay says to
// every new connection: an AUTH challenge) costs no read charge; one that
// ends owing more is charged as it ends.
func TestReadChargeAtCloseFromCloseBytes(t *testing.T) {
	var settles atomic.Int64
	obs := &policy.Observer{Sent: func(string, int64, int64) { settles.Add(1) }}
	rec := newRecorder()
	rec.challenge = strings.Repeat("c", 64)
	g := newGate(t, Options{Observer: obs, Policy: readPolicy([]ratelimit.Limit{ratelimit.PerPeriod(1<<20, time.Minute)})})
	url := serve(t, g.Wrap(rec))
	for range 5 {
		c := dialAs(t, url, "198.51.100.20")
		if got := readText(t, c); !strings.HasPrefix(got, `["AUTH",`) {
			t.Fatalf("first message %.40s, want the challenge", got)
		}
		_ = c.Close()
	}
	c := dialAs(t, url, "198.51.100.20")
	_ = readText(t, c)
	notice := `["NOTICE","` + strings.Repeat("n", 2<<10) + `"]`
	if err := c.WriteMessage(websocket.TextMessage, recorderCmd("echo", notice)); err != nil {
		t.Fatal(err)
	}
	if got := readText(t, c); got != notice {
		t.Fatalf("echo answered %.40s", got)
	}
	_ = c.Close()
	for i := 0; settles.Load() == 0 && i < 200; i++ {
		time.Sleep(25 * time.Millisecond)
	}
	if n := settles.Load(); n != 1 {
		t.Fatalf("%d read charges for 5 connections sent a challenge and one sent 2 KiB more, want 1 (the last's, at its end)", n)
	}
}
