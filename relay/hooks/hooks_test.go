package hooks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// hookFixture is a Hooks over a memory store that can fail and a clock
// frozen at nostrtest.T0: with time standing still nothing decays, so a
// limit of R admits exactly R messages and the wait it reports is exact.
type hookFixture struct {
	h     *Hooks
	store *nostrtest.OutageStore
	clock *nostrtest.Clock
	obs   [wire.NumTypes][policy.Unmatched + 1]atomic.Int64
	conns [policy.Unmatched + 1]atomic.Int64
}

func newHookFixture(t *testing.T, limits policy.Limits, quota *ratelimit.Quota) *hookFixture {
	t.Helper()
	// A large table: keys that share a slot share a budget by design, and at
	// 64 slots the REQ and NEG-OPEN keys of one test met in 1 run of 64.
	f := &hookFixture{store: &nostrtest.OutageStore{Store: ratelimit.NewMemoryStore(1 << 20)}, clock: nostrtest.NewClock()}
	h, err := New(Options{
		Limiter: ratelimit.NewLimiter(f.store, f.clock.Now),
		Policy:  policy.Config{Limits: &limits, Quota: localQuota(quota, f.clock.Now)},

		Observer: &policy.Observer{
			Frame:      func(_ string, t wire.Type, o policy.Outcome) { f.obs[t][o].Add(1) },
			Connection: func(_ string, o policy.Outcome) { f.conns[o].Add(1) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	return f
}

// limitsOf returns Limits with only typ limited to rate per period.
func limitsOf(typ wire.Type, rate float64, period time.Duration) policy.Limits {
	var l policy.Limits
	l.Message[typ] = []ratelimit.Limit{ratelimit.PerPeriod(rate, period)}
	return l
}

const hookIP = "203.0.113.7"

func ipOf(context.Context) string { return hookIP }

// reqCtx makes a context the way khatru makes one per REQ: a cancelable
// child of the connection's context carrying the subscription id.
func reqCtx(conn context.Context, id string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(conn)
	type subKey struct{}
	return context.WithValue(ctx, subKey{}, id), cancel
}

// TestKhatruRejectFilterChargesPerFilter: khatru calls RejectFilter once
// per filter, and each filter is charged as one REQ, as a Gate charges; a
// filter past the most one REQ may hold is refused.
func TestKhatruRejectFilterChargesPerFilter(t *testing.T) {
	f := newHookFixture(t, limitsOf(wire.TypeREQ, 6.5, 10*time.Second), nil)
	k := f.h.Khatru(ipOf, nil, nil)
	conn, closeConn := context.WithCancel(context.Background())
	defer closeConn()
	k.OnConnect(conn)

	for i := range 2 {
		ctx, cancel := reqCtx(conn, fmt.Sprint("sub", i))
		defer cancel()
		for j := range 3 {
			if reject, msg := k.RejectFilter(ctx, narrowFilter); reject {
				t.Fatalf("REQ %d filter %d refused: %q", i, j, msg)
			}
		}
	}
	ctx, cancel := reqCtx(conn, "sub2")
	defer cancel()
	reject, msg := k.RejectFilter(ctx, narrowFilter)
	// 6 charged, R=6.5, c=1: wait = 10s·log2(6/5.5) = 1.3s.
	if want := "rate-limited: slow down; retry in 2s"; !reject || msg != want {
		t.Fatalf("third REQ: got (%v, %q), want (true, %q)", reject, msg, want)
	}
	if got := f.obs[wire.TypeREQ][policy.Admitted].Load(); got != 6 {
		t.Errorf("observer saw %d admitted REQ filters, want 6 (one per filter)", got)
	}

	g := newHookFixture(t, limitsOf(wire.TypeREQ, 100, 10*time.Second), nil)
	k = g.h.Khatru(ipOf, nil, nil)
	ctx, cancel = reqCtx(context.Background(), "many")
	defer cancel()
	for j := range wire.DefaultBounds().MaxFilters {
		if reject, msg := k.RejectFilter(ctx, narrowFilter); reject {
			t.Fatalf("filter %d refused: %q", j, msg)
		}
	}
	if reject, msg := k.RejectFilter(ctx, narrowFilter); !reject || msg != scan.ReasonFilters+" (at most 10)" {
		t.Fatalf("filter past the bound: (%v, %q)", reject, msg)
	}
}

// TestKhatruRejectFilterForgetsEndedREQ checks that a REQ's entry leaves
// when its context ends, so the table holds only live subscriptions.
func TestKhatruRejectFilterForgetsEndedREQ(t *testing.T) {
	f := newHookFixture(t, limitsOf(wire.TypeREQ, 100, time.Second), nil)
	k := f.h.Khatru(ipOf, nil, nil)
	for i := range 100 {
		ctx, cancel := reqCtx(context.Background(), fmt.Sprint(i))
		k.RejectFilter(ctx, narrowFilter)
		cancel()
	}
	// context.AfterFunc deletes on its own goroutine; wait for it.
	for deadline := time.Now().Add(5 * time.Second); countMap(&f.h.reqs) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d ended REQs still remembered", countMap(&f.h.reqs))
		}
		runtime.Gosched()
	}
}

// TestKhatruRejectFilterNegOpen: khatru filters a NEG-OPEN under the
// connection's own context; it must be charged as a NEG-OPEN every time,
// not as a REQ charged once per connection.
func TestKhatruRejectFilterNegOpen(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeNEGOPEN] = []ratelimit.Limit{ratelimit.PerPeriod(2, time.Second)}
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(2, time.Second)}
	f := newHookFixture(t, l, nil)
	k := f.h.Khatru(ipOf, nil, nil)
	conn, closeConn := context.WithCancel(context.Background())
	defer closeConn()
	k.OnConnect(conn)

	for i := range 2 {
		if reject, msg := k.RejectFilter(conn, narrowFilter); reject {
			t.Fatalf("NEG-OPEN %d refused: %q", i, msg)
		}
	}
	if reject, _ := k.RejectFilter(conn, narrowFilter); !reject {
		t.Fatal("third NEG-OPEN admitted past a budget of 2")
	}
	if got := f.obs[wire.TypeNEGOPEN][policy.RateLimited].Load(); got != 1 {
		t.Errorf("NEG-OPEN refusals observed = %d, want 1", got)
	}
	// The REQ budget is untouched.
	ctx, cancel := reqCtx(conn, "a")
	defer cancel()
	if reject, msg := k.RejectFilter(ctx, narrowFilter); reject {
		t.Fatalf("REQ refused after NEG-OPENs: %q", msg)
	}
}

