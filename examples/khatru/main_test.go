//go:build !race

// These tests are left out of -race builds, like relay/e2e_test.go: khatru
// v0.19.1 (a CLOSE's removeListenerId against notifyListeners) and go-nostr
// v0.52.3 (Relay.Close against its write loop setting Connection to nil)
// race on their own, whatever is in front of them. The hooks' concurrency
// runs under -race in relay/hooks_test.go.

package main

// Integration tests: a real khatru v0.19.1 relay with sluice's limits, once
// behind a gate (Wrap) and once with hooks, driven by go-nostr clients over
// real WebSockets. The limiter's clock is frozen at nostrtest.T0 and moved
// by hand, so every wait is exact and nothing sleeps.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

type env struct {
	ws    string // ws:// URL of the relay
	http  string
	store *nostrtest.OutageStore
	clock *nostrtest.Clock // at nostrtest.T0, a minute boundary: a quota window starts there
}

// modes are the two ways to put sluice in front of khatru.
var modes = []struct {
	name  string
	hooks bool
}{{"wrap", false}, {"hooks", true}}

// start serves a fresh khatru relay with limits and quota, gated or hooked.

// reasonUnavailable is the reply the gate gives while its store is down.
const reasonUnavailable = "error: rate limiter unavailable"

func start(t *testing.T, useHooks bool, limits policy.Limits, quota *ratelimit.Quota) *env {
	t.Helper()
	e := &env{store: &nostrtest.OutageStore{Store: ratelimit.NewMemoryStore(1 << 16)}, clock: nostrtest.NewClock()}
	lim := ratelimit.NewLimiter(e.store, e.clock.Now)
	e.http, e.ws = serve(t, useHooks, relay.Options{Limiter: lim, Policy: policy.Config{Limits: &limits, Quota: localQuota(quota, e.clock.Now)}})
	return e
}

// serve builds the relay with opts, gated or hooked, and serves it until
// the test ends.
func serve(t *testing.T, hooks bool, opts relay.Options) (httpURL, wsURL string) {
	t.Helper()
	h, gate, err := build(hooks, opts)
	if err != nil {
		t.Fatal(err)
	}
	if gate != nil {
		return nostrtest.Serve(t, h, gate.Shutdown)
	}
	return nostrtest.Serve(t, h)
}

func limitsOf(typ wire.Type, rate float64, period time.Duration) policy.Limits {
	var l policy.Limits
	l.Message[typ] = []ratelimit.Limit{ratelimit.PerPeriod(rate, period)}
	return l
}

// TestEventFlood: EVENTs past the limit are refused with OK false carrying
// the event's id and the exact wait; REQs of the same client still pass;
// a client that waits as told is admitted.
func TestEventFlood(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			l := limitsOf(wire.TypeEVENT, 3, 10*time.Second)
			l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(20, time.Second)}
			e := start(t, m.hooks, l, nil)
			r := nostrtest.Connect(t, e.ws)
			sk := nostr.GeneratePrivateKey()
			for i := range 3 {
				if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, fmt.Sprint("hello ", i))); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
			}
			// 3 charged, R=3: 10s·log2(3/2) = 5.85s, rounded up.
			nostrtest.WantReason(t, "event 4", nostrtest.Publish(t, r, nostrtest.Note(t, sk, "flood")), "rate-limited: slow down; retry in 6s")

			evts, err := r.QuerySync(context.Background(), nostr.Filter{Kinds: []int{1}})
			if err != nil || len(evts) != 3 {
				t.Fatalf("REQ after the flood: %d events, %v; want the 3 admitted", len(evts), err)
			}

			e.clock.Advance(6 * time.Second)
			if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, "patient")); err != nil {
				t.Fatalf("event after the reported wait: %v", err)
			}
		})
	}
}

