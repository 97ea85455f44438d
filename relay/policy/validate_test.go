package policy_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// paths returns the paths of the FieldErrors err joins, in order; it fails
// the test on anything else in the join.
func paths(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("%v is not a join", err)
	}
	var out []string
	for _, e := range j.Unwrap() {
		fe, ok := e.(*policy.FieldError)
		if !ok {
			t.Fatalf("%T %v is not a *policy.FieldError", e, e)
		}
		if fe.Error() != fe.Path+": "+fe.Err.Error() {
			t.Errorf("Error() = %q", fe.Error())
		}
		out = append(out, fe.Path)
	}
	return out
}

const pk = "6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93"

func win(rate float64, period time.Duration) ratelimit.Limit {
	return ratelimit.PerPeriod(rate, period)
}

// TestValidateEachField: one bad field, one error, at its path.
func TestValidateEachField(t *testing.T) {
	ok := []ratelimit.Limit{win(5, time.Second)}
	tests := []struct {
		name string
		cfg  policy.Config
		want string
	}{
		{"connection window", policy.Config{Limits: &policy.Limits{Connection: []ratelimit.Limit{win(1, time.Second)}}}, "Limits.Connection[0]"},
		{"second message window", func() policy.Config {
			var l policy.Limits
			l.Message[wire.TypeEVENT] = []ratelimit.Limit{win(5, time.Second), win(5, 0)}
			return policy.Config{Limits: &l}
		}(), "Limits.Message[EVENT][1]"},
		{"a period twice", func() policy.Config {
			var l policy.Limits
			l.Message[wire.TypeREQ] = []ratelimit.Limit{win(5, time.Second), win(9, 1000*time.Millisecond)}
			return policy.Config{Limits: &l}
		}(), "Limits.Message[REQ][1]"},
		{"bound", policy.Config{Bounds: wire.Bounds{MaxFanout: -1}}, "Bounds.MaxFanout"},
		{"class name", policy.Config{Kinds: []policy.Class{{Name: "a b", Kinds: [][2]int{{1, 1}}, Limits: ok}}}, "Kinds[0].Name"},
		{"class range", policy.Config{Kinds: []policy.Class{{Name: "a", Kinds: [][2]int{{0, 0}, {9, 1}}, Limits: ok}}}, "Kinds[0].Kinds[1]"},
		{"kind in two classes", policy.Config{Kinds: []policy.Class{
			{Name: "a", Kinds: [][2]int{{1, 9}}, Limits: ok},
			{Name: "b", Kinds: [][2]int{{9, 9}}, Limits: ok}}}, "Kinds[1].Kinds[0]"},
		{"class without limits", policy.Config{Kinds: []policy.Class{{Name: "a", Kinds: [][2]int{{1, 1}}}}}, "Kinds[0].Limits"},
		{"class window", policy.Config{Kinds: []policy.Class{{Name: "a", Kinds: [][2]int{{1, 1}}, Limits: []ratelimit.Limit{win(1, time.Second)}}}}, "Kinds[0].Limits[0]"},
		{"tier pubkey upper case", policy.Config{Tiers: []policy.Tier{{Name: "t", Pubkeys: []string{strings.ToUpper(pk)}}}}, "Tiers[0].Pubkeys[0]"},
		{"pubkey in two tiers", policy.Config{Tiers: []policy.Tier{{Name: "t", Pubkeys: []string{pk}}, {Name: "u", Pubkeys: []string{pk}}}}, "Tiers[1].Pubkeys[0]"},
		{"tier window", func() policy.Config {
			var l policy.Limits
			l.Message[wire.TypeCOUNT] = []ratelimit.Limit{win(1, time.Second)}
			return policy.Config{Tiers: []policy.Tier{{Name: "t", Limits: l}}}
		}(), "Tiers[0].Limits.Message[COUNT][0]"},
		{"aggregate as narrow as a client", policy.Config{Aggregates: []policy.Aggregate{{Bits: 64, Limits: ok}}}, "Aggregates[0].Bits"},
		{"aggregate twice", policy.Config{Aggregates: []policy.Aggregate{{Bits: 48, Limits: ok}, {Bits: 48, Limits: ok}}}, "Aggregates[1].Bits"},
		{"IPv4 aggregate of one address", policy.Config{Aggregates: []policy.Aggregate{{Bits: 32, V4: true, Limits: ok}}}, "Aggregates[0].Bits"},
		{"aggregate without limits", policy.Config{Aggregates: []policy.Aggregate{{Bits: 48}}}, "Aggregates[0].Limits"},
		{"ipv6 prefix", policy.Config{Identity: policy.Identity{IPv6Prefix: 129}}, "Identity.IPv6Prefix"},
		{"mapped proxy", policy.Config{Identity: policy.Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}}}, "Identity.TrustedProxies[0]"},
		{"header", policy.Config{Identity: policy.Identity{Header: "X Forwarded"}}, "Identity.Header"},
		{"allowed network with host bits", policy.Config{Identity: policy.Identity{AllowIPs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.2.3/8")}}}, "Identity.AllowIPs[1]"},
		{"allowed pubkey", policy.Config{Identity: policy.Identity{AllowPubkeys: []string{pk, pk[:63]}}}, "Identity.AllowPubkeys[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := paths(t, tt.cfg.Validate()); !slices.Equal(got, []string{tt.want}) {
				t.Errorf("paths %q, want [%s]", got, tt.want)
			}
		})
	}
}

