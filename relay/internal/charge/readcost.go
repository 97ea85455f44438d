package charge

import (
	"context"
	"math"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// This file holds the read side's charges: a read's price by its shape
// (Price, PriceFilter), charged with the frame by Subject.Charge, and the
// settlement of the bytes the relay sent (Subject.SettleRead).

// pricedTypes are the frames priced by their filters' shape.
var pricedTypes = [...]wire.Type{wire.TypeREQ, wire.TypeCOUNT, wire.TypeNEGOPEN}

// maxPrice returns the largest price a frame charged to ls can have: the
// largest n with n·cost < rate in every window (a larger one would be
// told a wait that never comes), at most most (the dearest frame the
// table prices); 0 when ls is empty.
func maxPrice(ls []ratelimit.Limit, most int) int {
	top := math.MaxInt32
	for _, l := range ls {
		if l.Rate > 0 && l.EffectiveCost() > 0 {
			top = min(top, int(math.Ceil(l.Rate/l.EffectiveCost()))-1)
		}
	}
	if top == math.MaxInt32 {
		return 0 // free: nothing to scale
	}
	return max(min(top, most), 1)
}

// Price returns what a canonical REQ, COUNT or NEG-OPEN frame costs by its
// shape at now: the sum of its filters' prices (PriceFilter), at least 1.
// The shapes are facts's, what scan.Scan read of frame; with facts nil,
// or more filters than facts keeps, frame is read again for them.
// Subject.Charge caps it at what the type's windows admit from rest.
func (p *Policy) Price(facts *scan.Facts, frame []byte, now time.Time) int {
	n := 0
	if facts != nil {
		if shapes, ok := facts.Shapes(); ok {
			for _, f := range shapes {
				n += p.PriceFilter(f, now)
			}
			return max(n, 1)
		}
	}
	for f := range scan.Filters(frame, &p.bounds) {
		n += p.PriceFilter(f, now)
	}
	return max(n, 1)
}

// PriceFilter returns one filter's price under the policy's
// policy.ReadCost at now (for a span with no until).
func (p *Policy) PriceFilter(f scan.Filter, now time.Time) int {
	rc := &p.readCost
	limit := int64(rc.ScrapeLimit)
	switch {
	case f.IDs, f.Limit == 0:
		return rc.Narrow
	case f.Authors || f.Tags:
		if f.Limit > limit {
			return rc.Wide
		}
		return rc.Narrow
	case f.Limit > limit:
		return rc.Scrape
	}
	if f.Since < 0 {
		return rc.Scrape // open-ended: all of time
	}
	until := f.Until
	if until < 0 {
		until = now.Unix()
	}
	if time.Duration(until-f.Since)*time.Second > rc.ScrapeSpan {
		return rc.Scrape
	}
	return rc.Wide
}

// ReadCost returns the price table in force, every field set.
func (p *Policy) ReadCost() policy.ReadCost { return p.readCost }

// compileRead returns the read windows and the most one settlement
// charges: half the smallest rate, so it is admissible from rest.
func compileRead(ls []ratelimit.Limit) ([]ratelimit.Limit, int64) {
	if len(ls) == 0 {
		return nil, 0
	}
	least := math.Inf(1)
	for _, l := range ls {
		least = min(least, l.Rate)
	}
	return append([]ratelimit.Limit(nil), ls...), int64(least / 2)
}

// Reads reports whether s has a read budget to settle: its own, or an
// aggregate's its address is in.
func (s *Subject) Reads() bool {
	if s.free {
		return false
	}
	if len(s.b.read) > 0 {
		return true
	}
	for i, ak := range s.aggs {
		if ak.msg != "" && len(s.p.aggs[i].read) > 0 {
			return true
		}
	}
	return false
}

// ReadKey returns the key of s's read budget: one per payer, like its
// message keys (the connections and instances of one client share it).
func (s *Subject) ReadKey() string { return "{" + s.name + "}:read" }

// ReadMax returns the most one SettleRead charges: half the smallest rate
// of the read windows it charges.
func (s *Subject) ReadMax() int64 {
	most := s.b.readMax
	for i, ak := range s.aggs {
		if a := &s.p.aggs[i]; ak.msg != "" && len(a.read) > 0 && (most == 0 || a.readMax < most) {
			most = a.readMax
		}
	}
	return most
}

// SettleRead charges n bytes (1 ≤ n ≤ ReadMax) the relay sent s to its
// read windows, key ReadKey() (Budget "read"), and to those of each
// aggregate its address is in (Budget "prefix <network> read"): a Verdict
// as Charge's. The windows are made for this charge (their cost is n), at
// most once per settlement of at least 64 KiB.
func (s *Subject) SettleRead(ctx context.Context, lim *ratelimit.Limiter, key string, n int64) Verdict {
	if !s.Reads() || n <= 0 {
		return Verdict{Allowlisted: s.free}
	}
	n = min(n, s.ReadMax())
	var buf [1 + stackAggregates]charge
	cs := buf[:0]
	add := func(k string, read []ratelimit.Limit, budget string) error {
		if len(read) == 0 {
			return nil
		}
		ls := make([]ratelimit.Limit, len(read))
		for i, l := range read {
			l.Cost = float64(n)
			ls[i] = l
		}
		win, err := splitOf(ls, s.p.cfg.Shadow)
		cs = append(cs, charge{k, shadowKey(k, win), win, budget, nil})
		return err
	}
	err := add(key, s.b.read, "read")
	for i, ak := range s.aggs {
		if ak.msg != "" && err == nil {
			err = add(ak.msg+":read", s.p.aggs[i].read, ak.label+" read")
		}
	}
	if err != nil {
		return Verdict{Err: err, Budget: "read"}
	}
	return decide(ctx, lim, cs)
}
