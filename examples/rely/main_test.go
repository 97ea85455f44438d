//go:build !race

// These tests are left out of -race builds, like relay/e2e_test.go:
// go-nostr v0.52.3 races on its own (Relay.Close against its write loop
// setting Connection to nil), whatever is in front of it. The hooks'
// concurrency runs under -race in relay/hooks_test.go.

package main

// Integration tests: a real rely v1.2.2 relay with sluice's limits, once
// behind a gate (Wrap) and once with hooks, driven by go-nostr clients over
// real WebSockets. The limiter's clock is frozen at t0 and moved by hand, so
// every wait is exact and nothing sleeps.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/pippellia-btc/rely"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay"
)

// t0 is on a minute boundary, so a quota window (aligned on the epoch)
// starts exactly there.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// outageStore is a memory store that can be made to fail as Redis would;
// the store itself is tested in ratelimit.
type outageStore struct {
	ratelimit.Store
	down atomic.Bool
}

func (s *outageStore) Decide(ctx context.Context, key string, limits []ratelimit.Limit, now time.Time) (ratelimit.Decision, error) {
	if s.down.Load() {
		return ratelimit.Decision{}, fmt.Errorf("test outage: %w", ratelimit.ErrUnavailable)
	}
	return s.Store.Decide(ctx, key, limits, now)
}

type env struct {
	ws, http string
	store    *outageStore
	relay    *rely.Relay
	clock    atomic.Pointer[time.Time]
}

func (e *env) now() time.Time          { return *e.clock.Load() }
func (e *env) set(t time.Time)         { e.clock.Store(&t) }
func (e *env) advance(d time.Duration) { e.set(e.now().Add(d)) }

var modes = []struct {
	name  string
	hooks bool
}{{"wrap", false}, {"hooks", true}}

// start serves a fresh rely relay with limits and quota, gated or hooked.
// setup, if not nil, runs on the relay before it starts.
func start(t *testing.T, hooks bool, limits relay.Limits, quota *ratelimit.Quota, setup func(*rely.Relay)) *env {
	t.Helper()
	e := &env{store: &outageStore{Store: ratelimit.NewMemoryStore(1024)}}
	e.set(t0)
	lim := ratelimit.NewLimiter(e.store, ratelimit.LimiterOptions{Now: e.now})
	h, r, gate, err := build(hooks, relay.Options{Limiter: lim, Limits: &limits, Quota: quota, Now: e.now})
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(r)
	}
	ctx, stop := context.WithCancel(context.Background())
	r.Start(ctx)
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		if gate != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			gate.Shutdown(sctx)
		}
		srv.CloseClientConnections()
		srv.Close()
		stop()
		r.Wait()
	})
	e.relay = r
	e.http = srv.URL
	e.ws = "ws" + strings.TrimPrefix(srv.URL, "http")
	return e
}

func connect(t *testing.T, e *env, opts ...nostr.RelayOption) *nostr.Relay {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := nostr.RelayConnect(ctx, e.ws, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func note(t *testing.T, sk, content string) nostr.Event {
	t.Helper()
	evt := nostr.Event{Kind: 1, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: content}
	if err := evt.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return evt
}

func publish(t *testing.T, r *nostr.Relay, evt nostr.Event) error {
	t.Helper()
	// An OK that does not carry the event's id would never reach Publish:
	// it would time out instead of returning the relay's reason.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.Publish(ctx, evt)
}

func wantReason(t *testing.T, what string, err error, reason string) {
	t.Helper()
	if err == nil || err.Error() != "msg: "+reason {
		t.Fatalf("%s: got %v, want OK false %q", what, err, reason)
	}
}

// subscribe sends one REQ with filters and returns "EOSE" or the CLOSED reason.
func subscribe(t *testing.T, r *nostr.Relay, filters nostr.Filters) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sub, err := r.Subscribe(ctx, filters)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer sub.Unsub()
	for {
		select {
		case <-sub.Events:
			// go-nostr blocks its reader until stored events are taken.
		case <-sub.EndOfStoredEvents:
			return "EOSE"
		case reason := <-sub.ClosedReason:
			return reason
		case <-ctx.Done():
			t.Fatal("subscribe: neither EOSE nor CLOSED")
			return ""
		}
	}
}

func limitsOf(typ relay.Type, rate float64, period time.Duration) relay.Limits {
	var l relay.Limits
	l.Message[typ] = []ratelimit.Limit{ratelimit.PerPeriod(rate, period)}
	return l
}

// TestEventFlood: EVENTs past the limit are refused with OK false carrying
// the event's id and the exact wait; REQs of the same client still pass (a
// REQ of three filters costing one); a client that waits as told is
// admitted.
func TestEventFlood(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			l := limitsOf(relay.TypeEVENT, 3, 10*time.Second)
			l.Message[relay.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(2, 10*time.Second)}
			e := start(t, m.hooks, l, nil, nil)
			r := connect(t, e)
			sk := nostr.GeneratePrivateKey()
			for i := range 3 {
				if err := publish(t, r, note(t, sk, fmt.Sprint("hello ", i))); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
			}
			// 3 charged, R=3: 10s·log2(3/2) = 5.85s, rounded up.
			wantReason(t, "event 4", publish(t, r, note(t, sk, "flood")), "rate-limited: slow down; retry in 6s")

			three := nostr.Filters{{Kinds: []int{1}}, {Kinds: []int{2}}, {Kinds: []int{3}}}
			for i := range 2 {
				if got := subscribe(t, r, three); got != "EOSE" {
					t.Fatalf("REQ %d after the flood: %q, want EOSE", i, got)
				}
			}
			// 2 charged, R=2: 10s·log2(2/1) = 10s.
			if got, want := subscribe(t, r, three), "rate-limited: slow down; retry in 10s"; got != want {
				t.Fatalf("REQ 3: %q, want CLOSED %q", got, want)
			}

			e.advance(6 * time.Second)
			if err := publish(t, r, note(t, sk, "patient")); err != nil {
				t.Fatalf("event after the reported wait: %v", err)
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
			l := limitsOf(relay.TypeEVENT, 10, time.Second)
			l.Message[relay.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(10, time.Second)}
			e := start(t, m.hooks, l, nil, nil)
			r := connect(t, e)
			sk := nostr.GeneratePrivateKey()

			e.store.down.Store(true)
			wantReason(t, "event during outage", publish(t, r, note(t, sk, "down")), relay.ReasonUnavailable)
			if got := subscribe(t, r, nostr.Filters{{Kinds: []int{1}}}); got != relay.ReasonUnavailable {
				t.Fatalf("REQ during outage: %q, want CLOSED %q", got, relay.ReasonUnavailable)
			}

			e.store.down.Store(false)
			if err := publish(t, r, note(t, sk, "up")); err != nil {
				t.Fatalf("event after the outage: %v", err)
			}
			if got := subscribe(t, r, nostr.Filters{{Kinds: []int{1}}}); got != "EOSE" {
				t.Fatalf("REQ after the outage: %q", got)
			}
		})
	}
}