// TestKhatruRejectFilterUncancelable: a context that never ends cannot be
// told apart from the next REQ's; every call is charged rather than none.
func TestKhatruRejectFilterUncancelable(t *testing.T) {
	f := newHookFixture(t, limitsOf(wire.TypeREQ, 2, time.Second), nil)
	k := f.h.Khatru(ipOf, nil, nil)
	ctx := context.Background()
	k.RejectFilter(ctx, narrowFilter)
	k.RejectFilter(ctx, narrowFilter)
	if reject, _ := k.RejectFilter(ctx, narrowFilter); !reject {
		t.Fatal("third call under context.Background admitted past a budget of 2")
	}
}

func TestKhatruRejectEvent(t *testing.T) {
	f := newHookFixture(t, limitsOf(wire.TypeEVENT, 3, 10*time.Second), nil)
	k := f.h.Khatru(ipOf, nil, nil)
	ctx := context.Background()
	evt := &nostr.Event{PubKey: "aa"}
	for i := range 3 {
		if reject, msg := k.RejectEvent(ctx, evt); reject {
			t.Fatalf("event %d refused: %q", i, msg)
		}
	}
	// 3 charged, R=3: wait = 10s·log2(3/2) = 5.85s, rounded up.
	want := "rate-limited: slow down; retry in 6s"
	if reject, msg := k.RejectEvent(ctx, evt); !reject || msg != want {
		t.Fatalf("fourth event: (%v, %q), want (true, %q)", reject, msg, want)
	}
	// A client that waits as told is admitted.
	f.clock.Set(nostrtest.T0.Add(6 * time.Second))
	if reject, msg := k.RejectEvent(ctx, evt); reject {
		t.Fatalf("event after the reported wait refused: %q", msg)
	}
	// Another client has its own budget.
	other := f.h.Khatru(func(context.Context) string { return "198.51.100.1" }, nil, nil)
	if reject, msg := other.RejectEvent(ctx, evt); reject {
		t.Fatalf("another client refused: %q", msg)
	}
}

