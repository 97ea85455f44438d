package policy

import (
	"fmt"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/wire"
)

// The largest value each field of Config.Bounds takes. Past them a bound
// no longer bounds: a frame of the gate's read limit fits fewer tags,
// values or bytes, and the planner's scans past a million cost a relay
// gigabytes.
const (
	maxMaxTags          = 100000
	maxMaxTagValueBytes = 1 << 20
	maxMaxFilterValues  = 100000
	maxMaxFanout        = 1000000
)

// Validate reports the first thing wrong with c, in the order a Gate
// would meet it: the identity, the connection limits, each message type's
// limits, the bounds, the kind classes, the tiers, the aggregates. Each
// set of windows must pass ratelimit.ValidateLimits (an error wrapping
// ratelimit.ErrInvalidLimit that names the connection limit, the message
// type, the class or the tier); the identity's errors wrap ErrIdentity,
// everything else ErrPolicy. relay.New, relay.Gate.Reload, hooks.New and
// hooks.Hooks.Reload refuse what Validate refuses.
func (c *Config) Validate() error {
	if err := c.Identity.validate(); err != nil {
		return err
	}
	lim := DefaultLimits()
	if c.Limits != nil {
		lim = *c.Limits
	}
	if err := ratelimit.ValidateLimits(lim.Connection); err != nil {
		return fmt.Errorf("policy: connection limits: %w", err)
	}
	if err := lim.validateMessages(); err != nil {
		return err
	}
	b := c.Bounds
	for _, f := range []struct {
		name   string
		v, max int
	}{
		{"max_event_tags", b.MaxTags, maxMaxTags},
		{"max_tag_value_bytes", b.MaxTagValueBytes, maxMaxTagValueBytes},
		{"max_filter_values", b.MaxFilterValues, maxMaxFilterValues},
		{"max_filter_fanout", b.MaxFanout, maxMaxFanout},
	} {
		if f.v < 0 || f.v > f.max {
			return fmt.Errorf("%w: %s must be between 0 (its default) and %d, got %d", ErrPolicy, f.name, f.max, f.v)
		}
	}
	if len(c.Kinds) > maxClasses {
		return fmt.Errorf("%w: %d kind classes, at most %d", ErrPolicy, len(c.Kinds), maxClasses)
	}
	classOf := map[int]string{}
	seen := map[string]bool{}
	for _, cl := range c.Kinds {
		if err := checkName("kind class", cl.Name, seen); err != nil {
			return err
		}
		if len(cl.Kinds) == 0 {
			return fmt.Errorf("%w: kind class %q has no kinds", ErrPolicy, cl.Name)
		}
		for _, r := range cl.Kinds {
			if r.From < 0 || r.To > 65535 || r.From > r.To {
				return fmt.Errorf("%w: kind class %q: kinds %d-%d must lie within 0-65535, low to high", ErrPolicy, cl.Name, r.From, r.To)
			}
			for k := r.From; k <= r.To; k++ {
				if other, ok := classOf[k]; ok && other != cl.Name {
					return fmt.Errorf("%w: kind %d is in both kind classes %q and %q", ErrPolicy, k, other, cl.Name)
				}
				classOf[k] = cl.Name
			}
		}
		if len(cl.Limits) == 0 {
			return fmt.Errorf("%w: kind class %q has no limits", ErrPolicy, cl.Name)
		}
		if err := ratelimit.ValidateLimits(cl.Limits); err != nil {
			return fmt.Errorf("policy: kind class %q: %w", cl.Name, err)
		}
	}
	if len(c.Tiers) > maxTiers {
		return fmt.Errorf("%w: %d tiers, at most %d", ErrPolicy, len(c.Tiers), maxTiers)
	}
	tierOf := map[wire.Hex32]string{}
	seen = map[string]bool{}
	for _, t := range c.Tiers {
		if err := checkName("tier", t.Name, seen); err != nil {
			return err
		}
		if !t.Free {
			if err := t.Limits.validateMessages(); err != nil {
				return fmt.Errorf("policy: tier %q: %w", t.Name, err)
			}
		}
		for _, pk := range t.Pubkeys {
			k, ok := wire.DecodeHex32(pk)
			if !ok || k.String() != pk {
				return fmt.Errorf("%w: tier %q: pubkey %q is not 64 lowercase hex digits", ErrPolicy, t.Name, pk)
			}
			if other, dup := tierOf[k]; dup && other != t.Name {
				return fmt.Errorf("%w: pubkey %s is in both tiers %q and %q", ErrPolicy, pk, other, t.Name)
			}
			tierOf[k] = t.Name
		}
	}
	if len(c.Aggregates) > maxAggregates {
		return fmt.Errorf("%w: %d aggregates, at most %d", ErrPolicy, len(c.Aggregates), maxAggregates)
	}
	for _, a := range c.Aggregates {
		what := fmt.Sprintf("IPv6 /%d", a.Bits)
		max := 127
		if a.V4 {
			what, max = fmt.Sprintf("IPv4 /%d", a.Bits), 31
		}
		if a.Bits < 8 || a.Bits > max {
			return fmt.Errorf("%w: aggregate %s: the prefix must be 8 to %d bits", ErrPolicy, what, max)
		}
		if len(a.Limits) == 0 {
			return fmt.Errorf("%w: aggregate %s has no limits", ErrPolicy, what)
		}
		if err := ratelimit.ValidateLimits(a.Limits); err != nil {
			return fmt.Errorf("policy: aggregate %s: %w", what, err)
		}
	}
	return nil
}

// validateMessages checks the windows of every message type with
// ratelimit.ValidateLimits; an error names the type.
func (l *Limits) validateMessages() error {
	for t := range l.Message {
		if err := ratelimit.ValidateLimits(l.Message[t]); err != nil {
			return fmt.Errorf("policy: %v limits: %w", wire.Type(t), err)
		}
	}
	return nil
}
