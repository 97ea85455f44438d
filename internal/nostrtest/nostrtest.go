// Package nostrtest holds the test helpers that sluice's relay tests and
// the khatru and rely examples' tests share: a clock that moves only when
// told, a store that can be switched off as Redis would fail, and go-nostr
// client steps (connect, sign, publish and wait for the OK, subscribe and
// wait for EOSE or CLOSED) with the deadlines the tests use.
//
// It imports neither relay nor the examples, so that relay's own tests can
// use it without an import cycle. Only tests import it.
package nostrtest

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

	"github.com/sluice-relay/sluice/ratelimit"
)

// T0 is where a Clock starts. It is on a minute boundary, so a quota window
// (aligned on the epoch) starts exactly there.
var T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Timeout bounds every network step of the helpers below.
const Timeout = 5 * time.Second

// Clock is a clock that moves only when told: with time standing still
// nothing decays, so a limit of R admits exactly R messages and the wait it
// reports is exact. Safe for concurrent use.
type Clock struct{ t atomic.Pointer[time.Time] }

// NewClock returns a Clock at T0.
func NewClock() *Clock {
	c := &Clock{}
	c.Set(T0)
	return c
}

// Now returns the clock's instant; pass it as NewLimiter's clock.
func (c *Clock) Now() time.Time { return *c.t.Load() }

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) { c.t.Store(&t) }

// Advance moves the clock d forward.
func (c *Clock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// OutageStore is a Store (usually a memory store; the store itself is tested
// in ratelimit) that can be switched off: while Down is true every Decide
// fails with ratelimit.ErrUnavailable, as a Redis outage does. Safe for
// concurrent use if Store is.
type OutageStore struct {
	ratelimit.Store
	Down atomic.Bool
}

// Decide is Store.Decide, or ErrUnavailable while Down.
func (s *OutageStore) Decide(ctx context.Context, key string, limits *ratelimit.Windows, now time.Time) (ratelimit.Decision, error) {
	if s.Down.Load() {
		return ratelimit.Decision{}, fmt.Errorf("test outage: %w", ratelimit.ErrUnavailable)
	}
	return s.Store.Decide(ctx, key, limits, now)
}

// Serve serves h on a loopback httptest server and returns its http:// and
// ws:// URLs. When the test ends, each of shutdown runs first (a gate's
// Shutdown, say), then client connections are closed, then the server.
func Serve(t testing.TB, h http.Handler, shutdown ...func(context.Context) error) (httpURL, wsURL string) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		for _, f := range shutdown {
			ctx, cancel := context.WithTimeout(context.Background(), Timeout)
			f(ctx)
			cancel()
		}
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL, "ws" + strings.TrimPrefix(srv.URL, "http")
}

