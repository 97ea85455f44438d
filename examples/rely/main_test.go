//go:build !race

// These tests are left out of -race builds, like relay/e2e_test.go:
// go-nostr v0.52.3 races on its own (Relay.Close against its write loop
// setting Connection to nil), whatever is in front of it. The hooks'
// concurrency runs under -race in relay/hooks_test.go.

package main

// Integration tests: a real rely v1.2.2 relay with sluice's limits, once
// behind a gate (Wrap) and once with hooks, driven by go-nostr clients over
// real WebSockets. The limiter's clock is frozen at nostrtest.T0 and moved
// by hand, so every wait is exact and nothing sleeps.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/pippellia-btc/rely"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

type env struct {
	ws, http string
	store    *nostrtest.OutageStore
	relay    *rely.Relay
	clock    *nostrtest.Clock // at nostrtest.T0, a minute boundary: a quota window starts there
}

var modes = []struct {
	name  string
	hooks bool
}{{"wrap", false}, {"hooks", true}}

// start serves a fresh rely relay with limits and quota, gated or hooked.
// setup, if not nil, runs on the relay before it starts.

// reasonUnavailable is the reply the gate gives while its store is down.
const reasonUnavailable = "error: rate limiter unavailable"

func start(t *testing.T, useHooks bool, limits policy.Limits, quota *ratelimit.Quota, setup func(*rely.Relay)) *env {
	t.Helper()
	e := &env{store: &nostrtest.OutageStore{Store: ratelimit.NewMemoryStore(1 << 16)}, clock: nostrtest.NewClock()}
	lim := ratelimit.NewLimiter(e.store, e.clock.Now)
	h, r, gate, err := build(useHooks, relay.Options{Limiter: lim, Policy: policy.Config{Limits: &limits, Quota: localQuota(quota, e.clock.Now)}})
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(r)
	}
	ctx, stop := context.WithCancel(context.Background())
	r.Start(ctx)
	// Cleanups run last first: the relay stops after the server closes.
	t.Cleanup(func() {
		stop()
		r.Wait()
	})
	if gate != nil {
		e.http, e.ws = nostrtest.Serve(t, h, gate.Shutdown)
	} else {
		e.http, e.ws = nostrtest.Serve(t, h)
	}
	e.relay = r
	return e
}

func limitsOf(typ wire.Type, rate float64, period time.Duration) policy.Limits {
	var l policy.Limits
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
			l := limitsOf(wire.TypeEVENT, 3, 10*time.Second)
			// Each filter costs one REQ, through the gate and with the hooks.
			l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(7, 10*time.Second)}
			e := start(t, m.hooks, l, nil, nil)
			r := nostrtest.Connect(t, e.ws)
			sk := nostr.GeneratePrivateKey()
			for i := range 3 {
				if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, fmt.Sprint("hello ", i))); err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
			}
			// 3 charged, R=3: 10s·log2(3/2) = 5.85s, rounded up.
			nostrtest.WantReason(t, "event 4", nostrtest.Publish(t, r, nostrtest.Note(t, sk, "flood")), "rate-limited: slow down; retry in 6s")

			// Author-scoped: the narrowest price, 1 (policy.ReadCost).
			author := []string{strings.Repeat("1", 64)}
			three := nostr.Filters{{Authors: author, Kinds: []int{1}}, {Authors: author, Kinds: []int{2}}, {Authors: author, Kinds: []int{3}}}
			for i := range 2 {
				if got := nostrtest.Subscribe(t, r, three); got != "EOSE" {
					t.Fatalf("REQ %d after the flood: %q, want EOSE", i, got)
				}
			}
			// 6 charged, R=7, a REQ of 3: 10s·log2(6/4) = 5.85s, rounded up.
			if got, want := nostrtest.Subscribe(t, r, three), "rate-limited: slow down; retry in 6s"; got != want {
				t.Fatalf("REQ 3: %q, want CLOSED %q", got, want)
			}

			e.clock.Advance(6 * time.Second)
			if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, "patient")); err != nil {
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
			l := limitsOf(wire.TypeEVENT, 10, time.Second)
			l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(10, time.Second)}
			e := start(t, m.hooks, l, nil, nil)
			nostrtest.OutageScenario(t, nostrtest.Connect(t, e.ws), e.store, reasonUnavailable)
		})
	}
}

// TestConnectionLimit: upgrades past the connection limit are refused. The
// gate answers 429 with Retry-After; rely answers a Reject.Connection error
// with 403 and the reason as body. NIP-11 requests are never charged.
func TestConnectionLimit(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var l policy.Limits
			l.Connection = []ratelimit.Limit{ratelimit.PerPeriod(2, 10*time.Second)}
			e := start(t, m.hooks, l, nil, nil)
			for i := range 3 {
				req, _ := http.NewRequest("GET", e.http, nil)
				req.Header.Set("Accept", "application/nostr+json")
				resp, body := nostrtest.Do(t, req)
				if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"name":"sluice example"`) {
					t.Fatalf("NIP-11 %d: %s %s", i, resp.Status, body)
				}
			}
			for i := range 2 {
				if resp, body := nostrtest.Do(t, nostrtest.UpgradeRequest(t, e.http)); resp.StatusCode != http.StatusSwitchingProtocols {
					t.Fatalf("upgrade %d: %s %s", i, resp.Status, body)
				}
			}
			resp, body := nostrtest.Do(t, nostrtest.UpgradeRequest(t, e.http))
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

// TestQuota: one pubkey past its quota of saved events is refused while
// another on the same connection is not; the next window starts afresh.
func TestQuota(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			q, err := ratelimit.NewQuota(2, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			e := start(t, m.hooks, policy.Limits{}, q, nil)
			nostrtest.QuotaScenario(t, nostrtest.Connect(t, e.ws), e.clock, q)
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
			e := start(t, m.hooks, policy.Limits{}, nil, func(r *rely.Relay) {
				r.On.Connect = func(c rely.Client) { seen <- c.IP().String() }
			})
			spoof := http.Header{}
			spoof.Set("True-Client-IP", "192.0.2.66")
			spoof.Set("X-Real-IP", "192.0.2.67")
			spoof.Set("X-Forwarded-For", "192.0.2.68")
			nostrtest.Connect(t, e.ws, nostr.WithRequestHeader(spoof))
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

// localQuota is q in process on clock, or nil (no quota) for a nil q.
func localQuota(q *ratelimit.Quota, clock ratelimit.Clock) ratelimit.ActorQuota {
	if q == nil {
		return nil
	}
	return q.WithClock(clock)
}