// TestHooksStoreOutage: a store that cannot decide refuses with the
// unavailable reason, never a rate-limited one, on every hook.
func TestHooksStoreOutage(t *testing.T) {
	l := policy.DefaultLimits()
	f := newHookFixture(t, l, nil)
	f.store.Down.Store(true)
	k := f.h.Khatru(ipOf, nil, nil)
	ctx, cancel := reqCtx(context.Background(), "x")
	defer cancel()
	for name, call := range map[string]func() (bool, string){
		"RejectEvent":       func() (bool, string) { return k.RejectEvent(ctx, &nostr.Event{PubKey: "aa"}) },
		"RejectFilter":      func() (bool, string) { return k.RejectFilter(ctx, narrowFilter) },
		"RejectCountFilter": func() (bool, string) { return k.RejectCountFilter(ctx, narrowFilter) },
	} {
		if reject, msg := call(); !reject || msg != scan.ReasonUnavailable {
			t.Errorf("%s: (%v, %q), want (true, %q)", name, reject, msg, scan.ReasonUnavailable)
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	if !k.RejectConnection(r) {
		t.Error("RejectConnection admitted while the store is down")
	}
	if got := f.obs[wire.TypeEVENT][policy.Unavailable].Load(); got != 1 {
		t.Errorf("observer: %d unavailable EVENTs, want 1", got)
	}
	if got := f.conns[policy.Unavailable].Load(); got != 1 {
		t.Errorf("observer: %d unavailable connections, want 1", got)
	}

	rh := Rely[string, struct{}](f.h, func(c string) string { return c }, nil)
	err := rh.Event(hookIP, &nostr.Event{PubKey: "aa"})
	if err == nil || err.Error() != scan.ReasonUnavailable {
		t.Fatalf("rely Event: %v, want %q", err, scan.ReasonUnavailable)
	}
	if !errors.Is(err, ratelimit.ErrUnavailable) || errors.Is(err, ErrRateLimited) {
		t.Errorf("rely Event error %v: want ErrUnavailable and not ErrRateLimited", err)
	}
}

// TestHooksNoClient: khatru's own AddEvent runs the hooks with no
// connection; such calls are the relay's, not a client's, and pass free.
func TestHooksNoClient(t *testing.T) {
	f := newHookFixture(t, limitsOf(wire.TypeEVENT, 1.5, time.Second), nil)
	f.store.Down.Store(true) // any charge would be refused
	k := f.h.Khatru(func(context.Context) string { return "" }, nil, nil)
	if reject, msg := k.RejectEvent(context.Background(), &nostr.Event{}); reject {
		t.Fatalf("internal event refused: %q", msg)
	}
}

func TestKhatruRejectConnection(t *testing.T) {
	var l policy.Limits
	l.Connection = []ratelimit.Limit{ratelimit.PerPeriod(2, time.Second)}
	f := newHookFixture(t, l, nil)
	k := f.h.Khatru(ipOf, nil, nil)
	req := func(remote string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", "192.0.2.99") // not believed without RequestIP
		return r
	}
	// One client on different source ports.
	if k.RejectConnection(req("203.0.113.7:1000")) || k.RejectConnection(req("203.0.113.7:1001")) {
		t.Fatal("connection refused within the budget")
	}
	if !k.RejectConnection(req("203.0.113.7:1002")) {
		t.Fatal("third connection from one address admitted past a budget of 2")
	}
	if k.RejectConnection(req("203.0.113.8:1000")) {
		t.Fatal("another address refused")
	}
}

func TestKhatruQuota(t *testing.T) {
	q, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f := newHookFixture(t, policy.Limits{}, q)
	authed := ""
	k := f.h.Khatru(ipOf, nil, func(context.Context) string { return authed })
	if k.OnEventSaved == nil {
		t.Fatal("OnEventSaved is nil with a quota")
	}
	ctx := context.Background()
	actors := nostrtest.ApartPubkeys(q, f.clock.Now(), 2)
	alice, bob := &nostr.Event{PubKey: actors[0]}, &nostr.Event{PubKey: actors[1]}
	for range 2 {
		if reject, msg := k.RejectEvent(ctx, alice); reject {
			t.Fatalf("alice refused within quota: %q", msg)
		}
		k.OnEventSaved(ctx, alice)
	}
	reject, msg := k.RejectEvent(ctx, alice)
	if want := "rate-limited: quota: 2 events per 60s for this pubkey; retry in 60s"; !reject || msg != want {
		t.Fatalf("alice past quota: (%v, %q), want (true, %q)", reject, msg, want)
	}
	if got := f.obs[wire.TypeEVENT][policy.QuotaExceeded].Load(); got != 1 {
		t.Errorf("observer: %d quota refusals, want 1", got)
	}
	if reject, msg := k.RejectEvent(ctx, bob); reject {
		t.Fatalf("bob refused by alice's quota: %q", msg)
	}
	// Authenticated as bob, alice's events are bob's to answer for.
	authed = bob.PubKey
	if reject, msg := k.RejectEvent(ctx, alice); reject {
		t.Fatalf("alice's event from bob's session refused: %q", msg)
	}
	// The next window starts afresh.
	authed = ""
	f.clock.Set(nostrtest.T0.Add(time.Minute))
	if reject, msg := k.RejectEvent(ctx, alice); reject {
		t.Fatalf("alice refused in the next window: %q", msg)
	}
}

func TestKhatruNoQuotaNoSavedHook(t *testing.T) {
	f := newHookFixture(t, policy.Limits{}, nil)
	if k := f.h.Khatru(ipOf, nil, nil); k.OnEventSaved != nil {
		t.Error("OnEventSaved set without a quota: a useless hook on every save")
	}
}

func TestKhatruOverwriteRelayInformation(t *testing.T) {
	var l policy.Limits
	l.Connection = []ratelimit.Limit{ratelimit.PerPeriod(12, time.Second)}
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute)}
	l.Message[wire.TypeAUTH] = []ratelimit.Limit{ratelimit.PerPeriod(5, time.Second)} // no hook sees AUTH
	q, err := ratelimit.NewQuota(600, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f := newHookFixture(t, l, q)
	k := f.h.Khatru(ipOf, nil, nil)
	want := "Rate limits per client (IPv4 address or IPv6 /64), as rate per half-life: " +
		"connections 12/1s; EVENT 10/1s, 240/1m0s; at most 600 saved events per 1m0s per pubkey."
	shared := &nip11.RelayLimitationDocument{MaxSubscriptions: 20}
	info := nip11.RelayInformationDocument{Name: "r", Description: "A relay.", Limitation: shared}
	got := k.OverwriteRelayInformation(context.Background(), httptest.NewRequest("GET", "/", nil), info)
	if got.Description != "A relay.\n\n"+want {
		t.Errorf("description %q, want the relay's and then %q", got.Description, want)
	}
	if got.Name != "r" || got.Limitation != shared || *shared != (nip11.RelayLimitationDocument{MaxSubscriptions: 20}) {
		t.Errorf("document changed beyond its description: %+v", got)
	}
	// Without a limitation object none is made up: its zero fields
	// ("created_at_upper_limit": 0) would tell clients nonsense.
	if got := k.OverwriteRelayInformation(context.Background(), nil, nip11.RelayInformationDocument{}); got.Limitation != nil || got.Description != want {
		t.Errorf("empty document: %+v", got)
	}
	none := newHookFixture(t, policy.Limits{}, nil).h.Khatru(ipOf, nil, nil)
	if got := none.OverwriteRelayInformation(context.Background(), nil, info); got.Description != "A relay." {
		t.Errorf("no limits: description %q, want it unchanged", got.Description)
	}
}

// relyClient stands in for rely.Client.
type relyClient struct{ ip string }

func TestRelyHooks(t *testing.T) {
	var l policy.Limits
	l.Connection = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Second)}
	// Each filter costs one REQ: a burst of 4.5 admits one REQ of three.
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(4.5, time.Second)}
	l.Message[wire.TypeCOUNT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Second)}
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Second)}
	f := newHookFixture(t, l, nil)
	rh := Rely[*relyClient, int](f.h, func(c *relyClient) string { return c.ip }, nil)
	c := &relyClient{ip: hookIP}
	three := nostr.Filters{narrowFilter, narrowFilter, narrowFilter}

	if err := rh.Req(c, three); err != nil {
		t.Fatalf("first REQ: %v", err)
	}
	err := rh.Req(c, three)
	// 3 charged, R=4.5, c=3: wait = 1s·log2(3/1.5) = 1s.
	if !errors.Is(err, ErrRateLimited) || errors.Is(err, ratelimit.ErrUnavailable) || err.Error() != "rate-limited: slow down; retry in 1s" {
		t.Fatalf("second REQ: %v, want a rate-limited refusal, retry in 1s", err)
	}
	if err := rh.Req(c, make(nostr.Filters, wire.DefaultBounds().MaxFilters+1)); err == nil || err.Error() != scan.ReasonFilters+" (at most 10)" {
		t.Errorf("REQ past the filter bound: %v", err)
	}
	if err := rh.Count(c, three); err != nil {
		t.Fatalf("COUNT has a budget of its own: %v", err)
	}
	if err := rh.Event(c, &nostr.Event{}); err != nil {
		t.Fatalf("EVENT: %v", err)
	}
	if err := rh.Event(c, &nostr.Event{}); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("second EVENT: %v", err)
	}

	nip11req := httptest.NewRequest("GET", "/", nil)
	nip11req.Header.Set("Accept", "application/nostr+json")
	for range 3 {
		if err := rh.Connection(0, nip11req); err != nil {
			t.Fatalf("NIP-11 request charged: %v", err)
		}
	}
	up := httptest.NewRequest("GET", "/", nil)
	up.Header.Set("Upgrade", "websocket")
	if err := rh.Connection(0, up); err != nil {
		t.Fatalf("half an upgrade (no Connection: upgrade, which no upgrader accepts) charged: %v", err)
	}
	up.Header.Set("Connection", "keep-alive, Upgrade")
	if err := rh.Connection(0, up); err != nil {
		t.Fatalf("first upgrade: %v", err)
	}
	if err := rh.Connection(0, up); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("second upgrade: %v", err)
	}
}