// TestValidateJoinsAll: every bad field is reported, not the first alone,
// and a refused window keeps ratelimit's error.
func TestValidateJoinsAll(t *testing.T) {
	var l policy.Limits
	l.Connection = []ratelimit.Limit{win(1, time.Second)}
	l.Message[wire.TypeOther] = []ratelimit.Limit{win(20, time.Second), win(3, -time.Second)}
	cfg := policy.Config{
		Limits:   &l,
		Bounds:   wire.Bounds{MaxTags: -1},
		Identity: policy.Identity{IPv6Prefix: -1, AllowPubkeys: []string{"npub1x"}},
	}
	err := cfg.Validate()
	want := []string{"Limits.Connection[0]", "Limits.Message[OTHER][1]", "Bounds.MaxTags", "Identity.IPv6Prefix", "Identity.AllowPubkeys[0]"}
	if got := paths(t, err); !slices.Equal(got, want) {
		t.Errorf("paths\n got %q\nwant %q", got, want)
	}
	if !errors.Is(err, ratelimit.ErrInvalidLimit) {
		t.Errorf("%v does not wrap ratelimit.ErrInvalidLimit", err)
	}
	var fe *policy.FieldError
	if !errors.As(err, &fe) || fe.Path != "Limits.Connection[0]" || !strings.Contains(fe.Err.Error(), "rate 1 must be greater than cost 1") {
		t.Errorf("first FieldError %+v", fe)
	}
}

// TestValidateManyWindows: the window past ratelimit.MaxWindows is named
// once, and those after it are not judged one by one.
func TestValidateManyWindows(t *testing.T) {
	var l policy.Limits
	for i := range 100 {
		l.Message[wire.TypeREQ] = append(l.Message[wire.TypeREQ], win(5, time.Duration(i+1)*time.Second))
	}
	l.Message[wire.TypeREQ][50].Rate = 0 // past the bound: not judged
	got := paths(t, (&policy.Config{Limits: &l}).Validate())
	if want := []string{"Limits.Message[REQ][8]"}; !slices.Equal(got, want) {
		t.Errorf("paths %q, want %q", got, want)
	}
}

// TestValidateGood: the zero Config, the defaults spelled out, and a
// policy using every section are valid.
func TestValidateGood(t *testing.T) {
	def := policy.DefaultLimits()
	ok := []ratelimit.Limit{win(5, time.Second)}
	for _, cfg := range []policy.Config{
		{},
		{Limits: &def},
		{Limits: &policy.Limits{}},
		{
			Bounds:     wire.Bounds{MaxFilters: 3, MaxTags: 10},
			Kinds:      []policy.Class{{Name: "dm", Kinds: [][2]int{{4, 4}, {1059, 1059}}, Limits: ok}},
			Tiers:      []policy.Tier{{Name: "paid", Pubkeys: []string{pk}}},
			Aggregates: []policy.Aggregate{{Bits: 48, Limits: ok}, {Bits: 24, V4: true, Limits: ok}},
			Identity: policy.Identity{IPv6Prefix: 56, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Header: "X-Real-IP",
				AllowIPs: []netip.Prefix{netip.MustParsePrefix("203.0.113.7/32")}, AllowPubkeys: []string{strings.ToUpper(pk)}},
		},
	} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", cfg, err)
		}
	}
}

// TestOutcomeNames: every outcome and cut reason has a label of its own,
// and the one past the last is "unknown" (arrays are sized by the last).
func TestOutcomeNames(t *testing.T) {
	seen := map[string]bool{}
	for o := policy.Outcome(0); o <= policy.Unanswered; o++ {
		if s := o.String(); s == "unknown" || seen[s] {
			t.Errorf("Outcome(%d) = %q", o, s)
		} else {
			seen[s] = true
		}
	}
	if s := (policy.Unanswered + 1).String(); s != "unknown" {
		t.Errorf("the outcome past Unanswered is %q, want unknown: Unanswered is not the last", s)
	}
}
