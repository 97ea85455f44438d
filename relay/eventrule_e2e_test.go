//go:build !race

package relay

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fiatjaf/khatru"
	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/hooks"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// The EVENT rule (charge.Subject.Event) is one, and so is its table: each
// case runs against a gate in front of khatru (Wrap and Proxy) and against
// khatru with the hooks, from a real client, and must get the same reply
// (OK and its reason), the same outcome from the Observer, and the same
// charges to the actor quota (on the relay's OK through a gate, after the
// save with the hooks).

// Names of the keys a case uses; each is a fresh key, all in different
// slots of the quota.
const (
	keyA       = "a"
	keyB       = "b"
	keyAllowed = "allowed" // allow-listed by pubkey
	keyMember  = "member"  // in the tier "members"
)

var eventKeyNames = []string{keyA, keyB, keyAllowed, keyMember}

// eventStep is one EVENT, by the key named by, and what it must get: OK
// true when reason is "", else OK false with reason; and the outcome the
// Observer is told.
type eventStep struct {
	by     string
	reason string
	out    policy.Outcome
}

type eventCase struct {
	name string
	// cfg is the policy, given each key's pubkey and the quota.
	cfg func(pk map[string]string, q ratelimit.ActorQuota) policy.Config
	// auth names the key the connection proves (NIP-42) first; "" none.
	auth string
	// storeDown, quotaDown: the limiter's store, the quota, fail.
	storeDown, quotaDown bool
	steps                []eventStep
	// charged is how often each key was charged to the quota, by name.
	charged map[string]int
}

// quotaRefusal is a quota of 2 a minute refusing at a minute's start.
const quotaRefusal = "rate-limited: quota: 2 events per 60s for this pubkey; retry in 60s"

// windowRefusal is eventWindows(n) refusing after their burst of n, on a
// clock that stands still: a wait that is not the quota's.
var windowRefusal = map[float64]string{
	2: "rate-limited: slow down; retry in 3600s",
	3: "rate-limited: slow down; retry in 2106s",
}

// eventWindows are EVENT windows of n an hour, which admit n at once.
func eventWindows(n float64) *policy.Limits {
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(n, time.Hour)}
	return &l
}