func TestRelySaveEvent(t *testing.T) {
	q, err := ratelimit.NewQuota(1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f := newHookFixture(t, policy.Limits{}, q)
	rh := Rely[*relyClient, int](f.h, func(c *relyClient) string { return c.ip }, nil)
	c := &relyClient{ip: hookIP}
	evt := &nostr.Event{PubKey: nostrtest.PubkeyN(1)}
	failing := rh.SaveEvent(func(*relyClient, *nostr.Event) error { return errors.New("disk full") })
	if err := failing(c, evt); err == nil {
		t.Fatal("save error swallowed")
	}
	if err := rh.Event(c, evt); err != nil {
		t.Fatalf("an event that was not saved was charged: %v", err)
	}
	ok := rh.SaveEvent(func(*relyClient, *nostr.Event) error { return nil })
	if err := ok(c, evt); err != nil {
		t.Fatal(err)
	}
	if err := rh.Event(c, evt); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("event past quota: %v", err)
	}
}

func TestNewHooksInvalidLimit(t *testing.T) {
	l := limitsOf(wire.TypeEVENT, 1, time.Second) // rate must exceed cost
	if _, err := New(Options{Policy: policy.Config{Limits: &l}}); !errors.Is(err, ratelimit.ErrInvalidLimit) {
		t.Fatalf("NewHooks: %v, want ErrInvalidLimit", err)
	}
}