// Connect connects a go-nostr client to the relay at url, closed when the
// test ends.
func Connect(t testing.TB, url string, opts ...nostr.RelayOption) *nostr.Relay {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	r, err := nostr.RelayConnect(ctx, url, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// Note returns a kind-1 event with content, signed by sk.
func Note(t testing.TB, sk, content string) nostr.Event {
	t.Helper()
	evt := nostr.Event{Kind: 1, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: content}
	if err := evt.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return evt
}

// Publish sends evt on r and waits for its OK: nil for OK true, the
// relay's reason as "msg: <reason>" for OK false.
func Publish(t testing.TB, r *nostr.Relay, evt nostr.Event) error {
	t.Helper()
	// An OK that does not carry the event's id would never reach Publish:
	// it would time out instead of returning the relay's reason.
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	return r.Publish(ctx, evt)
}

// WantReason fails the test unless err, from Publish, is the relay's OK
// false carrying exactly reason.
func WantReason(t testing.TB, what string, err error, reason string) {
	t.Helper()
	if err == nil || err.Error() != "msg: "+reason {
		t.Fatalf("%s: got %v, want OK false %q", what, err, reason)
	}
}

// Subscribe sends one REQ with filters on r and returns "EOSE" or the
// CLOSED reason.
func Subscribe(t testing.TB, r *nostr.Relay, filters nostr.Filters) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
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

// UpgradeRequest returns a bare WebSocket upgrade request for the http://
// URL httpURL.
func UpgradeRequest(t testing.TB, httpURL string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("GET", httpURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	return req
}

// Do sends req and returns the response (body closed) and its body; the
// body of a 101 Switching Protocols is left unread and returned empty.
func Do(t testing.TB, req *http.Request) (*http.Response, string) {
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

// QuotaScenario checks, on a connection r to a relay whose only limit is the
// actor quota q, of 2 events a minute, and whose clock is at T0: a pubkey past
// its quota is refused until the next window, exactly 60s away (T0 is a
// minute boundary), while another pubkey on the same connection is not;
// the next window starts afresh.
func QuotaScenario(t testing.TB, r *nostr.Relay, clock *Clock, q *ratelimit.Quota) {
	t.Helper()
	keys := ApartKeys(q, clock.Now(), 2)
	alice, bob := keys[0], keys[1]
	for i := range 2 {
		if err := Publish(t, r, Note(t, alice, fmt.Sprint("alice ", i))); err != nil {
			t.Fatalf("alice %d: %v", i, err)
		}
	}
	WantReason(t, "alice past quota", Publish(t, r, Note(t, alice, "more")), fmt.Sprintf("rate-limited: quota: %d events per %.0fs for this pubkey; retry in 60s", q.Events(), q.Window().Seconds()))
	if err := Publish(t, r, Note(t, bob, "bob")); err != nil {
		t.Fatalf("bob: %v", err)
	}
	clock.Advance(time.Minute)
	if err := Publish(t, r, Note(t, alice, "next window")); err != nil {
		t.Fatalf("alice in the next window: %v", err)
	}
}

// OutageScenario checks, on a connection r to a relay whose EVENT and REQ
// budgets (ample ones) live in store: while the store is down, EVENTs and
// REQs are refused with exactly unavailable (relay.ReasonUnavailable),
// never "rate-limited:"; when it returns they are admitted again on the
// same connection.
func OutageScenario(t testing.TB, r *nostr.Relay, store *OutageStore, unavailable string) {
	t.Helper()
	sk := nostr.GeneratePrivateKey()
	store.Down.Store(true)
	WantReason(t, "event during outage", Publish(t, r, Note(t, sk, "down")), unavailable)
	if got := Subscribe(t, r, nostr.Filters{{Kinds: []int{1}}}); got != unavailable {
		t.Fatalf("REQ during outage: %q, want CLOSED %q", got, unavailable)
	}
	store.Down.Store(false)
	if err := Publish(t, r, Note(t, sk, "up")); err != nil {
		t.Fatalf("event after the outage: %v", err)
	}
	if got := Subscribe(t, r, nostr.Filters{{Kinds: []int{1}}}); got != "EOSE" {
		t.Fatalf("REQ after the outage: %q", got)
	}
}

// probeWindow numbers the windows QuotaApart probes in: increasing, all long
// before any instant a test uses, so that a probe never counts in a window
// a later probe or the test itself uses.
var probeWindow atomic.Int64

// QuotaApart reports whether actors fall in different slots of q. Actors
// sharing a slot share a budget (by design: the table is fixed-size), so a
// test that charges two actors apart must pick them apart, or fail once in
// about a thousand runs. It probes by filling the actors' slots in a window
// long before now, which any later window overwrites: q is as it was for
// every instant from there on. Call it before the test charges the actors:
// a slot already charged in a later window would take the probe's counts.
func QuotaApart(q *ratelimit.Quota, now time.Time, actors ...string) bool {
	at := now.Add(-time.Duration(1<<20-probeWindow.Add(1)) * q.Window())
	p := q.WithClock(func() time.Time { return at })
	ctx := context.Background()
	for _, a := range actors {
		if full, _, _ := p.Exceeded(ctx, a); full {
			return false // an earlier actor filled this slot
		}
		for added, _ := p.Add(ctx, a, "", 0); added; added, _ = p.Add(ctx, a, "", 0) {
		}
	}
	return true
}

// PubkeyN is the n-th of a series of made-up pubkeys (64 hex digits), for
// tests that need actors but no signatures.
func PubkeyN(n int) string { return fmt.Sprintf("%064x", 0xabc000+n) }

// ApartPubkeys returns the first n of PubkeyN(1), PubkeyN(2), … that fall
// in different slots of q (see QuotaApart).
func ApartPubkeys(q *ratelimit.Quota, now time.Time, n int) []string {
	var out []string
	for i := 1; len(out) < n; i++ {
		if pk := PubkeyN(i); QuotaApart(q, now, append(out, pk)...) {
			out = append(out, pk)
		}
	}
	return out
}

// ApartKeys returns n fresh private keys whose pubkeys fall in different
// slots of q, and apart from the actors in avoid (pubkeys or other actor
// strings).
func ApartKeys(q *ratelimit.Quota, now time.Time, n int, avoid ...string) []string {
	keys := make([]string, 0, n)
	actors := append([]string(nil), avoid...)
	for len(keys) < n {
		sk := nostr.GeneratePrivateKey()
		pk, _ := nostr.GetPublicKey(sk)
		if QuotaApart(q, now, append(actors, pk)...) {
			keys, actors = append(keys, sk), append(actors, pk)
		}
	}
	return keys
}

// CountingBody is a request body of n bytes made as they are read, which
// counts how many were: a test sends a body of hundreds of MiB without
// holding it, and sees how much of it the server read. Safe for
// concurrent use.
type CountingBody struct {
	left int64
	read atomic.Int64
}

// NewCountingBody returns a body of n bytes.
func NewCountingBody(n int64) *CountingBody { return &CountingBody{left: n} }

// Read implements io.Reader.
func (b *CountingBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	if n > b.left {
		n = b.left
	}
	clear(p[:n])
	b.left -= n
	b.read.Add(n)
	return int(n), nil
}

// N returns how many bytes were read so far.
func (b *CountingBody) N() int64 { return b.read.Load() }
