package relay

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// The subscriptions a connection holds open are capped: a REQ for a new
// one past the cap is answered CLOSED "blocked: …" and not forwarded; a
// REQ reusing an open id takes a place of its own (khatru adds its filters
// as more listeners), and past the cap it is refused and its id closed at
// the relay; a CLOSE frees all of an id's places; the relay's CLOSED frees
// them once the gate has sent the relay a CLOSE for the id, which it does
// as soon as the CLOSED has passed (a REQ for that same id decided first
// keeps them instead).
// The relay answers every REQ with EOSE, and the client reads each before
// it goes on: a CLOSE before the EOSE frees nothing yet
// (TestGateCloseBeforeEOSEKeepsPlace).
func TestGateSubscriptionCap(t *testing.T) {
	rec := newRecorder()
	rec.eose = true
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxSubscriptions: 3})
	c := dialRaw(t, serve(t, g.Wrap(rec)))
	send := func(frame string) { _ = c.WriteMessage(websocket.TextMessage, []byte(frame)) }
	expect := func(want string) {
		t.Helper()
		if got := readText(t, c); got != want {
			t.Fatalf("got %s, want %s", got, want)
		}
	}
	req := func(id string) { send(`["REQ","` + id + `",{}]`); expect(`["EOSE","` + id + `"]`) }
	for _, id := range []string{"a", "b", "a"} {
		req(id)
	}
	send(`["REQ","d",{}]`)
	if got := readText(t, c); got != `["CLOSED","d","blocked: too many open subscriptions (at most 3); close one first"]` {
		t.Fatalf("fourth subscription answered %s", got)
	}
	send(`["CLOSE","b"]`)
	req("d")              // b's place: a, a, d
	send(`["CLOSE","a"]`) // both of a's: d
	// The relay closes d itself. (The echo command is a REQ of its own,
	// "echo", which takes a place.)
	_ = c.WriteMessage(websocket.TextMessage, recorderCmd("echo", `["CLOSED","d","error: gone"]`))
	if got := readText(t, c); got != `["CLOSED","d","error: gone"]` {
		t.Fatalf("relay's CLOSED came back as %s", got)
	}
	expect(`["EOSE","echo"]`)
	send(`["CLOSE","echo"]`) // after the gate's CLOSE d: none
	req("e")                 // e
	req("f")                 // e, f
	req("g")                 // e, f, g
	send(`["REQ","e",{}]`)   // a reuse past the cap
	if got := readText(t, c); !strings.HasPrefix(got, `["CLOSED","e","blocked: `) {
		t.Fatalf("reused REQ past the cap answered %s", got)
	}
	send(`["CLOSE","f"]`) // g
	_ = c.WriteMessage(websocket.TextMessage, recorderCmd("echo", `["CLOSED","g","error: gone"]`))
	if got := readText(t, c); got != `["CLOSED","g","error: gone"]` {
		t.Fatalf("relay's CLOSED came back as %s", got)
	}
	expect(`["EOSE","echo"]`)
	// The gate CLOSEs g at once, not before the client's next frame: g's
	// place is free for the REQ g that follows (g, echo), and h fits.
	req("g")
	req("h")
	send(`["REQ","i",{}]`)
	if got := readText(t, c); !strings.HasPrefix(got, `["CLOSED","i","blocked: `) {
		t.Fatalf("REQ past the cap after the frees answered %s", got)
	}
	echo := func(arg string) string { return string(recorderCmd("echo", arg)) }
	want := []string{
		`["REQ","a",{}]`, `["REQ","b",{}]`, `["REQ","a",{}]`, `["CLOSE","b"]`, `["REQ","d",{}]`, `["CLOSE","a"]`,
		echo(`["CLOSED","d","error: gone"]`), `["CLOSE","d"]`, `["CLOSE","echo"]`,
		`["REQ","e",{}]`, `["REQ","f",{}]`, `["REQ","g",{}]`, `["CLOSE","e"]`, `["CLOSE","f"]`,
		echo(`["CLOSED","g","error: gone"]`), `["CLOSE","g"]`, `["REQ","g",{}]`, `["REQ","h",{}]`,
	}
	got := rec.frames(len(want))
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("relay got\n%q\nwant\n%q", got, want)
	}
}