// TestConnectionLimit: upgrades past the connection limit are refused. The
// gate answers 429 with Retry-After; rely answers a Reject.Connection error
// with 403 and the reason as body. NIP-11 requests are never charged.
func TestConnectionLimit(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var l relay.Limits
			l.Connection = []ratelimit.Limit{ratelimit.PerPeriod(2, 10*time.Second)}
			e := start(t, m.hooks, l, nil, nil)
			for i := range 3 {
				req, _ := http.NewRequest("GET", e.http, nil)
				req.Header.Set("Accept", "application/nostr+json")
				resp, body := do(t, req)
				if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"name":"sluice example"`) {
					t.Fatalf("NIP-11 %d: %s %s", i, resp.Status, body)
				}
			}
			for i := range 2 {
				if resp, body := do(t, upgradeRequest(t, e)); resp.StatusCode != http.StatusSwitchingProtocols {
					t.Fatalf("upgrade %d: %s %s", i, resp.Status, body)
				}
			}
			resp, body := do(t, upgradeRequest(t, e))
			if m.hooks {
				if resp.StatusCode != http.StatusForbidden || strings.TrimSpace(body) != "rate-limited: slow down; retry in 10s" {
					t.Fatalf("upgrade 3: %s %q, want 403 with the reason", resp.Status, body)
				}
				return
			}
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "10" {
				t.Fatalf("upgrade 3: %s, Retry-After %q; want 429, 10", resp.Status, resp.Header.Get("Retry-After"))
			}
		})
	}
}

func upgradeRequest(t *testing.T, e *env) *http.Request {
	t.Helper()
	req, err := http.NewRequest("GET", e.http, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	return req
}

func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return resp, ""
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestQuota: one pubkey past its quota of saved events is refused while
// another on the same connection is not; the next window starts afresh.
func TestQuota(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			q, err := ratelimit.NewQuota(2, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			e := start(t, m.hooks, relay.Limits{}, q, nil)
			r := connect(t, e)
			alice, bob := nostr.GeneratePrivateKey(), nostr.GeneratePrivateKey()
			for i := range 2 {
				if err := publish(t, r, note(t, alice, fmt.Sprint("alice ", i))); err != nil {
					t.Fatalf("alice %d: %v", i, err)
				}
			}
			wantReason(t, "alice past quota", publish(t, r, note(t, alice, "more")), "rate-limited: slow down; retry in 60s")
			if err := publish(t, r, note(t, bob, "bob")); err != nil {
				t.Fatalf("bob: %v", err)
			}
			e.advance(time.Minute)
			if err := publish(t, r, note(t, alice, "next window")); err != nil {
				t.Fatalf("alice in the next window: %v", err)
			}
		})
	}
}

// TestClientAddress: rely believes True-Client-IP, X-Real-IP and
// X-Forwarded-For from any peer. Whatever a client writes there, rely must
// see its real address, and the hooks must charge that address.
func TestClientAddress(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			seen := make(chan string, 1)
			e := start(t, m.hooks, relay.Limits{}, nil, func(r *rely.Relay) {
				r.On.Connect = func(c rely.Client) { seen <- c.IP().String() }
			})
			spoof := http.Header{}
			spoof.Set("True-Client-IP", "192.0.2.66")
			spoof.Set("X-Real-IP", "192.0.2.67")
			spoof.Set("X-Forwarded-For", "192.0.2.68")
			connect(t, e, nostr.WithRequestHeader(spoof))
			select {
			case ip := <-seen:
				if ip != "127.0.0.1" {
					t.Fatalf("rely sees the client as %s, want 127.0.0.1", ip)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("rely never registered the client")
			}
		})
	}
}