func countMap(m interface{ Range(func(k, v any) bool) }) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}

// TestKhatruHooksConcurrent runs REQs of three filters from many
// goroutines, as khatru runs each message on a goroutine of its own: each
// filter is charged exactly once, and every ended REQ is forgotten.
func TestKhatruHooksConcurrent(t *testing.T) {
	const workers, reqs = 8, 200
	f := newHookFixture(t, limitsOf(wire.TypeREQ, 1e9, time.Second), nil)
	k := f.h.Khatru(ipOf, nil, nil)
	conn, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	k.OnConnect(conn)
	done := make(chan struct{})
	for w := range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range reqs {
				ctx, cancel := reqCtx(conn, fmt.Sprint(w, ":", i))
				for range 3 {
					if reject, msg := k.RejectFilter(ctx, narrowFilter); reject {
						t.Errorf("REQ refused: %q", msg)
					}
				}
				cancel()
			}
		}()
	}
	for range workers {
		<-done
	}
	if got := f.obs[wire.TypeREQ][policy.Admitted].Load(); got != 3*workers*reqs {
		t.Errorf("%d REQ filters charged, want %d", got, 3*workers*reqs)
	}
	for deadline := time.Now().Add(5 * time.Second); countMap(&f.h.reqs) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d ended REQs still remembered", countMap(&f.h.reqs))
		}
		runtime.Gosched()
	}
	hangUp()
	for deadline := time.Now().Add(5 * time.Second); countMap(&f.h.conns) > 0; {
		if time.Now().After(deadline) {
			t.Fatal("closed connection still remembered")
		}
		runtime.Gosched()
	}
}

