//go:build !race

package relay

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/noderelay"
	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// The proxy in front of a relay not written in Go: @nostr-relay/core
// (TypeScript, SQLite), started by internal/noderelay. cmd/sluice's
// TestE2EProxyNodeRelay runs the same relay behind the sluice binary.

// nodeRelay starts the Node relay (internal/noderelay) with NIP-42 for
// hostname (none when "") and returns its ws:// URL; it stops with the test.
func nodeRelay(t *testing.T, hostname string) string {
	t.Helper()
	return noderelay.Start(t, hostname)
}

// proxyTo serves a gate with opts behind Proxy in front of upstream on a
// loopback server whose URL is also the gate's RelayURL.
func proxyTo(t *testing.T, opts Options, upstream string, srv *httptest.Server) string {
	t.Helper()
	url := "ws://" + srv.Listener.Addr().String()
	opts.RelayURL = url
	h, err := newGate(t, opts).Proxy(upstream)
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = h
	srv.Start()
	t.Cleanup(srv.Close)
	return url
}

func TestE2ENodeRelay(t *testing.T) {
	t.Run("publish and subscribe, hostile corpus", func(t *testing.T) {
		up := nodeRelay(t, "")
		q, _ := ratelimit.NewQuota(600, time.Minute)
		url := proxyTo(t, Options{Policy: policy.Config{Limits: generous(), Quota: q.WithClock(nil)}}, up, httptest.NewUnstartedServer(nil))
		r := connect(t, url)
		sk := nostr.GeneratePrivateKey()
		var ids []string
		for i := range 3 {
			ev := nostrtest.Note(t, sk, "note "+string(rune('a'+i)))
			if err := nostrtest.Publish(t, r, ev); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
			ids = append(ids, ev.ID)
		}
		if got := query(t, r, nostr.Filter{IDs: ids}); len(got) != 3 {
			t.Fatalf("query found %d of 3", len(got))
		}
		// A tampered event is refused by the gate, never forwarded.
		bad := nostrtest.Note(t, sk, "tampered")
		bad.Content = "changed"
		if err := nostrtest.Publish(t, r, bad); err == nil || !strings.Contains(err.Error(), "invalid: event id does not match its content") {
			t.Fatalf("tampered event: %v", err)
		}
		c := dialRaw(t, url)
		for _, f := range loadHostile(t) {
			if err := c.WriteMessage(websocket.TextMessage, []byte(f.Frame)); err != nil {
				t.Fatal(err)
			}
			if got := readText(t, c); got != f.Want {
				t.Errorf("%s:\n got %s\nwant %s", f.Name, got, f.Want)
			}
		}
		honest(t, url)
	})
	t.Run("NIP-42 and allow.pubkeys", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(nil)
		up := nodeRelay(t, "127.0.0.1")
		sk, pk := newKey(t)
		var l policy.Limits
		l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
		url := proxyTo(t, Options{Policy: policy.Config{Limits: &l, Identity: policy.Identity{AllowPubkeys: []string{pk}}}}, up, srv)
		r := connect(t, url)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// go-nostr records the relay's challenge as its reader gets to it:
		// an AUTH signed before carries none, and is refused.
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if err = r.Auth(ctx, func(ev *nostr.Event) error { return ev.Sign(sk) }); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("AUTH: %v", err)
		}
		for i := range 3 {
			if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, "member "+string(rune('a'+i)))); err != nil {
				t.Fatalf("allow-listed pubkey's event %d: %v", i, err)
			}
		}
		// Another pubkey on the same budget, unauthenticated: the EVENT
		// limit's burst of one, then refused.
		other := connect(t, url)
		osk := nostr.GeneratePrivateKey()
		_ = nostrtest.Publish(t, other, nostrtest.Note(t, osk, "one"))
		if err := nostrtest.Publish(t, other, nostrtest.Note(t, osk, "two")); err == nil || !strings.Contains(err.Error(), "rate-limited:") {
			t.Fatalf("second event of a pubkey not allow-listed: %v", err)
		}
	})
}
