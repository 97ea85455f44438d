package policy

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"regexp"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/wire"
)

// DefaultMaxFilters is how many filters a forwarded REQ may hold when the
// configuration says nothing: 10. NIP-11's example says 100, but every
// filter is a query the relay runs and is charged as one REQ; clients send
// one to a few.
const DefaultMaxFilters = wire.DefaultMaxFilters

// The largest value each field of Config.Bounds takes. Past them a bound
// no longer bounds: a frame of the gate's read limit fits fewer tags,
// values or bytes, and the planner's scans past a million cost a relay
// gigabytes.
const (
	MaxMaxTags          = 100000
	MaxMaxTagValueBytes = 1 << 20
	MaxMaxFilterValues  = 100000
	MaxMaxFanout        = 1000000
)

// MaxClasses bounds the kind classes of one policy, MaxTiers its tiers and
// MaxAggregates its prefix aggregates: each is a charge some frames pay.
const (
	MaxClasses    = 32
	MaxTiers      = 32
	MaxAggregates = 4
)

// ErrPolicy is wrapped by Compile for a configuration it refuses; the
// message names the offending class, tier or aggregate.
var ErrPolicy = errors.New("policy: invalid policy")

// Config is everything a Policy is compiled from: the one way to configure
// a Gate (relay.Options.Policy) and Hooks (hooks.Options.Policy). The zero
// Config is the defaults: DefaultLimits, DefaultMaxFilters, wire's default
// bounds, no kind classes, tiers or aggregates, no actor quota, the zero
// Identity.
type Config struct {
	// Limits are the address budget: per message type and per upgrade.
	// Nil means DefaultLimits(); a non-nil Limits is used as it is, so
	// &Limits{} limits nothing and an empty slice makes its type free.
	Limits *Limits
	// Bounds are what one frame may ask of the relay: filters per REQ,
	// tags per event, the length of an indexed tag's value, values per
	// filter field and a filter's index fan-out (each zero field means its
	// default: DefaultMaxFilters, and wire's defaults for the rest).
	// Bounds.MaxFilters is lowered by EffectiveMaxFilters.
	Bounds wire.Bounds
	// Kinds are named classes of event kinds with windows of their own,
	// charged to an EVENT of such a kind in addition to EVENT's windows.
	// A kind belongs to at most one class; one in none pays EVENT's alone.
	Kinds []Class
	// Tiers are named sets of pubkeys with budgets of their own: a
	// connection that has proved a member pubkey (NIP-42, verified by the
	// gate) is charged to that pubkey with its tier's limits instead of
	// its address's. Pubkeys cost nothing to make, so one in no tier stays
	// on its address's budget.
	Tiers []Tier
	// Aggregates are wider network prefixes (an IPv6 /48, an IPv4 /24)
	// whose clients share windows besides their own: every charged frame
	// of an address budget inside one is also charged to the prefix, and
	// every upgrade to the prefix's windows for upgrades (the same numbers,
	// counted apart), so rotating addresses inside one allocation does not
	// multiply a budget.
	Aggregates []Aggregate
	// Shadow puts every window in shadow (mode: shadow): frames are
	// decided, stored and counted as they would be, and forwarded anyway.
	Shadow bool
	// Quota is the actor quota of the address budget: the in-process
	// table (ratelimit.Quota.Local) for one process, or redisstore's
	// shared one. Nil means no quota: EVENTs pass on their message limits
	// alone.
	Quota ratelimit.ActorQuota
	// Identity turns a request into its client and holds the allow-lists
	// (the addresses and pubkeys charged nothing; see AllowList). The zero
	// Identity: the TCP peer is the client, IPv6 by /64, nothing
	// allow-listed.
	Identity Identity
}

// Class is a named class of event kinds.
type Class struct {
	// Name is the class's key part: letters, digits, '_' and '-', at most
	// 32 bytes. Keys carry only configured names, so a client cannot mint
	// one.
	Name string
	// Kinds are the kinds in the class: single kinds and inclusive ranges.
	Kinds []KindRange
	// Limits are its windows (Shadow on a window, as everywhere).
	Limits []ratelimit.Limit
}