// TestHooksAllowList: allow-listed addresses and authenticated pubkeys are
// never charged (the store is down, so any charge would be refused), and an
// allow-listed author exempts only an event that is really theirs.
func TestHooksAllowList(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	pk, err := nostr.GetPublicKey(sk)
	if err != nil {
		t.Fatal(err)
	}
	l := policy.DefaultLimits()
	store := &nostrtest.OutageStore{Store: ratelimit.NewMemoryStore(64)}
	store.Down.Store(true)
	h, err := New(Options{
		Limiter: ratelimit.NewLimiter(store, nil),
		Policy:  policy.Config{Limits: &l, Identity: policy.Identity{AllowIPs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, AllowPubkeys: []string{pk}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := reqCtx(context.Background(), "s")
	defer cancel()
	stranger := &nostr.Event{PubKey: "b0"}

	allowedIP := h.Khatru(func(context.Context) string { return "198.51.100.9:443" }, nil, nil)
	if reject, msg := allowedIP.RejectEvent(ctx, stranger); reject {
		t.Errorf("event from an allow-listed address: %q", msg)
	}
	if reject, msg := allowedIP.RejectFilter(ctx, narrowFilter); reject {
		t.Errorf("REQ from an allow-listed address: %q", msg)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "198.51.100.9:443"
	if allowedIP.RejectConnection(r) {
		t.Error("connection from an allow-listed address refused")
	}

	authed := h.Khatru(ipOf, nil, func(context.Context) string { return pk })
	if reject, msg := authed.RejectCountFilter(ctx, narrowFilter); reject {
		t.Errorf("COUNT of an allow-listed authenticated pubkey: %q", msg)
	}
	if reject, msg := authed.RejectEvent(ctx, stranger); reject {
		t.Errorf("event sent by an allow-listed authenticated pubkey: %q", msg)
	}

	// Nobody is exempt here: the store's outage shows.
	plain := h.Khatru(ipOf, nil, nil)
	if reject, msg := plain.RejectEvent(ctx, stranger); !reject || msg != scan.ReasonUnavailable {
		t.Errorf("stranger's event: (%v, %q), want the outage", reject, msg)
	}

	rh := Rely[*relyClient, int](h, func(c *relyClient) string { return c.ip }, nil)
	c := &relyClient{ip: hookIP}
	signed := nostr.Event{Kind: 1, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: "mine"}
	if err := signed.Sign(sk); err != nil {
		t.Fatal(err)
	}
	// The one rule, as in a Gate: an allow-listed author (no NIP-42) is
	// exempt from the quota only, and still pays the EVENT windows, so a
	// forged author buys nothing; here those windows show the outage.
	if err := rh.Event(c, &signed); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("allow-listed author's signed event: %v, want the EVENT windows charged", err)
	}
	forged := signed
	forged.Content = "not mine" // the signature no longer matches
	if err := rh.Event(c, &forged); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("forged event in an allow-listed author's name: %v, want it charged", err)
	}
}

// TestHooksTier: a call whose NIP-42 pubkey (khatru.GetAuthed) is a tier
// member is charged to that pubkey with the tier's limits, by the same
// compiled policy a gate reads; one in no tier stays on its address.
func TestHooksTier(t *testing.T) {
	member, stranger := strings.Repeat("a", 64), strings.Repeat("c", 64)
	var addr, tierL policy.Limits
	addr.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(2, time.Hour)}
	tierL.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(5, time.Hour)}
	cfg := policy.Config{Limits: &addr, Tiers: []policy.Tier{{Name: "members", Pubkeys: []string{member}, Limits: tierL}}}
	clock := nostrtest.NewClock()
	h, err := New(Options{Limiter: ratelimit.NewLimiter(ratelimit.NewMemoryStore(1<<16), clock.Now), Policy: cfg})
	if err != nil {
		t.Fatal(err)
	}
	count := func(authed string, n int) int {
		k := h.Khatru(ipOf, nil, func(context.Context) string { return authed })
		ok := 0
		for range n {
			if reject, _ := k.RejectEvent(context.Background(), &nostr.Event{PubKey: authed, Kind: 1}); !reject {
				ok++
			}
		}
		return ok
	}
	if got := count(member, 8); got != 5 {
		t.Errorf("member: %d of 8 events passed, want the tier's 5", got)
	}
	if got := count(stranger, 4); got != 2 {
		t.Errorf("a pubkey in no tier: %d of 4 passed, want its address's 2", got)
	}
}

// localQuota is q in process on clock, or nil (no quota) for a nil q.
func localQuota(q *ratelimit.Quota, clock ratelimit.Clock) ratelimit.ActorQuota {
	if q == nil {
		return nil
	}
	return q.WithClock(clock)
}

// narrowFilter is a filter of the least price (policy.ReadCost): one id.
var narrowFilter = nostr.Filter{IDs: []string{"0000000000000000000000000000000000000000000000000000000000000001"}}

// TestKhatruRejectFilterPricesShape: a scrape costs what its shape says,
// ten times a narrow filter under the default table.
func TestKhatruRejectFilterPricesShape(t *testing.T) {
	f := newHookFixture(t, limitsOf(wire.TypeREQ, 25, time.Minute), nil)
	k := f.h.Khatru(ipOf, nil, nil)
	conn, closeConn := context.WithCancel(context.Background())
	defer closeConn()
	k.OnConnect(conn)
	scrape := nostr.Filter{Kinds: []int{1}, Limit: 500}
	for i := range 2 {
		ctx, cancel := reqCtx(conn, fmt.Sprint("sub", i))
		defer cancel()
		if reject, msg := k.RejectFilter(ctx, scrape); reject {
			t.Fatalf("scrape %d refused: %q", i, msg)
		}
	}
	ctx, cancel := reqCtx(conn, "sub2")
	defer cancel()
	if reject, _ := k.RejectFilter(ctx, scrape); !reject {
		t.Fatal("a third scrape of price 10 passed a burst of 25")
	}
}
