package relay

import (
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// TestGateNeedsRelayURLForPubkeyGrants: a policy that grants anything by
// NIP-42 pubkey (a member tier, an allow-listed pubkey) is refused on a
// gate without RelayURL, by New and by Reload (which keeps the running
// policy); one that grants nothing by pubkey (the quota alone, allow-listed
// addresses) needs none.
func TestGateNeedsRelayURLForPubkeyGrants(t *testing.T) {
	_, member := newKey(t)
	var tierL policy.Limits
	tierL.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Second)}
	tiers := policy.Config{Tiers: []policy.Tier{{Name: "members", Pubkeys: []string{member}, Limits: tierL}}}
	q, err := ratelimit.NewQuota(5, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts Options
		want bool // refused without a RelayURL
	}{
		{"member tiers", Options{Policy: tiers}, true},
		{"allow-listed pubkeys", Options{Policy: policy.Config{Identity: policy.Identity{AllowPubkeys: []string{member}}}}, true},
		{"allow-listed addresses", Options{Policy: policy.Config{Identity: policy.Identity{AllowIPs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}}}, false},
		{"quota alone", Options{Policy: policy.Config{Quota: q.WithClock(time.Now)}}, false},
		{"nothing", Options{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Logger = quietLogger()
			g, err := New(tc.opts)
			if tc.want != hasFieldError(err, "RelayURL") || (!tc.want && err != nil) {
				t.Fatalf("New without RelayURL: %v", err)
			}
			if g != nil {
				_ = g.Shutdown(t.Context())
			}
			tc.opts.RelayURL = "wss://relay.example"
			g, err = New(tc.opts)
			if err != nil {
				t.Fatalf("New with RelayURL: %v", err)
			}
			_ = g.Shutdown(t.Context())
		})
	}

	g := newGate(t, Options{})
	before := g.current()
	if err := g.Reload(tiers); !hasFieldError(err, "RelayURL") {
		t.Fatalf("Reload to member tiers without RelayURL: %v", err)
	}
	if g.current() != before {
		t.Fatal("a refused Reload replaced the running policy")
	}
}

// TestGateAuthNamesRelayURL: with RelayURL, an AUTH's relay tag must name
// it (host, default port dropped, path when RelayURL has one; the scheme
// is not compared), whatever host the client claims to have dialed: an
// AUTH a member signed for the client's own "relay" is refused, though
// the client sent that relay's name as Host. Only an AUTH the gate lets
// through reaches the relay, which answers OK true to every one.
func TestGateAuthNamesRelayURL(t *testing.T) {
	clk := nostrtest.NewClock()
	sk, pk := newKey(t)
	rec := newRecorder()
	rec.challenge = "chal"
	rec.answerOK = func(hex32) bool { return true }
	url := serveSelf(t, Options{
		Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Identity: policy.Identity{AllowPubkeys: []string{pk}}},
		RelayURL: "wss://relay.example/nostr",
	}, func(g *Gate) http.Handler { return g.Wrap(rec) })
	for i, tc := range []struct {
		tag  string
		pass bool
	}{
		{"wss://relay.example/nostr", true},
		{"ws://RELAY.example/nostr/", true},
		{"wss://relay.example:443/nostr", true},
		{"wss://evil.example", false},
		{"wss://evil.example/nostr", false},
		{"wss://relay.example", false},
		{"wss://relay.example/other", false},
		{"wss://relay.example:8443/nostr", false},
	} {
		c, _, err := (&websocket.Dialer{}).Dial(url, http.Header{"Host": {"evil.example"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := readText(t, c); got != `["AUTH","chal"]` {
			t.Fatalf("relay's challenge: %s", got)
		}
		frame, id := signedAuth(t, sk, "chal", tc.tag, clk.Now().Add(time.Duration(i)*time.Second))
		_ = c.WriteMessage(websocket.TextMessage, []byte(frame))
		want := okFor(id, true, "")
		if !tc.pass {
			want = okFor(id, false, reasonAuthRelay)
		}
		if got := readText(t, c); got != want {
			t.Errorf("relay tag %q (Host evil.example):\n got %s\nwant %s", tc.tag, got, want)
		}
		c.Close()
	}
}
