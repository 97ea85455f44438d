package policy

import (
	"fmt"
	"math"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/wire"
)

// DefaultMaxFilters is how many filters a forwarded REQ may hold when the
// configuration says nothing: 10. NIP-11's example says 100, but every
// filter is a query the relay runs and is charged as one REQ; clients send
// one to a few.
const DefaultMaxFilters = 10

// Policy is the compiled charging rules: for each frame type the prepared
// windows it is charged against, REQ's windows for every filter count (a
// REQ of n filters costs n REQs), and the connection windows. It is built
// once from a Limits by Compile — every limit validated, every set of
// windows prepared with its key suffixes and script arguments — and only
// read afterwards, by the gate and the hooks alike, so the two cannot
// disagree on what a frame costs. A Policy is immutable and safe for
// concurrent use; a reload compiles a new one.
type Policy struct {
	limits     Limits
	conn       *ratelimit.Windows
	msg        [wire.NumTypes]*ratelimit.Windows
	req        []*ratelimit.Windows // index n: a REQ of n filters
	maxFilters int
}

// Compile validates l and prepares its windows. maxFilters is the most
// filters a forwarded REQ may hold (0 or less: DefaultMaxFilters), lowered
// by EffectiveMaxFilters. An error names the connection limit or the
// message type and wraps ratelimit.ErrInvalidLimit.
func Compile(l Limits, maxFilters int) (*Policy, error) {
	p := &Policy{limits: l}
	var err error
	if p.conn, err = ratelimit.NewWindows(l.Connection...); err != nil {
		return nil, fmt.Errorf("policy: connection limits: %w", err)
	}
	for t := range l.Message {
		if p.msg[t], err = ratelimit.NewWindows(l.Message[t]...); err != nil {
			return nil, fmt.Errorf("policy: %v limits: %w", wire.Type(t), err)
		}
	}
	req := l.Message[wire.TypeREQ]
	p.maxFilters = EffectiveMaxFilters(maxFilters, req)
	p.req = make([]*ratelimit.Windows, p.maxFilters+1)
	for n := 1; n <= p.maxFilters; n++ {
		scaled := make([]ratelimit.Limit, len(req))
		for i, lim := range req {
			lim.Cost = lim.EffectiveCost() * float64(n)
			scaled[i] = lim
		}
		if p.req[n], err = ratelimit.NewWindows(scaled...); err != nil {
			return nil, fmt.Errorf("policy: REQ limits for %d filters: %w", n, err)
		}
	}
	return p, nil
}

// Limits returns the limits p was compiled from.
func (p *Policy) Limits() Limits { return p.limits }

// Connection returns the windows charged once per WebSocket upgrade.
func (p *Policy) Connection() *ratelimit.Windows { return p.conn }

// Message returns the windows one frame of type t is charged against; for
// a REQ, those of one filter (see REQ).
func (p *Policy) Message(t wire.Type) *ratelimit.Windows { return p.msg[t] }

// Free reports whether frames of type t pass without a charge.
func (p *Policy) Free(t wire.Type) bool { return p.msg[t].Len() == 0 }

// REQ returns the windows a REQ (or a COUNT's REQ-priced query) of filters
// filters is charged against: every REQ window with its cost times filters.
// filters must be between 1 and MaxFilters.
func (p *Policy) REQ(filters int) *ratelimit.Windows { return p.req[filters] }

// MaxFilters returns the most filters a forwarded REQ may hold.
func (p *Policy) MaxFilters() int { return p.maxFilters }

// EffectiveMaxFilters returns how many filters a forwarded REQ may hold
// under the REQ windows req: limit (0 or less meaning DefaultMaxFilters),
// lowered to the largest n with n·cost < rate in every window (a REQ that
// no window could ever admit would be told a wait that never comes), and
// at least 1.
func EffectiveMaxFilters(limit int, req []ratelimit.Limit) int {
	if limit <= 0 {
		limit = DefaultMaxFilters
	}
	for _, l := range req {
		limit = min(limit, int(math.Ceil(l.Rate/l.EffectiveCost()))-1)
	}
	return max(limit, 1) // Validate has checked c < R
}