// KindRange is the kinds From…To, inclusive; a single kind has From = To.
type KindRange struct{ From, To int }

// Tier is a named set of member pubkeys.
type Tier struct {
	// Name names the tier in logs and in `sluice check`; same syntax as a
	// Class name.
	Name string
	// Pubkeys are the members, 64 lowercase hex digits each.
	Pubkeys []string
	// Limits replace the address's message limits for a member's frames
	// (Connection is not used: an upgrade is charged before any AUTH).
	Limits Limits
	// Free charges members nothing at all: the allow tier.
	Free bool
	// Quota is the members' actor quota. Nil means none: to share the
	// address budget's quota, set it to Config.Quota.
	Quota ratelimit.ActorQuota
}

// Aggregate is a network prefix whose clients share windows.
type Aggregate struct {
	// Bits is the prefix length: for IPv6 wider than the per-client prefix
	// (e.g. 48 or 56), for IPv4 (V4) narrower than 32 (e.g. 24).
	Bits int
	// V4 says the aggregate groups IPv4 addresses; otherwise IPv6.
	V4 bool
	// Limits are the prefix's windows.
	Limits []ratelimit.Limit
}

// Policy is the compiled charging rules: for each frame type the prepared
// windows it is charged against, REQ's windows for every filter count (a
// REQ of n filters costs n REQs), the connection windows, the kind classes,
// the tiers and the aggregates, each split into the windows that enforce
// and the ones in shadow. It is built once by Compile — every limit
// validated, every set of windows prepared with its key suffixes and script
// arguments — and only read afterwards, by the gate and the hooks alike, so
// the two cannot disagree on what a frame costs. A Policy is immutable and
// safe for concurrent use; a reload compiles a new one.
type Policy struct {
	cfg        Config
	identity   *Identity
	budget     budget // the address budget
	conn       split
	maxFilters int
	bounds     wire.Bounds
	classes    []class
	kindClass  []uint8 // kind → class index + 1; 0: none
	tiers      []*tier
	members    map[wire.Hex32]*tier
	aggs       []aggregate
	quota      ratelimit.ActorQuota
}

// split is one list of windows compiled twice: those that enforce and
// those in shadow. Either may be empty (nil).
type split struct{ enforce, shadow *ratelimit.Windows }

func (s split) empty() bool { return s.enforce.Len() == 0 && s.shadow.Len() == 0 }

// budget is the per-type windows of one kind of payer (the address, or a
// tier's members).
type budget struct {
	msg [wire.NumTypes]split
	req []split // index n: a REQ of n filters
}

type class struct {
	name  string
	label string // "kind <name>", for Verdict.Budget
	win   split
}

type tier struct {
	name   string
	budget budget
	free   bool
	quota  ratelimit.ActorQuota
}

