//go:build !race

package relay

import (
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// accepted sends e on c and reports whether khatru accepted it; any other
// answer must be a refusal of the gate's with reason prefix want (when
// want is not "").
func accepted(t *testing.T, c *websocket.Conn, e nostr.Event, want string) bool {
	t.Helper()
	got := send(t, c, eventFrameOf(t, e))
	if strings.HasPrefix(got, `["OK","`+e.ID+`",true`) {
		return true
	}
	if want != "" && !strings.HasPrefix(got, `["OK","`+e.ID+`",false,"`+want) {
		t.Fatalf("EVENT answered %s, want a refusal %q", got, want)
	}
	return false
}

func noteOfKind(t *testing.T, sk string, kind int, content string) nostr.Event {
	t.Helper()
	e := nostr.Event{Kind: kind, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: content}
	if err := e.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestE2EPolicy drives khatru behind the gate (relay and proxy mode) with
// each part of a compiled policy: a member tier proved by NIP-42, a kind
// class, an IPv6 aggregate, shadow windows, and a reload on an open
// connection.
func TestE2EPolicy(t *testing.T) {
	memberSK, member := newKey(t)
	strangerSK, _ := newKey(t)
	var address, tierL policy.Limits
	address.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(2, time.Hour)}
	address.Message[wire.TypeAUTH] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Second)}
	tierL.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(6, time.Hour)}
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode+"/tier", func(t *testing.T) {
			clk := nostrtest.NewClock()
			clk.Set(time.Now()) // khatru checks created_at against its own clock
			cfg := policy.Config{Limits: &address, Tiers: []policy.Tier{{Name: "members", Pubkeys: []string{member}, Limits: tierL}}}
			url := hostileTarget(t, mode, negKhatru(t), Options{Limiter: memLimiter(clk), Policy: cfg})
			c, ch := authConn(t, url)
			// The address's budget: 2 events, whoever signs them.
			for i := range 2 {
				if !accepted(t, c, noteOfKind(t, strangerSK, 1, "addr "+string(rune('a'+i))), "") {
					t.Fatalf("address event %d refused", i)
				}
			}
			if accepted(t, c, noteOfKind(t, memberSK, 1, "member before AUTH"), "rate-limited:") {
				t.Fatal("a member's event before AUTH was charged to its tier, not its address")
			}
			f, id := signedAuth(t, memberSK, ch, url, clk.Now())
			if got := send(t, c, []byte(f)); strings.TrimSpace(got) != okFor(id, true, "") {
				t.Fatalf("AUTH answered %s", got)
			}
			// Proved: the tier's 6, on the member's own budget.
			n := 0
			for i := range 10 {
				if accepted(t, c, noteOfKind(t, memberSK, 1, "member "+string(rune('a'+i))), "rate-limited:") {
					n++
				}
			}
			if n != 6 {
				t.Errorf("an authenticated member had %d of 10 events accepted, want its tier's 6", n)
			}
			// A pubkey in no tier that authenticates stays on its address.
			c2, ch2 := authConn(t, url)
			f, id = signedAuth(t, strangerSK, ch2, url, clk.Now())
			if got := send(t, c2, []byte(f)); strings.TrimSpace(got) != okFor(id, true, "") {
				t.Fatalf("stranger's AUTH answered %s", got)
			}
			if accepted(t, c2, noteOfKind(t, strangerSK, 1, "stranger after AUTH"), "rate-limited:") {
				t.Fatal("a pubkey in no tier left its spent address budget by authenticating")
			}
		})
		t.Run(mode+"/kinds+shadow+reload", func(t *testing.T) {
			sk, _ := newKey(t)
			var l policy.Limits
			l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Hour), {Rate: 3, Period: 2 * time.Hour, Shadow: true}}
			cfg := policy.Config{Limits: &l, Kinds: []policy.Class{{Name: "reactions", Kinds: [][2]int{{7, 7}}, Limits: []ratelimit.Limit{ratelimit.PerPeriod(2, time.Hour)}}}}
			var shadowed atomic.Int64
			obs := &policy.Observer{Frame: func(_ string, t wire.Type, o policy.Outcome) {
				if t == wire.TypeEVENT && o == policy.Shadowed {
					shadowed.Add(1)
				}
			}}
			clk := nostrtest.NewClock()
			g := newGate(t, Options{Limiter: memLimiter(clk), Policy: cfg, Observer: obs})
			url := serve(t, g.Wrap(newKhatru(t)))
			if mode == "proxy" {
				h, err := g.Proxy(serve(t, newKhatru(t)))
				if err != nil {
					t.Fatal(err)
				}
				url = serve(t, h)
			}
			c := dialRaw(t, url)
			// Kind 7 is in a class of 2; kind 1 is not.
			for i := range 2 {
				if !accepted(t, c, noteOfKind(t, sk, 7, "+"+string(rune('a'+i))), "") {
					t.Fatalf("reaction %d refused", i)
				}
			}
			if accepted(t, c, noteOfKind(t, sk, 7, "+c"), "rate-limited:") {
				t.Fatal("a third reaction passed a class of 2")
			}
			// The shadow window (3) would have refused from the fourth
			// EVENT on (the refused reaction charged nothing to it): kind 1
			// events all pass, counted as shadow_limited.
			for i := range 4 {
				if !accepted(t, c, noteOfKind(t, sk, 1, "note "+string(rune('a'+i))), "") {
					t.Fatalf("note %d refused by a shadow window", i)
				}
			}
			if got := shadowed.Load(); got != 3 {
				t.Errorf("%d EVENTs counted shadow_limited, want 3 (events 4 to 6 of a shadow window of 3)", got)
			}
			// Reload: the same connection, a tighter policy, enforced. (A
			// window of a period the old policy had would carry its score
			// over: the budgets are the store's, not the policy's.)
			var tight policy.Limits
			tight.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, 30*time.Minute)}
			if err := g.Reload(policy.Config{Limits: &tight}); err != nil {
				t.Fatal(err)
			}
			if !accepted(t, c, noteOfKind(t, sk, 1, "after reload"), "") {
				t.Fatal("first event after the reload refused")
			}
			if accepted(t, c, noteOfKind(t, sk, 1, "after reload 2"), "rate-limited:") {
				t.Fatal("the reloaded limit of 1 was not applied to an open connection")
			}
			// An invalid policy is refused and the running one kept.
			var bad policy.Limits
			bad.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1, time.Hour)}
			if err := g.Reload(policy.Config{Limits: &bad}); err == nil {
				t.Fatal("Reload accepted rate = cost")
			}
			if accepted(t, c, noteOfKind(t, sk, 1, "after bad reload"), "rate-limited:") {
				t.Fatal("a refused reload changed the running policy")
			}
		})
	}
}

