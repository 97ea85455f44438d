package relay

import "github.com/sluice-relay/sluice/relay/policy"

// The charging rules live in package relay/policy, beside the gate, so that
// the gate and the hooks (relay/hooks) read one compiled policy; these names
// keep the gate's Options whole.

// Limits are the budgets the gate charges (policy.Limits).
type Limits = policy.Limits

// DefaultLimits returns the limits a public relay can start with
// (policy.DefaultLimits).
func DefaultLimits() Limits { return policy.DefaultLimits() }

// Identity turns a request into its client and holds the allow-lists
// (policy.Identity).
type Identity = policy.Identity

// AllowList is the addresses and pubkeys charged nothing (policy.AllowList).
type AllowList = policy.AllowList

// NewAllowList parses an allow-list (policy.NewAllowList).
func NewAllowList(ips []string, pubkeys []string) (*AllowList, error) {
	return policy.NewAllowList(ips, pubkeys)
}

// Observer receives the gate's decisions, for metrics (policy.Observer).
type Observer = policy.Observer

// Outcome is what became of a frame or an upgrade (policy.Outcome).
type Outcome = policy.Outcome

// CutReason is why the gate closed a connection (policy.CutReason).
type CutReason = policy.CutReason

// The outcomes and cut reasons (see policy.Outcome, policy.CutReason).
const (
	Admitted      = policy.Admitted
	RateLimited   = policy.RateLimited
	Unavailable   = policy.Unavailable
	QuotaExceeded = policy.QuotaExceeded
	Allowlisted   = policy.Allowlisted
	Invalid       = policy.Invalid
	OverCap       = policy.OverCap
	Shadowed      = policy.Shadowed
	Unmatched     = policy.Unmatched
	NumOutcomes   = policy.NumOutcomes

	CutSlowReader   = policy.CutSlowReader
	CutControlFlood = policy.CutControlFlood
	CutKnocking     = policy.CutKnocking
	NumCutReasons   = policy.NumCutReasons
)

// Identity sentinel errors (see policy).
var (
	ErrIdentity  = policy.ErrIdentity
	ErrAllowList = policy.ErrAllowList
)

// Identity defaults (see policy).
const (
	DefaultIPv6Prefix    = policy.DefaultIPv6Prefix
	DefaultForwardHeader = policy.DefaultForwardHeader
	UnknownClient        = policy.UnknownClient
)