// TestREQChargedPerFilter: a REQ of three filters costs three REQs, through
// the gate and with the hooks alike (khatru's RejectFilter runs once per
// filter): each filter is a query and a listener on the relay. The filters
// are author-scoped, the narrowest price (1); a scrape costs more
// (policy.ReadCost).
func TestREQChargedPerFilter(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			e := start(t, m.hooks, limitsOf(wire.TypeREQ, 7, 10*time.Second), nil)
			r := nostrtest.Connect(t, e.ws)
			author := []string{strings.Repeat("1", 64)}
			three := nostr.Filters{{Authors: author, Kinds: []int{1}}, {Authors: author, Kinds: []int{2}}, {Authors: author, Kinds: []int{3}}}
			for i := range 2 {
				if got := nostrtest.Subscribe(t, r, three); got != "EOSE" {
					t.Fatalf("REQ %d: %q, want EOSE", i, got)
				}
			}
			// 6 charged, R=7: the gate refuses the REQ's 3 (10s·log2(6/4)
			// = 5.8s); the hooks admit its first filter (7 ≤ 7) and refuse
			// the second (10s·log2(7/6) = 2.2s).
			want := "rate-limited: slow down; retry in 6s"
			if m.hooks {
				want = "rate-limited: slow down; retry in 3s"
			}
			if got := nostrtest.Subscribe(t, r, three); got != want {
				t.Fatalf("REQ 3: %q, want CLOSED %q", got, want)
			}
		})
	}
}

// TestStoreOutage: when the store cannot decide, EVENTs and REQs are
// refused with "error: rate limiter unavailable", never "rate-limited:";
// when it returns, they are admitted again on the same connection.
func TestStoreOutage(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			l := limitsOf(wire.TypeEVENT, 10, time.Second)
			l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(10, time.Second)}
			e := start(t, m.hooks, l, nil)
			nostrtest.OutageScenario(t, nostrtest.Connect(t, e.ws), e.store, reasonUnavailable)
		})
	}
}

// upgrade sends a bare WebSocket upgrade and returns the response.
func upgrade(t *testing.T, e *env) *http.Response {
	t.Helper()
	resp, _ := nostrtest.Do(t, nostrtest.UpgradeRequest(t, e.http))
	return resp
}

// TestConnectionLimit: upgrades past the connection limit get 429. Only the
// gate can say how long to wait; khatru's RejectConnection answers a bare
// 429.
func TestConnectionLimit(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var l policy.Limits
			l.Connection = []ratelimit.Limit{ratelimit.PerPeriod(2, 10*time.Second)}
			e := start(t, m.hooks, l, nil)
			for i := range 2 {
				if resp := upgrade(t, e); resp.StatusCode != http.StatusSwitchingProtocols {
					t.Fatalf("upgrade %d: %s", i, resp.Status)
				}
			}
			resp := upgrade(t, e)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("upgrade 3: %s, want 429", resp.Status)
			}
			want := "10" // 10s·log2(2/1)
			if m.hooks {
				want = "" // khatru cannot send one
			}
			if got := resp.Header.Get("Retry-After"); got != want {
				t.Errorf("Retry-After %q, want %q", got, want)
			}
		})
	}
}

// TestQuota: one pubkey past its quota of validated events is refused while
// another on the same connection is not; the next window starts afresh.
func TestQuota(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			q, err := ratelimit.NewQuota(2, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			e := start(t, m.hooks, policy.Limits{}, q)
			nostrtest.QuotaScenario(t, nostrtest.Connect(t, e.ws), e.clock, q)
		})
	}
}