// TestE2EAggregate: clients rotating /64s inside one IPv6 /48, seen through
// a trusted proxy's X-Forwarded-For, share the /48's windows.
func TestE2EAggregate(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Hour)}
	cfg := policy.Config{
		Limits:     &l,
		Identity:   policy.Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}},
		Aggregates: []policy.Aggregate{{Bits: 48, Limits: []ratelimit.Limit{ratelimit.PerPeriod(3, time.Hour)}}},
	}
	url := serve(t, newGate(t, Options{Limiter: memLimiter(nostrtest.NewClock()), Policy: cfg}).Wrap(newKhatru(t)))
	dial := func(ip string) (*websocket.Conn, error) {
		c, _, err := websocket.DefaultDialer.Dial(url, http.Header{"X-Forwarded-For": {ip}})
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	sk, _ := newKey(t)
	// Three /64s of one /48, two events each: the /48's 3 are shared.
	n := 0
	for _, ip := range []string{"2001:db8:7:1::1", "2001:db8:7:2::1", "2001:db8:7:3::1"} {
		c, err := dial(ip)
		if err != nil {
			t.Fatalf("upgrade from %s: %v", ip, err)
		}
		for i := range 2 {
			if accepted(t, c, noteOfKind(t, sk, 1, ip+" "+string(rune('a'+i))), "rate-limited:") {
				n++
			}
		}
	}
	if n != 3 {
		t.Errorf("%d of 6 events from three /64s of one /48 accepted, want the /48's 3", n)
	}
	// The /48's upgrades are counted apart, with the same numbers: a
	// fourth /64 is refused its upgrade.
	if _, err := dial("2001:db8:7:4::1"); err == nil {
		t.Error("a fourth upgrade from one /48 passed its windows of 3")
	}
	c, err := dial("2001:db8:8::1")
	if err != nil {
		t.Fatalf("upgrade from another /48: %v", err)
	}
	if !accepted(t, c, noteOfKind(t, sk, 1, "another /48"), "") {
		t.Error("another /48 refused")
	}
}