// When the gate refuses a REQ whose id names an open subscription (here a
// limit, then an invalid frame), the client is told CLOSED, and the relay
// gets a CLOSE for it, so it stops streaming what the client dropped.
func TestGateRefusedREQClosesAtRelay(t *testing.T) {
	clk := nostrtest.NewClock()
	var l policy.Limits
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(2.5, time.Hour)}
	rec := newRecorder()
	g := newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &l}})
	c := dialRaw(t, serve(t, g.Wrap(rec)))
	send := func(frame string) { _ = c.WriteMessage(websocket.TextMessage, []byte(frame)) }
	send(`["REQ","s",{"kinds":[1],"limit":0}]`)
	send(`["REQ","t",{"kinds":[1],"limit":0}]`)
	send(`["REQ","s",{"kinds":[7],"limit":0}]`) // over the budget
	if got := readText(t, c); !strings.HasPrefix(got, `["CLOSED","s","rate-limited: `) {
		t.Fatalf("third REQ answered %s", got)
	}
	send(`["REQ","t",{"kinds":"x"}]`) // invalid
	if got := readText(t, c); !strings.HasPrefix(got, `["CLOSED","t","`) {
		t.Fatalf("invalid REQ answered %s", got)
	}
	send(`["REQ","u",{}]`) // no such subscription: nothing to close
	if got := readText(t, c); !strings.HasPrefix(got, `["CLOSED","u","rate-limited: `) {
		t.Fatalf("REQ u answered %s", got)
	}
	want := []string{`["REQ","s",{"kinds":[1],"limit":0}]`, `["REQ","t",{"kinds":[1],"limit":0}]`, `["CLOSE","s"]`, `["CLOSE","t"]`}
	got := rec.frames(len(want))
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("relay got %q, want %q", got, want)
	}
}

// The connections one client holds open at once are capped; an upgrade
// past the cap gets 429 with the hold-off as Retry-After; closing one frees
// a place at once; an allow-listed address is not counted.
func TestGateConnectionCap(t *testing.T) {
	closed := make(chan struct{}, 8)
	obs := &policy.Observer{Open: func(d int) {
		if d < 0 {
			closed <- struct{}{}
		}
	}}
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxConnections: 2, Observer: obs})
	url := serve(t, g.Wrap(newRecorder()))
	c1 := dialRaw(t, url)
	dialRaw(t, url)
	_, resp, err := websocket.DefaultDialer.Dial(url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "5" {
		t.Fatalf("third connection: %v %v, want 429 with Retry-After: 5", resp, err)
	}
	c1.Close()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the gate did not see the first connection close")
	}
	dialRaw(t, url)

	g = newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}, Identity: policy.Identity{AllowIPs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}}, MaxConnections: 1})
	url = serve(t, g.Wrap(newRecorder()))
	for range 3 {
		dialRaw(t, url)
	}
}

// A client that keeps sending frames it is refused from the local table is
// closed with 1008 and its wait; a client that knocks now and then is not.
func TestGateKnockingClientClosed(t *testing.T) {
	clk := nostrtest.NewClock()
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
	var refused, cuts atomic.Int64
	obs := &policy.Observer{
		Frame: func(_ string, _ wire.Type, o policy.Outcome) {
			if o == policy.RateLimited {
				refused.Add(1)
			}
		},
		Cut: func(r string) {
			if r == "knocking" {
				cuts.Add(1)
			}
		},
	}
	g := newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &l}, Observer: obs})
	rec := newRecorder()
	url := serve(t, g.Wrap(rec))
	event := []byte(`["EVENT",` + goNostrEvent + `]`)

	c := dialRaw(t, url)
	go func() {
		for range 10 * knockBurst {
			if c.WriteMessage(websocket.TextMessage, event) != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	replies := 0
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			replies++
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation || ce.Text != "sluice: too many refused frames; retry in 3600s" {
			t.Fatalf("after %d replies: %v, want 1008 with the wait", replies, err)
		}
		break
	}
	// Queued replies are dropped with the connection; the gate's count
	// says how many refusals came first.
	if n := refused.Load(); n < knockBurst || n >= 10*knockBurst {
		t.Errorf("closed after %d refusals, want about %d", n, knockBurst)
	}
	if cuts.Load() != 1 {
		t.Errorf("%d knocking cuts counted, want 1", cuts.Load())
	}
	// The relay is told the client went away (1001), not the 1008 the
	// client got: khatru logs a 1008 as an unexpected close error.
	if code := rec.closed(); code != websocket.CloseGoingAway {
		t.Errorf("relay saw close %d, want 1001", code)
	}
}

