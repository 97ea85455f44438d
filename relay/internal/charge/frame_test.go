package charge

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// oneDecisionPolicy: EVENT 5 an hour, reactions (kind 7) 2 an hour, and
// an IPv6 /48 aggregate of 5.5 an hour: room for the five events admitted,
// not for one charge more.
func oneDecisionPolicy(t *testing.T) *Policy {
	t.Helper()
	var l policy.Limits
	l.Message[wire.TypeEVENT] = lims(ratelimit.PerPeriod(5, time.Hour))
	p, err := Compile(policy.Config{
		Limits: &l,
		Kinds: []policy.Class{
			{Name: "reactions", Kinds: [][2]int{{7, 7}}, Limits: lims(ratelimit.PerPeriod(2, time.Hour))},
		},
		Aggregates: []policy.Aggregate{{Bits: 48, Limits: lims(ratelimit.Limit{Rate: 5.5, Period: time.Hour})}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkOneDecision is the black-box test of one frame, one decision: two
// reactions pass, ten more are refused by their class, and the refused
// ones paid nothing — not EVENT's window (three notes pass), nor the
// aggregate's (which would refuse a note had one of them paid it). The
// sixth event is refused by EVENT's window, whose wait is the longer.
func checkOneDecision(t *testing.T, lim *ratelimit.Limiter, s *Subject) {
	t.Helper()
	ctx := context.Background()
	for i := range 2 {
		if v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 7); !v.Pass() {
			t.Fatalf("reaction %d: %+v", i, v)
		}
	}
	for i := range 10 {
		if v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 7); !v.Refused || v.Budget != "kind reactions" {
			t.Fatalf("reaction %d: %+v, want refused by the class", 2+i, v)
		}
	}
	for i := range 3 {
		if v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Pass() {
			t.Fatalf("note %d: %+v: the refused reactions were charged", i, v)
		}
	}
	if v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Refused || v.Budget != "EVENT" {
		t.Fatalf("sixth event: %+v, want refused by EVENT", v)
	}
}

func v6Subject(p *Policy, ip string) *Subject {
	a := netip.MustParseAddr(ip)
	return p.AddressSubject((&Identity{}).ClientFromAddr(a), a, false)
}

func TestOneDecisionMemory(t *testing.T) {
	p := oneDecisionPolicy(t)
	checkOneDecision(t, ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), nil), v6Subject(p, "2001:db8:1:1::1"))
}

// TestOneDecisionRedis runs it on a real Redis, a frame's budgets in one
// script call, with and without batching. (miniredis cannot run the
// decision script: it has no struct library.)
func TestOneDecisionRedis(t *testing.T) {
	srv := redistest.Start(t)
	for _, batch := range []int{0, 16} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			c, err := redisstore.NewClient(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			st, err := redisstore.New(c, redisstore.Options{Prefix: fmt.Sprintf("b%d:", batch), Timeout: 2 * time.Second, Batch: batch})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			checkOneDecision(t, ratelimit.NewLimiter(st, nil), v6Subject(oneDecisionPolicy(t), "2001:db8:1:1::1"))
		})
	}
}

// TestOneDecisionCluster runs it on a real three-master cluster with a
// client whose aggregate's key is on another master than its own keys:
// the frame is decided by two masters at once, and a refusal by the class
// refunds what the aggregate's master wrote.
func TestOneDecisionCluster(t *testing.T) {
	var addrs []string
	for _, s := range redistest.StartCluster(t) {
		addrs = append(addrs, s.Addr())
	}
	c, err := redisstore.NewClient("redis+cluster://" + strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cc := c.(*redis.ClusterClient)
	ctx := context.Background()
	master := func(key string) string {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	p := oneDecisionPolicy(t)
	var s *Subject
	for i := 1; s == nil; i++ {
		x := v6Subject(p, fmt.Sprintf("2001:db8:%x:1::1", i))
		own, agg := master(x.msg[wire.TypeEVENT]), master(x.aggs[0].msg)
		if own != agg && own == master(x.class[0]) {
			s = x
		}
		if i > 1000 {
			t.Fatal("no address with its aggregate on another master")
		}
	}
	st, err := redisstore.New(cc, redisstore.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	checkOneDecision(t, ratelimit.NewLimiter(st, nil), s)
}