// TestNIP11 passes the relay information document through, ungated.
func TestNIP11(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var l policy.Limits
			l.Connection = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
			e := start(t, m.hooks, l, nil)
			for i := range 3 { // more than the connection limit allows upgrades
				req, _ := http.NewRequest("GET", e.http, nil)
				req.Header.Set("Accept", "application/nostr+json")
				resp, body := nostrtest.Do(t, req)
				if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"name":"sluice example"`) {
					t.Fatalf("NIP-11 %d: %s %s", i, resp.Status, body)
				}
				if m.hooks && !strings.Contains(body, `Rate limits per client (IPv4 address or IPv6 /64), as rate per half-life: connections 1.5/1h0m0s.`) {
					t.Errorf("NIP-11 description does not state the limits: %s", body)
				}
			}
		})
	}
}

// TestCountHooks: khatru answers a COUNT refused by RejectCountFilter with a
// NOTICE carrying the reason (and a COUNT of 0, khatru's choice).
func TestCountHooks(t *testing.T) {
	e := start(t, true, limitsOf(wire.TypeCOUNT, 1.5, 10*time.Second), nil)
	notices := make(chan string, 4)
	r := nostrtest.Connect(t, e.ws, nostr.WithNoticeHandler(func(n string) { notices <- n }))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := r.Count(ctx, nostr.Filters{{Kinds: []int{1}}}); err != nil {
		t.Fatalf("first COUNT: %v", err)
	}
	if _, _, err := r.Count(ctx, nostr.Filters{{Kinds: []int{1}}}); err != nil {
		t.Fatalf("second COUNT: %v", err)
	}
	select {
	case n := <-notices:
		if want := "rate-limited: slow down; retry in 10s"; n != want {
			t.Fatalf("NOTICE %q, want %q", n, want)
		}
	case <-ctx.Done():
		t.Fatal("no NOTICE for the refused COUNT")
	}
}

// TestNegOpen: khatru filters a NEG-OPEN through RejectFilter under the
// connection's own context. It must be charged as a NEG-OPEN each time, and
// must not use up (or be mistaken for) the REQ budget.
func TestNegOpen(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			l := limitsOf(wire.TypeNEGOPEN, 2, 10*time.Second)
			l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, 10*time.Second)}
			e := start(t, m.hooks, l, nil)
			c, _, err := websocket.DefaultDialer.Dial(e.ws, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			roundTrip := func(frame string) string {
				t.Helper()
				if err := c.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
					t.Fatal(err)
				}
				_, b, err := c.ReadMessage()
				if err != nil {
					t.Fatal(err)
				}
				return strings.TrimSpace(string(b)) // khatru ends frames with a newline
			}
			// "61" is an empty negentropy v1 message: khatru answers each
			// admitted NEG-OPEN with one NEG-MSG.
			for i := range 2 {
				if got := roundTrip(fmt.Sprintf(`["NEG-OPEN","n%d",{"kinds":[1]},"61"]`, i)); strings.Contains(got, "rate-limited") {
					t.Fatalf("NEG-OPEN %d refused: %s", i, got)
				}
			}
			// 2 charged, R=2: 10s. The gate answers with a NOTICE, khatru
			// with a NEG-ERR (which go-nostr labels NEG-ERROR).
			if got := roundTrip(`["NEG-OPEN","n2",{"kinds":[1]},"61"]`); !strings.Contains(got, `"rate-limited: slow down; retry in 10s"`) {
				t.Fatalf("NEG-OPEN 3: %s, want refused for 10s", got)
			}
			if got := roundTrip(`["REQ","r",{"kinds":[1]}]`); got != `["EOSE","r"]` {
				t.Fatalf("REQ after NEG-OPENs: %s, want EOSE", got)
			}
		})
	}
}

// TestRedisOutage: budgets in a real Redis (redis-server started by the
// test on a free loopback port); killing it turns every EVENT and REQ into
// "error: rate limiter unavailable", never "rate-limited:".
func TestRedisOutage(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			srv := redistest.Start(t)
			client, err := redisstore.NewClient(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			store, err := redisstore.New(client, redisstore.Options{Timeout: 2 * time.Second}) // outcomes, not speed: CI is loaded
			if err != nil {
				t.Fatal(err)
			}
			l := limitsOf(wire.TypeEVENT, 100, time.Second)
			l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Second)}
			_, ws := serve(t, m.hooks, relay.Options{
				Limiter: ratelimit.NewLimiter(store, nil),
				Policy:  policy.Config{Limits: &l},
			})
			r := nostrtest.Connect(t, ws)
			sk := nostr.GeneratePrivateKey()
			if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, "redis up")); err != nil {
				t.Fatalf("event with Redis up: %v", err)
			}
			srv.Kill()
			nostrtest.WantReason(t, "event with Redis down", nostrtest.Publish(t, r, nostrtest.Note(t, sk, "redis down")), reasonUnavailable)
			if got := nostrtest.Subscribe(t, r, nostr.Filters{{Kinds: []int{1}}}); got != reasonUnavailable {
				t.Fatalf("REQ with Redis down: %q, want CLOSED %q", got, reasonUnavailable)
			}
		})
	}
}

// TestGateAndHooksAgree drives one sequence of EVENTs through a gate and
// through hooks and asserts the same answer to each, by the one rule of
// policy.Identity and relay.Options.Quota: the actor quota is asked first,
// and a quota refusal charges no window; then the EVENT windows; an
// allow-listed author is exempt from the quota only. Hooks that exempted
// an allow-listed author from the EVENT windows too accept the last event;
// a gate or hooks that charged the windows for a quota refusal refuse the
// sixth.
func TestGateAndHooksAgree(t *testing.T) {
	alice, member := nostr.GeneratePrivateKey(), nostr.GeneratePrivateKey()
	memberPK, _ := nostr.GetPublicKey(member)
	// EVENT: a burst of 5 in 10 s; quota: 2 events a minute per actor.
	limits := limitsOf(wire.TypeEVENT, 5, 10*time.Second)
	steps := []struct {
		sk   string
		want string // "" for accepted, else the reason
	}{
		{alice, ""},
		{alice, ""},
		{alice, "rate-limited: quota: 2 events per 60s for this pubkey; retry in 60s"}, // quota; no window charged
		{member, ""}, // 3 of 5; exempt from the quota
		{member, ""}, // 4 of 5
		{member, ""}, // 5 of 5
		{member, "rate-limited: slow down; retry in 4s"}, // the EVENT window: 10s·log2(5/4) = 3.22s, rounded up
	}
	answers := map[string][]string{}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			q, err := ratelimit.NewQuota(2, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			store := &nostrtest.OutageStore{Store: ratelimit.NewMemoryStore(1 << 16)}
			clock := nostrtest.NewClock()
			lim := ratelimit.NewLimiter(store, clock.Now)
			_, ws := serve(t, m.hooks, relay.Options{Limiter: lim, Policy: policy.Config{Limits: &limits, Quota: q.WithClock(clock.Now), Identity: policy.Identity{AllowPubkeys: []string{memberPK}}},
				RelayURL: "ws://relay.example"}) // allow-listed pubkeys need it (nothing here AUTHs)
			r := nostrtest.Connect(t, ws)
			for i, st := range steps {
				err := nostrtest.Publish(t, r, nostrtest.Note(t, st.sk, fmt.Sprint("note ", i)))
				got := ""
				if err != nil {
					got = strings.TrimPrefix(err.Error(), "msg: ")
				}
				answers[m.name] = append(answers[m.name], got)
				if got != st.want {
					t.Errorf("event %d: %q, want %q", i+1, got, st.want)
				}
			}
		})
	}
	if g, h := strings.Join(answers["wrap"], "|"), strings.Join(answers["hooks"], "|"); g != h {
		t.Errorf("gate and hooks disagree:\n gate  %s\n hooks %s", g, h)
	}
}

// TestGateAndHooksAgreeOnPolicy: a kind class and a shadow window, through
// a gate and through hooks: the same answers, and the same count of frames
// a shadow window would have refused.
func TestGateAndHooksAgreeOnPolicy(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Hour), {Rate: 3, Period: 2 * time.Hour, Shadow: true}}
	cfg := policy.Config{Limits: &l, Kinds: []policy.Class{{Name: "reactions", Kinds: [][2]int{{7, 7}}, Limits: []ratelimit.Limit{ratelimit.PerPeriod(2, time.Hour)}}}}
	kinds := []int{7, 7, 7, 1, 1, 1, 1}
	want := []string{"", "", "rate-limited: slow down; retry in 3600s", "", "", "", ""}
	answers := map[string][]string{}
	shadowed := map[string]int64{}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var n atomic.Int64
			obs := &policy.Observer{Frame: func(_ string, t wire.Type, o policy.Outcome) {
				if t == wire.TypeEVENT && o == policy.Shadowed {
					n.Add(1)
				}
			}}
			clock := nostrtest.NewClock()
			lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(1<<16), clock.Now)
			_, ws := serve(t, m.hooks, relay.Options{Limiter: lim, Policy: cfg, Observer: obs})
			r := nostrtest.Connect(t, ws)
			for i, k := range kinds {
				evt := nostr.Event{Kind: k, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: fmt.Sprint("e ", i)}
				if err := evt.Sign(sk); err != nil {
					t.Fatal(err)
				}
				got := ""
				if err := nostrtest.Publish(t, r, evt); err != nil {
					got = strings.TrimPrefix(err.Error(), "msg: ")
				}
				answers[m.name] = append(answers[m.name], got)
				if got != want[i] {
					t.Errorf("event %d (kind %d): %q, want %q", i+1, k, got, want[i])
				}
			}
			shadowed[m.name] = n.Load()
			if n.Load() != 3 {
				t.Errorf("%d events counted shadow_limited, want 3", n.Load())
			}
		})
	}
	if g, h := strings.Join(answers["wrap"], "|"), strings.Join(answers["hooks"], "|"); g != h || shadowed["wrap"] != shadowed["hooks"] {
		t.Errorf("gate and hooks disagree:\n gate  %s (%d shadow)\n hooks %s (%d shadow)", g, shadowed["wrap"], h, shadowed["hooks"])
	}
}

// localQuota is q in process on clock, or nil (no quota) for a nil q.
func localQuota(q *ratelimit.Quota, clock ratelimit.Clock) ratelimit.ActorQuota {
	if q == nil {
		return nil
	}
	return q.WithClock(clock)
}
