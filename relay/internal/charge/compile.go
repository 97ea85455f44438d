package charge

import (
	"fmt"
	"net/netip"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

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
	cfg        policy.Config
	identity   *Identity
	budget     budget // the address budget
	conn       split
	maxFilters int
	bounds     wire.Bounds
	readCost   policy.ReadCost // resolved
	classes    []class
	kindClass  []uint8 // kind → class index + 1; 0: none
	tiers      []*tier
	members    map[scan.Hex32]*tier
	aggs       []aggregate
	quota      ratelimit.ActorQuota
	// allowPubkeys are the allow-listed pubkeys, decoded.
	allowPubkeys map[scan.Hex32]struct{}
}

// split is one list of windows compiled twice: those that enforce and
// those in shadow. Either may be empty (nil).
type split struct{ enforce, shadow *ratelimit.Windows }

func (s split) empty() bool { return s.enforce.Len() == 0 && s.shadow.Len() == 0 }

// budget is the per-type windows of one kind of payer (the address, or a
// tier's members).
type budget struct {
	msg [wire.NumTypes]split
	// priced are the windows of a REQ, COUNT or NEG-OPEN by its price
	// (index n: a frame of price n, readcost.go), up to the largest price
	// the type's windows admit from rest.
	priced [wire.NumTypes][]split
	read   []ratelimit.Limit // the read budget's windows, cost 1 (a byte)
	// readMax is the most one read settlement charges: half the smallest
	// read rate, so it is admissible from rest.
	readMax int64
}

type class struct {
	name  string
	label string // "kind <name>", for Verdict.Budget
	win   split
}

type tier struct {
	name   string
	budget budget
	quota  ratelimit.ActorQuota
}

type aggregate struct {
	bits    int
	v4      bool
	win     split
	read    []ratelimit.Limit // its read windows (readcost.go)
	readMax int64
}

// Compile validates cfg (policy.Config.Validate) and prepares every window.
func Compile(cfg policy.Config) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lim := policy.DefaultLimits()
	if cfg.Limits != nil {
		lim = *cfg.Limits
	}
	cfg.Limits = &lim // a copy of its own
	p := &Policy{cfg: cfg}
	p.identity = (*Identity)(&p.cfg.Identity)
	var err error
	if p.conn, err = splitOf(cfg.Limits.Connection, cfg.Shadow); err != nil {
		return nil, err
	}
	// One bound for every payer; a REQ's price, not its filter count, is
	// capped at what its windows admit (maxPrice).
	p.maxFilters = cfg.Bounds.MaxFilters
	if p.maxFilters <= 0 {
		p.maxFilters = wire.DefaultBounds().MaxFilters
	}
	if p.budget, err = compileBudget(*cfg.Limits, p.maxFilters, cfg.ReadCost.Resolved(), cfg.Shadow); err != nil {
		return nil, err
	}
	p.bounds = compileBounds(cfg.Bounds, p.maxFilters)
	p.readCost = cfg.ReadCost.Resolved()
	p.quota = cfg.Quota
	if len(cfg.Kinds) > 0 {
		p.kindClass = make([]uint8, 65536)
	}
	for i, c := range cfg.Kinds {
		for _, r := range c.Kinds {
			for k := r[0]; k <= r[1]; k++ {
				p.kindClass[k] = uint8(i + 1)
			}
		}
		w, err := splitOf(c.Limits, cfg.Shadow)
		if err != nil {
			return nil, err
		}
		p.classes = append(p.classes, class{name: c.Name, label: "kind " + c.Name, win: w})
	}
	p.members = make(map[scan.Hex32]*tier)
	for _, t := range cfg.Tiers {
		tr := &tier{name: t.Name, quota: t.Quota}
		lim := t.Limits
		lim.Connection = nil
		if tr.budget, err = compileBudget(lim, p.maxFilters, cfg.ReadCost.Resolved(), cfg.Shadow); err != nil {
			return nil, err
		}
		for _, pk := range t.Pubkeys {
			k, _ := scan.DecodeHex32(pk)
			p.members[k] = tr
		}
		p.tiers = append(p.tiers, tr)
	}
	for _, a := range cfg.Aggregates {
		w, err := splitOf(a.Limits, cfg.Shadow)
		if err != nil {
			return nil, err
		}
		ag := aggregate{bits: a.Bits, v4: a.V4, win: w}
		ag.read, ag.readMax = compileRead(a.Read)
		p.aggs = append(p.aggs, ag)
	}
	if pks := cfg.Identity.AllowPubkeys; len(pks) > 0 {
		p.allowPubkeys = make(map[scan.Hex32]struct{}, len(pks))
		for _, pk := range pks {
			if k, ok := scan.DecodeHex32(pk); ok {
				p.allowPubkeys[k] = struct{}{}
			}
		}
	}
	return p, nil
}

