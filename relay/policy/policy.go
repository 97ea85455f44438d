package policy

import (
	"regexp"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/wire"
)

// maxClasses bounds the kind classes of one policy, maxTiers its tiers and
// maxAggregates its prefix aggregates: each is a charge some frames pay.
const (
	maxClasses    = 32
	maxTiers      = 32
	maxAggregates = 4
)

// Config is everything a Policy is compiled from: the one way to configure
// a Gate (relay.Options.Policy) and Hooks (hooks.Options.Policy). The zero
// Config is the defaults: DefaultLimits, wire's default bounds, no kind
// classes, tiers or aggregates, no actor quota, the zero Identity.
type Config struct {
	// Limits are the address budget: per message type and per upgrade.
	// Nil means DefaultLimits(); a non-nil Limits is used as it is, so
	// &Limits{} limits nothing and an empty slice makes its type free.
	Limits *Limits
	// Bounds are what one frame may ask of the relay: filters per REQ,
	// tags per event, the length of an indexed tag's value, values per
	// filter field and a filter's index fan-out (each zero field means its
	// default: wire.DefaultBounds()). A REQ's filters are bounded here,
	// not by its windows: each filter is priced (ReadCost) and a REQ's
	// price is capped at what its windows admit from rest, so a tight REQ
	// rate never refuses a multi-filter REQ outright.
	Bounds wire.Bounds
	// ReadCost prices REQ, COUNT and NEG-OPEN filters by their shape
	// (see ReadCost); the zero ReadCost is its default table.
	ReadCost ReadCost
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
	// table (ratelimit.Quota, with the limiter's clock: WithClock) for one process, or redisstore's
	// shared one. Nil means no quota: EVENTs pass on their message limits
	// alone.
	Quota ratelimit.ActorQuota
	// Identity turns a request into its client and holds the allow-lists
	// (the addresses and pubkeys charged nothing; see Identity). The zero
	// Identity: the TCP peer is the client, IPv6 by /64, nothing
	// allow-listed.
	Identity Identity
	// Penalty is the escalating penalty box of the address budget:
	// violations (a connection cut for knocking, invalid frames, failed
	// AUTHs, refused upgrades) add points per client and per aggregate,
	// and a score reaching the threshold bans that key at the upgrade
	// (HTTP 429 with the ban's remaining time), for a time that doubles
	// with each ban up to its cap (see ratelimit.Penalty). Its records are
	// the gate's Guard's: in this process, or shared through Redis
	// (relay.Options.Guard). Nil means no penalty box; with Shadow it is
	// off too (shadow mode refuses nothing).
	Penalty *ratelimit.Penalty
}

// Class is a named class of event kinds.
type Class struct {
	// Name is the class's key part: letters, digits, '_' and '-', at most
	// 32 bytes. Keys carry only configured names, so a client cannot mint
	// one.
	Name string
	// Kinds are the kinds in the class, as inclusive ranges {from, to}; a
	// single kind k is {k, k}.
	Kinds [][2]int
	// Limits are its windows (Shadow on a window, as everywhere).
	Limits []ratelimit.Limit
}

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
	// Read are the prefix's read windows, in bytes as Limits.Read: what
	// the relay sends its clients, charged with each client's own. Empty:
	// the prefix has no read budget.
	Read []ratelimit.Limit
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// checkName refuses a class or tier name that is not a key part, or that
// seen holds already, and adds it to seen.
func checkName(errs *fieldErrors, path, what, name string, seen map[string]bool) {
	switch {
	case !nameRE.MatchString(name):
		errs.addf(path, "a %s name is 1 to 32 letters, digits, '_' or '-', got %q", what, name)
	case seen[name]:
		errs.addf(path, "%s %q twice", what, name)
	}
	seen[name] = true
}