// rendezvous is a Store and a Guard in which each decision waits (up to
// ten seconds) for a Hold to have been asked: a gate that asks the Guard
// only after the connection's budget is decided makes every decision
// wait out the bound.
type rendezvous struct {
	ratelimit.Store
	ratelimit.Guard
	holds chan struct{}
	late  atomic.Int64
}

func (r *rendezvous) Decide(ctx context.Context, key string, ws *ratelimit.Windows, now time.Time) (ratelimit.Decision, error) {
	select {
	case <-r.holds:
	case <-time.After(10 * time.Second):
		r.late.Add(1)
	}
	return r.Store.Decide(ctx, key, ws, now)
}

func (r *rendezvous) Hold(ctx context.Context, client string, aggs []string, max int) (time.Duration, bool, error) {
	r.holds <- struct{}{}
	return r.Guard.Hold(ctx, client, aggs, max)
}

// TestGateSharedGuardAskedAlongside: with a Guard of the caller's (shared
// by instances, a round trip away), an upgrade asks it for a place while
// its connection budget is decided, not after; an upgrade the budget
// refuses gives back the place its Hold took, so the client's next
// admitted upgrade finds it.
func TestGateSharedGuardAskedAlongside(t *testing.T) {
	clk := nostrtest.NewClock()
	rv := &rendezvous{Store: ratelimit.NewMemoryStore(0), Guard: ratelimit.NewMemoryGuard(clk.Now), holds: make(chan struct{}, 16)}
	l := policy.Limits{Connection: []ratelimit.Limit{ratelimit.PerPeriod(2, 10*time.Second)}}
	g := newGate(t, Options{
		Limiter:        ratelimit.NewLimiter(rv, clk.Now),
		Guard:          rv,
		Policy:         policy.Config{Limits: &l},
		MaxConnections: 3,
	})
	url := serve(t, g.Wrap(newRecorder()))
	dialRaw(t, url)
	dialRaw(t, url)
	// Refused by the budget (2 per 10 s), several times: each Hold asked
	// alongside took the third place, and gave it back.
	for range 3 {
		_, resp, err := websocket.DefaultDialer.Dial(url, nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "10" {
			t.Fatalf("an upgrade past the budget: %v %v, want 429 with Retry-After: 10", resp, err)
		}
	}
	clk.Advance(10 * time.Second)
	dialRaw(t, url) // the third place, free again
	if n := rv.late.Load(); n != 0 {
		t.Errorf("%d connection decisions waited for a Hold asked after them", n)
	}
}

// TestGateKnockingAsksNoGuard: a client whose upgrades the limiter refuses
// from its local table is answered 429 with the wait left, without a call
// of a shared Guard (countingGuard: Hold, Release or Violate; penalty off)
// or of the store: knocking costs no round trip.
func TestGateKnockingAsksNoGuard(t *testing.T) {
	clk := nostrtest.NewClock()
	st := &countingStore{Store: ratelimit.NewMemoryStore(0)}
	hc := &countingGuard{Guard: ratelimit.NewMemoryGuard(clk.Now)}
	l := policy.Limits{Connection: []ratelimit.Limit{ratelimit.PerPeriod(2, 10*time.Second)}}
	g := newGate(t, Options{Limiter: ratelimit.NewLimiter(st, clk.Now), Guard: hc, Policy: policy.Config{Limits: &l}, MaxConnections: 8})
	url := serve(t, g.Wrap(newRecorder()))
	dialRaw(t, url)
	dialRaw(t, url)
	_, resp, err := websocket.DefaultDialer.Dial(url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("past the budget: %v %v, want 429", resp, err)
	}
	holds, calls := hc.calls.Load(), st.n.Load()
	for i := range 5 {
		clk.Advance(time.Second)
		_, resp, err := websocket.DefaultDialer.Dial(url, nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != strconv.Itoa(9-i) {
			t.Fatalf("knock %d: %v %v, want 429 with Retry-After: %d", i, resp, err, 9-i)
		}
	}
	if h, c := hc.calls.Load()-holds, st.n.Load()-calls; h != 0 || c != 0 {
		t.Errorf("5 knocks refused from the local table asked the Guard %d times and the store %d", h, c)
	}
}

// countingStore counts a Store's decisions.
type countingStore struct {
	ratelimit.Store
	n atomic.Int64
}

func (s *countingStore) Decide(ctx context.Context, key string, ws *ratelimit.Windows, now time.Time) (ratelimit.Decision, error) {
	s.n.Add(1)
	return s.Store.Decide(ctx, key, ws, now)
}