// compileBudget prepares the per-type windows of l, REQ's, COUNT's and
// NEG-OPEN's for every price up to the dearest (maxPrice).
func compileBudget(l policy.Limits, maxFilters int, readCost policy.ReadCost, shadow bool) (budget, error) {
	var b budget
	var err error
	for t := range l.Message {
		if b.msg[t], err = splitOf(l.Message[t], shadow); err != nil {
			return b, err
		}
	}
	for _, t := range pricedTypes {
		ls := l.Message[t]
		most := readCost.Scrape // COUNT and NEG-OPEN hold one filter
		if t == wire.TypeREQ {
			most *= maxFilters
		}
		top := maxPrice(ls, most)
		b.priced[t] = make([]split, top+1)
		for n := 1; n <= top; n++ {
			scaled := make([]ratelimit.Limit, len(ls))
			for i, lim := range ls {
				lim.Cost = lim.EffectiveCost() * float64(n)
				scaled[i] = lim
			}
			if b.priced[t][n], err = splitOf(scaled, shadow); err != nil {
				return b, fmt.Errorf("charge: %v limits for price %d: %w", t, n, err)
			}
		}
	}
	b.read, b.readMax = compileRead(l.Read)
	return b, nil
}

// splitOf validates ls as one key's windows and prepares its enforcing and
// its shadow windows apart (all in shadow when shadow).
func splitOf(ls []ratelimit.Limit, shadow bool) (split, error) {
	if _, err := ratelimit.NewWindows(ls...); err != nil {
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
func (p *Policy) Config() policy.Config { return p.cfg }

// Connection returns the windows charged once per WebSocket upgrade that
// enforce (see Subject.ChargeConnection for all of them).
func (p *Policy) Connection() *ratelimit.Windows { return p.conn.enforce }

// Message returns the enforcing windows one frame of type t is charged
// against on the address budget; for a REQ, those of one filter.
func (p *Policy) Message(t wire.Type) *ratelimit.Windows { return p.budget.msg[t].enforce }

// MaxFilters returns the most filters a forwarded REQ may hold.
func (p *Policy) MaxFilters() int { return p.maxFilters }

// Bounds returns what scan.Scan holds a forwarded frame to, every field
// set (MaxFilters as MaxFilters returns it). The caller must not modify it.
func (p *Policy) Bounds() *wire.Bounds { return &p.bounds }

// compileBounds returns b, which Validate has checked, with every field
// set: each zero one at its default.
func compileBounds(b wire.Bounds, maxFilters int) wire.Bounds {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&b.MaxTags, wire.DefaultBounds().MaxTags)
	def(&b.MaxTagValueBytes, wire.DefaultBounds().MaxTagValueBytes)
	def(&b.MaxFilterValues, wire.DefaultBounds().MaxFilterValues)
	def(&b.MaxFanout, wire.DefaultBounds().MaxFanout)
	b.MaxFilters = maxFilters
	return b
}

// Quota returns the actor quota of the address budget; nil for none.
func (p *Policy) Quota() ratelimit.ActorQuota { return p.quota }

// HasQuota reports whether any payer has an actor quota: the address
// budget, or a tier.
func (p *Policy) HasQuota() bool {
	if p.quota != nil {
		return true
	}
	for _, t := range p.tiers {
		if t.quota != nil {
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
	k, ok := scan.DecodeHex32(pubkey)
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

// AllowsPubkey reports whether pubkeyHex (64 hex digits, either case) is
// allow-listed. It does not allocate.
func (p *Policy) AllowsPubkey(pubkeyHex string) bool {
	k, ok := scan.DecodeHex32(pubkeyHex)
	if !ok {
		return false
	}
	_, ok = p.allowPubkeys[k]
	return ok
}