func eventCases() []eventCase {
	ok := func(by string) eventStep { return eventStep{by: by, out: policy.Admitted} }
	allowed := func(by string) eventStep { return eventStep{by: by, out: policy.Allowlisted} }
	quota := func(by string) eventStep { return eventStep{by, quotaRefusal, policy.QuotaExceeded} }
	windows := func(n float64, by string) eventStep { return eventStep{by, windowRefusal[n], policy.RateLimited} }
	down := func(by string) eventStep { return eventStep{by, scan.ReasonUnavailable, policy.Unavailable} }
	allowList := func(cidrs []string, pks ...string) policy.Identity {
		id := policy.Identity{AllowPubkeys: pks}
		for _, c := range cidrs {
			id.AllowIPs = append(id.AllowIPs, netip.MustParsePrefix(c))
		}
		return id
	}
	return []eventCase{{
		name: "unauthenticated: the author's quota",
		cfg: func(_ map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: &policy.Limits{}, Quota: q}
		},
		steps:   []eventStep{ok(keyA), ok(keyA), quota(keyA), ok(keyB)},
		charged: map[string]int{keyA: 2, keyB: 1},
	}, {
		name: "quota before windows",
		cfg: func(_ map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: eventWindows(3), Quota: q}
		},
		// The quota answers from memory first, and its refusal charges
		// the windows nothing: their third admission is B's.
		steps:   []eventStep{ok(keyA), ok(keyA), quota(keyA), ok(keyB), windows(3, keyB)},
		charged: map[string]int{keyA: 2, keyB: 1},
	}, {
		name: "allow-listed author: exempt from the quota, not the windows",
		cfg: func(pk map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: eventWindows(3), Quota: q, Identity: allowList(nil, pk[keyAllowed])}
		},
		steps:   []eventStep{allowed(keyAllowed), allowed(keyAllowed), allowed(keyAllowed), windows(3, keyAllowed)},
		charged: map[string]int{},
	}, {
		name: "allow-listed author, store unavailable",
		cfg: func(pk map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: eventWindows(3), Quota: q, Identity: allowList(nil, pk[keyAllowed])}
		},
		storeDown: true,
		steps:     []eventStep{down(keyAllowed)},
		charged:   map[string]int{},
	}, {
		name: "allow-listed address",
		cfg: func(_ map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: eventWindows(2), Quota: q, Identity: allowList([]string{"127.0.0.0/8"})}
		},
		storeDown: true,
		steps:     []eventStep{allowed(keyA), allowed(keyA), allowed(keyA)},
		charged:   map[string]int{},
	}, {
		name: "authenticated as an allow-listed pubkey",
		cfg: func(pk map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: eventWindows(2), Quota: q, Identity: allowList(nil, pk[keyAllowed])}
		},
		auth:    keyAllowed,
		steps:   []eventStep{allowed(keyA), allowed(keyA), allowed(keyA)},
		charged: map[string]int{},
	}, {
		name: "authenticated: the session's quota, whoever the author",
		cfg: func(_ map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: &policy.Limits{}, Quota: q}
		},
		auth:    keyB,
		steps:   []eventStep{ok(keyA), ok(keyA), quota(keyB)},
		charged: map[string]int{keyB: 2},
	}, {
		name: "authenticated tier member: the tier's windows and quota",
		cfg: func(pk map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: eventWindows(2), Tiers: []policy.Tier{{
				Name: "members", Pubkeys: []string{pk[keyMember]}, Limits: *eventWindows(4), Quota: q,
			}}}
		},
		auth:    keyMember,
		steps:   []eventStep{ok(keyA), ok(keyA), quota(keyA)},
		charged: map[string]int{keyMember: 2},
	}, {
		name: "shadow: the windows pass, the quota refuses",
		cfg: func(_ map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: eventWindows(2), Quota: q, Shadow: true}
		},
		steps:   []eventStep{ok(keyA), ok(keyA), quota(keyA), {keyB, "", policy.Shadowed}},
		charged: map[string]int{keyA: 2, keyB: 1},
	}, {
		name: "store unavailable",
		cfg: func(_ map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: eventWindows(100), Quota: q}
		},
		storeDown: true,
		steps:     []eventStep{down(keyA)},
		charged:   map[string]int{},
	}, {
		name: "quota unavailable",
		cfg: func(_ map[string]string, q ratelimit.ActorQuota) policy.Config {
			return policy.Config{Limits: eventWindows(100), Quota: q}
		},
		quotaDown: true,
		steps:     []eventStep{down(keyA)},
		charged:   map[string]int{},
	}}
}

func TestE2EEventRule(t *testing.T) {
	for _, tc := range eventCases() {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []string{"wrap", "proxy", "hooks"} {
				t.Run(mode, func(t *testing.T) { runEventCase(t, tc, mode) })
			}
		})
	}
}

// tableQuota is an actor quota that counts its charges per actor and can
// fail.
type tableQuota struct {
	ratelimit.ActorQuota
	down atomic.Bool
	mu   sync.Mutex
	adds map[string]int
}

func (q *tableQuota) Exceeded(ctx context.Context, actor string) (bool, time.Duration, error) {
	if q.down.Load() {
		return false, 0, fmt.Errorf("test: %w", ratelimit.ErrUnavailable)
	}
	return q.ActorQuota.Exceeded(ctx, actor)
}

func (q *tableQuota) Add(ctx context.Context, actor, id string, createdAt int64) (bool, error) {
	q.mu.Lock()
	q.adds[actor]++
	q.mu.Unlock()
	return q.ActorQuota.Add(ctx, actor, id, createdAt)
}