type aggregate struct {
	bits int
	v4   bool
	win  split
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Compile validates cfg and prepares every window. An error names the
// connection limit, the message type, the class, tier or aggregate, and
// wraps ratelimit.ErrInvalidLimit (a window) or ErrPolicy (the rest).
func Compile(cfg Config) (*Policy, error) {
	lim := DefaultLimits()
	if cfg.Limits != nil {
		lim = *cfg.Limits
	}
	cfg.Limits = &lim // a copy of its own
	p := &Policy{cfg: cfg}
	p.identity = &p.cfg.Identity
	if err := p.identity.Validate(); err != nil {
		return nil, err
	}
	var err error
	if p.conn, err = splitOf(cfg.Limits.Connection, cfg.Shadow); err != nil {
		return nil, fmt.Errorf("policy: connection limits: %w", err)
	}
	// One bound for every payer: a REQ a tier's windows could never admit
	// would be told a wait that never comes.
	p.maxFilters = EffectiveMaxFilters(cfg)
	if p.budget, err = compileBudget(*cfg.Limits, p.maxFilters, cfg.Shadow); err != nil {
		return nil, err
	}
	if p.bounds, err = compileBounds(cfg.Bounds, p.maxFilters); err != nil {
		return nil, err
	}
	p.quota = cfg.Quota
	if len(cfg.Kinds) > MaxClasses {
		return nil, fmt.Errorf("%w: %d kind classes, at most %d", ErrPolicy, len(cfg.Kinds), MaxClasses)
	}
	if len(cfg.Kinds) > 0 {
		p.kindClass = make([]uint8, 65536)
	}
	seen := map[string]bool{}
	for i, c := range cfg.Kinds {
		if err := checkName("kind class", c.Name, seen); err != nil {
			return nil, err
		}
		if len(c.Kinds) == 0 {
			return nil, fmt.Errorf("%w: kind class %q has no kinds", ErrPolicy, c.Name)
		}
		for _, r := range c.Kinds {
			if r.From < 0 || r.To > 65535 || r.From > r.To {
				return nil, fmt.Errorf("%w: kind class %q: kinds %d-%d must lie within 0-65535, low to high", ErrPolicy, c.Name, r.From, r.To)
			}
			for k := r.From; k <= r.To; k++ {
				if j := p.kindClass[k]; j != 0 && int(j) != i+1 {
					return nil, fmt.Errorf("%w: kind %d is in both kind classes %q and %q", ErrPolicy, k, cfg.Kinds[j-1].Name, c.Name)
				}
				p.kindClass[k] = uint8(i + 1)
			}
		}
		if len(c.Limits) == 0 {
			return nil, fmt.Errorf("%w: kind class %q has no limits", ErrPolicy, c.Name)
		}
		w, err := splitOf(c.Limits, cfg.Shadow)
		if err != nil {
			return nil, fmt.Errorf("policy: kind class %q: %w", c.Name, err)
		}
		p.classes = append(p.classes, class{name: c.Name, label: "kind " + c.Name, win: w})
	}
	if len(cfg.Tiers) > MaxTiers {
		return nil, fmt.Errorf("%w: %d tiers, at most %d", ErrPolicy, len(cfg.Tiers), MaxTiers)
	}
	p.members = make(map[wire.Hex32]*tier)
	seen = map[string]bool{}
	for _, t := range cfg.Tiers {
		if err := checkName("tier", t.Name, seen); err != nil {
			return nil, err
		}
		tr := &tier{name: t.Name, free: t.Free, quota: t.Quota}
		if !t.Free {
			lim := t.Limits
			lim.Connection = nil
			if tr.budget, err = compileBudget(lim, p.maxFilters, cfg.Shadow); err != nil {
				return nil, fmt.Errorf("policy: tier %q: %w", t.Name, err)
			}
		}
		for _, pk := range t.Pubkeys {
			k, ok := wire.DecodeHex32(pk)
			if !ok || k.String() != pk {
				return nil, fmt.Errorf("%w: tier %q: pubkey %q is not 64 lowercase hex digits", ErrPolicy, t.Name, pk)
			}
			if other, dup := p.members[k]; dup && other != tr {
				return nil, fmt.Errorf("%w: pubkey %s is in both tiers %q and %q", ErrPolicy, pk, other.name, t.Name)
			}
			p.members[k] = tr
		}
		p.tiers = append(p.tiers, tr)
	}
	if len(cfg.Aggregates) > MaxAggregates {
		return nil, fmt.Errorf("%w: %d aggregates, at most %d", ErrPolicy, len(cfg.Aggregates), MaxAggregates)
	}
	for _, a := range cfg.Aggregates {
		what := fmt.Sprintf("IPv6 /%d", a.Bits)
		max := 127
		if a.V4 {
			what, max = fmt.Sprintf("IPv4 /%d", a.Bits), 31
		}
		if a.Bits < 8 || a.Bits > max {
			return nil, fmt.Errorf("%w: aggregate %s: the prefix must be 8 to %d bits", ErrPolicy, what, max)
		}
		if len(a.Limits) == 0 {
			return nil, fmt.Errorf("%w: aggregate %s has no limits", ErrPolicy, what)
		}
		w, err := splitOf(a.Limits, cfg.Shadow)
		if err != nil {
			return nil, fmt.Errorf("policy: aggregate %s: %w", what, err)
		}
		p.aggs = append(p.aggs, aggregate{bits: a.Bits, v4: a.V4, win: w})
	}
	return p, nil
}

// checkName refuses a class or tier name that is not a key part, or that
// seen holds already, and adds it to seen.
func checkName(what, name string, seen map[string]bool) error {
	switch {
	case !nameRE.MatchString(name):
		return fmt.Errorf("%w: %s %q: a name is 1 to 32 letters, digits, '_' or '-'", ErrPolicy, what, name)
	case seen[name]:
		return fmt.Errorf("%w: %s %q twice", ErrPolicy, what, name)
	}
	seen[name] = true
	return nil
}

// compileBudget prepares the per-type windows of l, REQ's for every filter
// count up to maxFilters.
func compileBudget(l Limits, maxFilters int, shadow bool) (budget, error) {
	var b budget
	var err error
	for t := range l.Message {
		if b.msg[t], err = splitOf(l.Message[t], shadow); err != nil {
			return b, fmt.Errorf("policy: %v limits: %w", wire.Type(t), err)
		}
	}
	req := l.Message[wire.TypeREQ]
	b.req = make([]split, maxFilters+1)
	for n := 1; n <= maxFilters; n++ {
		scaled := make([]ratelimit.Limit, len(req))
		for i, lim := range req {
			lim.Cost = lim.EffectiveCost() * float64(n)
			scaled[i] = lim
		}
		if b.req[n], err = splitOf(scaled, shadow); err != nil {
			return b, fmt.Errorf("policy: REQ limits for %d filters: %w", n, err)
		}
	}
	return b, nil
}

// splitOf validates ls as one key's windows and prepares its enforcing and
// its shadow windows apart (all in shadow when shadow).
func splitOf(ls []ratelimit.Limit, shadow bool) (split, error) {
	if err := ratelimit.ValidateLimits(ls); err != nil {
		return split{}, err
	}
	var enforce, sh []ratelimit.Limit
	for _, l := range ls {
		if l.Shadow || shadow {
			sh = append(sh, l)
		} else {
			enforce = append(enforce, l)
		}
	}
	var s split
	var err error
	if len(enforce) > 0 {
		if s.enforce, err = ratelimit.NewWindows(enforce...); err != nil {
			return s, err
		}
	}
	if len(sh) > 0 {
		if s.shadow, err = ratelimit.NewWindows(sh...); err != nil {
			return s, err
		}
	}
	return s, nil
}

// Identity returns the identity of p's configuration. It must not be
// changed.
func (p *Policy) Identity() *Identity { return p.identity }

// Config returns the configuration p was compiled from.
func (p *Policy) Config() Config { return p.cfg }

// Connection returns the windows charged once per WebSocket upgrade that
// enforce (see Subject.ChargeConnection for all of them).
func (p *Policy) Connection() *ratelimit.Windows { return p.conn.enforce }

// Message returns the enforcing windows one frame of type t is charged
// against on the address budget; for a REQ, those of one filter.
func (p *Policy) Message(t wire.Type) *ratelimit.Windows { return p.budget.msg[t].enforce }

// MaxFilters returns the most filters a forwarded REQ may hold.
func (p *Policy) MaxFilters() int { return p.maxFilters }

// Bounds returns what wire.Scan holds a forwarded frame to, every field
// set (MaxFilters as MaxFilters returns it). The caller must not modify it.
func (p *Policy) Bounds() *wire.Bounds { return &p.bounds }

// CheckBounds validates b (Config.Bounds): each field 0 (its default) to
// its Max…. The error wraps ErrPolicy and names the field by its
// configuration and NIP-11 name.
func CheckBounds(b wire.Bounds) error {
	_, err := compileBounds(b, 0)
	return err
}

// compileBounds validates b, each field 0 (its default) to its Max…, and
// returns it with every field set.
func compileBounds(b wire.Bounds, maxFilters int) (wire.Bounds, error) {
	for _, f := range []struct {
		name   string
		v, max int
	}{
		{"max_event_tags", b.MaxTags, MaxMaxTags},
		{"max_tag_value_bytes", b.MaxTagValueBytes, MaxMaxTagValueBytes},
		{"max_filter_values", b.MaxFilterValues, MaxMaxFilterValues},
		{"max_filter_fanout", b.MaxFanout, MaxMaxFanout},
	} {
		if f.v < 0 || f.v > f.max {
			return wire.Bounds{}, fmt.Errorf("%w: %s must be between 0 (its default) and %d, got %d", ErrPolicy, f.name, f.max, f.v)
		}
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&b.MaxTags, wire.DefaultMaxTags)
	def(&b.MaxTagValueBytes, wire.DefaultMaxTagValueBytes)
	def(&b.MaxFilterValues, wire.DefaultMaxFilterValues)
	def(&b.MaxFanout, wire.DefaultMaxFanout)
	b.MaxFilters = maxFilters
	return b, nil
}

// Quota returns the actor quota of the address budget; nil for none.
func (p *Policy) Quota() ratelimit.ActorQuota { return p.quota }

// HasQuota reports whether any payer has an actor quota: the address
// budget, or a tier that is not free.
func (p *Policy) HasQuota() bool {
	if p.quota != nil {
		return true
	}
	for _, t := range p.tiers {
		if t.quota != nil && !t.free {
			return true
		}
	}
	return false
}

// HasTiers reports whether any pubkey is a tier member, so that a gate
// must watch AUTHs.
func (p *Policy) HasTiers() bool { return len(p.members) > 0 }

// ClassOf returns the name of the kind class of kind, "" for none.
func (p *Policy) ClassOf(kind int) string {
	if kind < 0 || kind >= len(p.kindClass) || p.kindClass[kind] == 0 {
		return ""
	}
	return p.classes[p.kindClass[kind]-1].name
}

// TierOf returns the name of pubkey's tier, "" for none. pubkey is 64
// lowercase hex digits.
func (p *Policy) TierOf(pubkey string) string {
	k, ok := wire.DecodeHex32(pubkey)
	if !ok {
		return ""
	}
	if t := p.members[k]; t != nil {
		return t.name
	}
	return ""
}

// prefix returns a's network for addr ("2001:db8:1::/48"), or false when
// addr is of the other family.
func (a *aggregate) prefix(addr netip.Addr) (string, bool) {
	addr = addr.WithZone("").Unmap()
	if !addr.IsValid() || addr.Is4() != a.v4 {
		return "", false
	}
	pfx, err := addr.Prefix(a.bits)
	if err != nil {
		return "", false
	}
	return pfx.String(), true
}

// EffectiveMaxFilters returns how many filters a REQ may hold under cfg:
// cfg.Bounds.MaxFilters (0 or less meaning DefaultMaxFilters), lowered to
// the largest n with n·cost < rate in every REQ window of the address
// budget and of every tier that is not free (a REQ that no window could
// ever admit would be told a wait that never comes), and at least 1. It is
// what a Gate built on cfg enforces and what NIP-11's max_filters states.
func EffectiveMaxFilters(cfg Config) int {
	limit := cfg.Bounds.MaxFilters
	if limit <= 0 {
		limit = DefaultMaxFilters
	}
	lowered := func(req []ratelimit.Limit) {
		for _, l := range req {
			if l.Rate > 0 && l.EffectiveCost() > 0 {
				limit = min(limit, int(math.Ceil(l.Rate/l.EffectiveCost()))-1)
			}
		}
	}
	if cfg.Limits == nil {
		def := DefaultLimits()
		lowered(def.Message[wire.TypeREQ])
	} else {
		lowered(cfg.Limits.Message[wire.TypeREQ])
	}
	for _, t := range cfg.Tiers {
		if !t.Free {
			lowered(t.Limits.Message[wire.TypeREQ])
		}
	}
	return max(limit, 1)
}
