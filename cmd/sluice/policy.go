package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// This file makes the actor quotas a policy.Config holds (in process for
// `sluice check` and the memory store, in Redis with the Redis store) and
// counts a policy's windows in shadow.

// quotaMaker returns the actor quota of owner ("" for the global one, else
// a tier's name): events per window, or nil (none) when unlimited.
type quotaMaker func(owner string, events int, window time.Duration, unlimited bool) (ratelimit.ActorQuota, error)

// localQuotas makes in-process quotas on clock (nil: the real one), a new
// one at every call: what `sluice check` and validation compile with.
func localQuotas(clock ratelimit.Clock) quotaMaker {
	return func(_ string, events int, window time.Duration, unlimited bool) (ratelimit.ActorQuota, error) {
		if unlimited {
			return nil, nil
		}
		q, err := ratelimit.NewQuota(events, window)
		if err != nil {
			return nil, err
		}
		return q.WithClock(clock), nil
	}
}

// quotaCache makes the quotas of a running sluice: in Redis with the Redis
// store (one budget for every instance), else in process. A quota asked
// for again with the same owner, events and window is the one made before,
// so a reload that leaves a quota alone does not forget its counts.
type quotaCache struct {
	limiter *ratelimit.Limiter
	rstore  *redisstore.Store // nil: in process

	mu   sync.Mutex
	made map[quotaKey]ratelimit.ActorQuota
}

type quotaKey struct {
	owner  string
	events int
	window time.Duration
}

func (qc *quotaCache) make(owner string, events int, window time.Duration, unlimited bool) (ratelimit.ActorQuota, error) {
	if unlimited {
		return nil, nil
	}
	k := quotaKey{owner, events, window}
	qc.mu.Lock()
	defer qc.mu.Unlock()
	if q, ok := qc.made[k]; ok {
		return q, nil
	}
	var q ratelimit.ActorQuota
	var err error
	switch {
	case qc.rstore != nil:
		q, err = redisstore.NewQuota(qc.rstore, events, window)
	default:
		var lq *ratelimit.Quota
		if lq, err = ratelimit.NewQuota(events, window); err == nil {
			q = lq.WithClock(qc.limiter.Now)
		}
	}
	if err != nil {
		return nil, err
	}
	if qc.made == nil {
		qc.made = map[quotaKey]ratelimit.ActorQuota{}
	}
	qc.made[k] = q
	return q, nil
}

// buildPolicy is the one place a policy.Config is made from a validated
// config: the address limits, filter bound, kind classes, tiers (their
// quotas from mk), aggregates, mode, the global quota (from mk, nil when
// quota.unlimited) and the identity with its allow-list. Validation has
// checked every quota, so mk fails only on a store that refuses one;
// the first such error is returned with the config built so far.
func buildPolicy(c *config, mk quotaMaker) (policy.Config, error) {
	limits := c.Limits // the policy's own copy
	pc := policy.Config{
		Limits:     &limits,
		Bounds:     c.Bounds,
		ReadCost:   c.ReadCost,
		Kinds:      c.Kinds,
		Aggregates: c.Aggregates,
		Shadow:     c.Shadow,
		Identity:   c.Identity,
		Penalty:    c.Penalty,
	}
	pc.Bounds.MaxFilters = c.MaxFilters
	var err error
	if !c.QuotaUnlimited {
		if pc.Quota, err = mk("", c.QuotaEvents, c.QuotaWindow, false); err != nil {
			return pc, fmt.Errorf("%w: quota: %v", errConfig, err)
		}
	}
	for _, ts := range c.Tiers {
		t := ts.Tier
		t.Quota = pc.Quota // a tier without a quota of its own shares the global one
		if ts.QuotaSet {
			if t.Quota, err = mk(t.Name, ts.QuotaEvents, ts.QuotaWindow, ts.QuotaUnlimited); err != nil {
				return pc, fmt.Errorf("%w: tiers.%s.quota: %v", errConfig, t.Name, err)
			}
		}
		pc.Tiers = append(pc.Tiers, t)
	}
	return pc, nil
}

// shadowWindows counts the windows in shadow of a policy by budget:
// "connection", a message type, "kind <class>", "tier <name> <type>",
// "prefix IPv6 /48". With mode shadow, every window is.
func shadowWindows(pc policy.Config) map[string]int {
	out := map[string]int{}
	count := func(budget string, ls []ratelimit.Limit) {
		for _, l := range ls {
			if l.Shadow || pc.Shadow {
				out[budget]++
			}
		}
	}
	count("connection", pc.Limits.Connection)
	for t := range pc.Limits.Message {
		count(wire.Type(t).String(), pc.Limits.Message[t])
	}
	for _, c := range pc.Kinds {
		count("kind "+c.Name, c.Limits)
	}
	for _, t := range pc.Tiers {
		for ty := range t.Limits.Message {
			count("tier "+t.Name+" "+wire.Type(ty).String(), t.Limits.Message[ty])
		}
	}
	for _, a := range pc.Aggregates {
		fam := "IPv6"
		if a.V4 {
			fam = "IPv4"
		}
		count(fmt.Sprintf("prefix %s /%d", fam, a.Bits), a.Limits)
	}
	return out
}