func runEventCase(t *testing.T, tc eventCase, mode string) {
	clk := nostrtest.NewClock()
	clk.Set(time.Now().Truncate(time.Minute)) // NIP-42 checks created_at; the quota's window starts here
	base, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	q := &tableQuota{ActorQuota: base.WithClock(clk.Now), adds: map[string]int{}}
	sk, pk := map[string]string{}, map[string]string{}
	for i, k := range nostrtest.ApartKeys(base, clk.Now(), len(eventKeyNames)) {
		sk[eventKeyNames[i]] = k
		pk[eventKeyNames[i]], _ = nostr.GetPublicKey(k)
	}
	store := &nostrtest.OutageStore{Store: ratelimit.NewMemoryStore(1 << 16)}
	lim := ratelimit.NewLimiter(store, clk.Now)
	var mu sync.Mutex
	var outs []policy.Outcome
	obs := &policy.Observer{Frame: func(_ string, typ wire.Type, o policy.Outcome) {
		if typ == wire.TypeEVENT {
			mu.Lock()
			outs = append(outs, o)
			mu.Unlock()
		}
	}}
	cfg := tc.cfg(pk, q)

	kr := newKhatru(t)
	kr.OnConnect = append(kr.OnConnect, khatru.RequestAuth)
	var url string
	if mode == "hooks" {
		h, err := hooks.New(hooks.Options{Limiter: lim, Policy: cfg, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		k := h.Khatru(func(ctx context.Context) string { return khatru.GetConnection(ctx).Request.RemoteAddr }, nil, khatru.GetAuthed)
		kr.RejectConnection = append(kr.RejectConnection, k.RejectConnection)
		kr.OnConnect = append(kr.OnConnect, k.OnConnect)
		kr.RejectEvent = append(kr.RejectEvent, k.RejectEvent)
		kr.RejectFilter = append(kr.RejectFilter, k.RejectFilter)
		kr.RejectCountFilter = append(kr.RejectCountFilter, k.RejectCountFilter)
		if k.OnEventSaved != nil {
			kr.OnEventSaved = append(kr.OnEventSaved, k.OnEventSaved)
		}
		url = serve(t, kr)
	} else {
		url = serveSelf(t, Options{Limiter: lim, Policy: cfg, Observer: obs}, func(g *Gate) http.Handler {
			if mode == "wrap" {
				return g.Wrap(kr)
			}
			h, err := g.Proxy(serve(t, kr))
			if err != nil {
				t.Fatal(err)
			}
			return h
		})
	}

	c, challenge := authConn(t, url)
	if tc.auth != "" {
		f, id := signedAuth(t, sk[tc.auth], challenge, url, time.Now())
		if got := send(t, c, []byte(f)); strings.TrimSpace(got) != okFor(id, true, "") {
			t.Fatalf("AUTH as %s answered %s", tc.auth, got)
		}
	}
	store.Down.Store(tc.storeDown)
	q.down.Store(tc.quotaDown)
	for i, st := range tc.steps {
		ev := nostrtest.Note(t, sk[st.by], fmt.Sprint(tc.name, " ", i))
		got := send(t, c, eventFrameOf(t, ev))
		var env nostr.OKEnvelope
		if err := env.FromJSON(got); err != nil || env.EventID != ev.ID {
			t.Fatalf("step %d (%s): answered %s, want its OK", i, st.by, got)
		}
		if env.OK != (st.reason == "") || env.Reason != st.reason {
			t.Errorf("step %d (%s): OK %v %q, want reason %q", i, st.by, env.OK, env.Reason, st.reason)
		}
		mu.Lock()
		if len(outs) != i+1 || outs[i] != st.out {
			t.Errorf("step %d (%s): outcomes %v, want %v last", i, st.by, outs, st.out)
		}
		mu.Unlock()
	}
	_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))

	got := map[string]int{}
	q.mu.Lock()
	for actor, n := range q.adds {
		name := actor
		for k, p := range pk {
			if p == actor {
				name = k
			}
		}
		got[name] = n
	}
	q.mu.Unlock()
	if fmt.Sprint(got) != fmt.Sprint(tc.charged) {
		t.Errorf("quota charged %v, want %v", got, tc.charged)
	}
}
