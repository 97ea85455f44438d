package charge

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// A REQ's filter count is bounded by Bounds alone; a tight REQ window caps
// the REQ's price at what it admits from rest instead of refusing REQs of
// several filters.
func TestMaxFiltersIsTheBound(t *testing.T) {
	req := func(max int, ls ...ratelimit.Limit) policy.Config {
		var l policy.Limits
		l.Message[wire.TypeREQ] = ls
		return policy.Config{Limits: &l, Bounds: wire.Bounds{MaxFilters: max}}
	}
	for _, tc := range []struct {
		cfg  policy.Config
		want int
	}{
		{req(0), wire.DefaultBounds().MaxFilters},
		{policy.Config{}, wire.DefaultBounds().MaxFilters},
		{req(50, ratelimit.Limit{Rate: 1.5, Period: time.Second}), 50},
		{req(3, ratelimit.Limit{Rate: 20, Period: time.Second, Cost: 2}), 3},
	} {
		p, err := Compile(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.MaxFilters(); got != tc.want {
			t.Errorf("MaxFilters under %+v = %d, want %d", tc.cfg.Bounds, got, tc.want)
		}
	}
	// Under rate 1.5 the dearest REQ costs 1 (1·1 < 1.5), so 50 filters are
	// admissible from rest.
	p, err := Compile(req(50, ratelimit.Limit{Rate: 1.5, Period: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	if top := len(p.budget.priced[wire.TypeREQ]) - 1; top != 1 {
		t.Errorf("dearest REQ price under rate 1.5 = %d, want 1", top)
	}
}

// TestCompile: the compiled windows are the configured ones, a REQ of n
// filters costs n REQs in every window, and an invalid limit is refused
// with the type named.
func TestCompile(t *testing.T) {
	l := policy.DefaultLimits()
	p, err := Compile(policy.Config{Limits: &l})
	if err != nil {
		t.Fatal(err)
	}
	if p.MaxFilters() != wire.DefaultBounds().MaxFilters {
		t.Errorf("MaxFilters = %d", p.MaxFilters())
	}
	if !p.budget.msg[wire.TypeCLOSE].empty() || p.budget.msg[wire.TypeOther].empty() || p.budget.msg[wire.TypeEVENT].empty() {
		t.Error("CLOSE must be free, OTHER and EVENT charged")
	}
	if got := p.Message(wire.TypeEVENT); got.Len() != 2 || got.Limit(0) != l.Message[wire.TypeEVENT][0] {
		t.Errorf("EVENT windows %v", got)
	}
	for n := 1; n <= p.MaxFilters(); n++ {
		w := p.budget.priced[wire.TypeREQ][n].enforce
		for i, lim := range l.Message[wire.TypeREQ] {
			if got := w.Limit(i); got.Rate != lim.Rate || got.Period != lim.Period || got.Cost != float64(n)*lim.EffectiveCost() {
				t.Errorf("REQ of %d filters, window %d: %+v", n, i, got)
			}
		}
	}
	if p.Connection().Len() != len(l.Connection) {
		t.Errorf("connection windows %v", p.Connection())
	}
	l.Message[wire.TypeCOUNT] = []ratelimit.Limit{ratelimit.PerPeriod(1, time.Second)}
	if _, err := Compile(policy.Config{Limits: &l}); !errors.Is(err, ratelimit.ErrInvalidLimit) || !strings.Contains(err.Error(), "COUNT") {
		t.Errorf("Compile with COUNT rate = cost: %v, want ErrInvalidLimit naming COUNT", err)
	}
}

// t0 is a fixed instant; the limiter's clock stands there, so nothing
// decays and every wait is exact.
var t0 = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

func frozenLimiter() *ratelimit.Limiter {
	return ratelimit.NewLimiter(ratelimit.NewMemoryStore(1<<16), func() time.Time { return t0 })
}

func lims(ls ...ratelimit.Limit) []ratelimit.Limit { return ls }

// TestKindClasses: an EVENT of a kind in a class pays the class's windows
// besides EVENT's, keyed by the class name; a kind in no class pays
// EVENT's alone.
func TestKindClasses(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeEVENT] = lims(ratelimit.PerPeriod(10, time.Hour))
	p, err := Compile(policy.Config{Limits: &l, Kinds: []policy.Class{
		{Name: "reactions", Kinds: [][2]int{{7, 7}}, Limits: lims(ratelimit.PerPeriod(2, time.Hour))},
		{Name: "ephemeral", Kinds: [][2]int{{20000, 29999}}, Limits: lims(ratelimit.PerPeriod(3, time.Hour))},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if p.ClassOf(7) != "reactions" || p.ClassOf(25000) != "ephemeral" || p.ClassOf(1) != "" {
		t.Fatalf("classes: 7→%q 25000→%q 1→%q", p.ClassOf(7), p.ClassOf(25000), p.ClassOf(1))
	}
	lim := frozenLimiter()
	s := p.AddressSubject("198.51.100.1", netip.MustParseAddr("198.51.100.1"), false)
	ctx := context.Background()
	for i := range 2 {
		if v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 7); !v.Pass() {
			t.Fatalf("reaction %d: %+v", i, v)
		}
	}
	v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 7)
	if !v.Refused || v.Budget != "kind reactions" {
		t.Fatalf("third reaction: %+v, want refused by the class", v)
	}
	// The class's refusal charged nothing, EVENT's window included (2 of
	// 10): eight notes are left, then EVENT's window refuses.
	for i := range 8 {
		if v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Pass() {
			t.Fatalf("note %d: %+v", i, v)
		}
	}
	if v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Refused || v.Budget != "EVENT" {
		t.Fatalf("eleventh EVENT: %+v, want refused by EVENT", v)
	}
	// Another client's reactions are its own.
	o := p.AddressSubject("198.51.100.2", netip.MustParseAddr("198.51.100.2"), false)
	if v := o.Charge(ctx, lim, wire.TypeEVENT, 0, 7); !v.Pass() {
		t.Fatalf("another client's reaction: %+v", v)
	}
	for _, bad := range [][]policy.Class{
		{{Name: "a b", Kinds: [][2]int{{1, 1}}, Limits: lims(ratelimit.PerPeriod(2, time.Second))}},
		{{Name: "a", Kinds: [][2]int{{5, 1}}, Limits: lims(ratelimit.PerPeriod(2, time.Second))}},
		{{Name: "a", Kinds: [][2]int{{1, 70000}}, Limits: lims(ratelimit.PerPeriod(2, time.Second))}},
		{{Name: "a", Kinds: [][2]int{{1, 9}}, Limits: lims(ratelimit.PerPeriod(2, time.Second))}, {Name: "b", Kinds: [][2]int{{9, 9}}, Limits: lims(ratelimit.PerPeriod(2, time.Second))}},
		{{Name: "a", Kinds: [][2]int{{1, 1}}}},
	} {
		if _, err := Compile(policy.Config{Kinds: bad}); !errors.As(err, new(*policy.FieldError)) {
			t.Errorf("Compile(%+v) = %v, want a FieldError", bad, err)
		}
	}
}

// TestTiers: a member pubkey is charged to its own budget with its tier's
// limits; a pubkey in no tier has no member budget; a tier of zero Limits
// limits nothing but is still its members' budget.
func TestTiers(t *testing.T) {
	member, free, stranger := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)
	var addr, tierL policy.Limits
	addr.Message[wire.TypeEVENT] = lims(ratelimit.PerPeriod(2, time.Hour))
	tierL.Message[wire.TypeEVENT] = lims(ratelimit.PerPeriod(5, time.Hour))
	p, err := Compile(policy.Config{Limits: &addr, Tiers: []policy.Tier{
		{Name: "members", Pubkeys: []string{member}, Limits: tierL},
		{Name: "open", Pubkeys: []string{free}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if p.MemberSubject(stranger) != nil || p.TierOf(stranger) != "" {
		t.Fatal("a pubkey in no tier has a member budget")
	}
	lim := frozenLimiter()
	ctx := context.Background()
	m := p.MemberSubject(member)
	if name, ok := m.Member(); !ok || name != "members" {
		t.Fatalf("member subject: %q %v", name, ok)
	}
	for i := range 5 {
		if v := m.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Pass() {
			t.Fatalf("member event %d: %+v", i, v)
		}
	}
	if v := m.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Refused {
		t.Fatalf("sixth member event: %+v, want the tier's 5", v)
	}
	// The member's budget is not its address's: the address still has 2.
	a := p.AddressSubject("198.51.100.1", netip.MustParseAddr("198.51.100.1"), false)
	for i := range 2 {
		if v := a.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Pass() {
			t.Fatalf("address event %d: %+v", i, v)
		}
	}
	f := p.MemberSubject(free)
	if f.Free() || f.Charged(wire.TypeEVENT) || f.Quota() != nil {
		t.Fatal("a tier of zero Limits is charged, or is taken for the allow-list")
	}
	for range 10 {
		if v := f.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Pass() || v.Allowlisted {
			t.Fatalf("member of a tier of zero Limits: %+v, want admitted uncharged", v)
		}
	}
	if _, err := Compile(policy.Config{Tiers: []policy.Tier{{Name: "x", Pubkeys: []string{"AA"}}}}); !errors.As(err, new(*policy.FieldError)) {
		t.Errorf("a bad pubkey: %v", err)
	}
	if _, err := Compile(policy.Config{Tiers: []policy.Tier{{Name: "x", Pubkeys: []string{member}}, {Name: "y", Pubkeys: []string{member}}}}); !errors.As(err, new(*policy.FieldError)) {
		t.Errorf("a pubkey in two tiers: %v", err)
	}
}

// TestAggregates: addresses rotating inside one IPv6 /48 (or IPv4 /24)
// share the prefix's windows; another prefix has its own.
func TestAggregates(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeEVENT] = lims(ratelimit.PerPeriod(100, time.Hour))
	p, err := Compile(policy.Config{Limits: &l, Aggregates: []policy.Aggregate{
		{Bits: 48, Limits: lims(ratelimit.PerPeriod(3, time.Hour))},
		{Bits: 24, V4: true, Limits: lims(ratelimit.PerPeriod(2, time.Hour))},
	}})
	if err != nil {
		t.Fatal(err)
	}
	lim := frozenLimiter()
	ctx := context.Background()
	id := &Identity{}
	sub := func(ip string) *Subject {
		a := netip.MustParseAddr(ip)
		return p.AddressSubject(id.ClientFromAddr(a), a, false)
	}
	// Three /64s of one /48: one event each passes, the fourth /64 is
	// refused by the prefix.
	for i, ip := range []string{"2001:db8:1:1::1", "2001:db8:1:2::1", "2001:db8:1:3::1"} {
		if v := sub(ip).Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Pass() {
			t.Fatalf("/64 %d: %+v", i, v)
		}
	}
	v := sub("2001:db8:1:4::1").Charge(ctx, lim, wire.TypeEVENT, 0, 1)
	if !v.Refused || v.Budget != "prefix 2001:db8:1::/48" {
		t.Fatalf("fourth /64 of the /48: %+v", v)
	}
	if v := sub("2001:db8:2::1").Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Pass() {
		t.Fatalf("another /48: %+v", v)
	}
	for i, ip := range []string{"192.0.2.1", "192.0.2.2"} {
		if v := sub(ip).Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Pass() {
			t.Fatalf("IPv4 %d: %+v", i, v)
		}
	}
	if v := sub("192.0.2.3").Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Refused || v.Budget != "prefix 192.0.2.0/24" {
		t.Fatalf("third address of the /24: %+v", v)
	}
	// Upgrades are charged to the prefix's windows for upgrades, apart
	// from its messages: two from the spent /24 pass, the third does not.
	for i, ip := range []string{"192.0.2.9", "192.0.2.10"} {
		if v := sub(ip).ChargeConnection(ctx, lim); !v.Pass() {
			t.Fatalf("upgrade %d from the /24: %+v", i, v)
		}
	}
	if v := sub("192.0.2.11").ChargeConnection(ctx, lim); !v.Refused || v.Budget != "prefix 192.0.2.0/24" {
		t.Fatalf("third upgrade from the /24: %+v", v)
	}
	if _, err := Compile(policy.Config{Aggregates: []policy.Aggregate{{Bits: 128, Limits: lims(ratelimit.PerPeriod(3, time.Hour))}}}); !errors.As(err, new(*policy.FieldError)) {
		t.Errorf("a /128 aggregate: %v", err)
	}
}

// TestShadow: a window in shadow decides and stores as usual but never
// refuses: the verdict says it would have, and when it did not its
// score was written; mode shadow does this for every window.
func TestShadow(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeEVENT] = lims(ratelimit.PerPeriod(100, time.Hour), ratelimit.Limit{Rate: 2, Period: time.Minute, Shadow: true})
	p, err := Compile(policy.Config{Limits: &l})
	if err != nil {
		t.Fatal(err)
	}
	lim := frozenLimiter()
	ctx := context.Background()
	s := p.AddressSubject("198.51.100.1", netip.MustParseAddr("198.51.100.1"), false)
	for i := range 2 {
		if v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Pass() || v.Shadow {
			t.Fatalf("event %d: %+v", i, v)
		}
	}
	v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 1)
	if !v.Pass() || !v.Shadow || v.ShadowWait <= 0 || v.Budget != "EVENT" {
		t.Fatalf("third event: %+v, want passed with a shadow refusal", v)
	}
	// The enforcing window kept counting: 97 more pass, then it refuses.
	for range 97 {
		s.Charge(ctx, lim, wire.TypeEVENT, 0, 1)
	}
	if v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 1); !v.Refused {
		t.Fatalf("101st event: %+v, want refused by the enforcing window", v)
	}

	all, err := Compile(policy.Config{Limits: &l, Shadow: true})
	if err != nil {
		t.Fatal(err)
	}
	s = all.AddressSubject("198.51.100.2", netip.MustParseAddr("198.51.100.2"), false)
	shadowed := 0
	for range 150 {
		v := s.Charge(ctx, lim, wire.TypeEVENT, 0, 1)
		if !v.Pass() {
			t.Fatalf("mode shadow refused: %+v", v)
		}
		if v.Shadow {
			shadowed++
		}
	}
	if shadowed != 148 {
		t.Errorf("mode shadow: %d of 150 would have been refused, want 148 (the 2/1m window's burst is 2)", shadowed)
	}
}
