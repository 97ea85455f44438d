package policy

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
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

// maxMaxDelay is the longest Limits.MaxDelay: a held frame pauses its
// connection's reading, and ten seconds stays well inside the keepalive
// (two ping intervals) of either side.
const maxMaxDelay = 10 * time.Second

// FieldError is one thing wrong with a configuration: the field, by its
// Path in Go's terms from the value validated ("Limits.Message[EVENT][1]",
// "Tiers[0].Pubkeys[3]", "Identity.AllowIPs[2]"; relay.Options.Validate
// puts "Policy." in front of a Config's), and what is wrong with it. A
// window the ratelimit package refuses has an Err wrapping
// ratelimit.ErrInvalidLimit. Config.Validate returns errors.Join of them:
// find them with errors.As, or walk the join.
type FieldError struct {
	Path string
	Err  error
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// fieldErrors collects the FieldErrors of one validation.
type fieldErrors []error

func (errs *fieldErrors) add(path string, err error) {
	*errs = append(*errs, &FieldError{Path: path, Err: err})
}

func (errs *fieldErrors) addf(path, format string, args ...any) {
	errs.add(path, fmt.Errorf(format, args...))
}

// Validate reports everything wrong with c that a Gate or Hooks would
// refuse, as errors.Join of *FieldError in the order of c's fields: the
// limits (each window must pass ratelimit.Limit.Validate, at most
// ratelimit.MaxWindows of them and no period twice, as
// ratelimit.ValidateLimits has it), the bounds, the kind classes, the
// tiers, the aggregates, the identity. relay.New, relay.Gate.Reload and
// hooks.New refuse what Validate refuses. It
// returns nil for a valid c.
func (c *Config) Validate() error {
	var errs fieldErrors
	lim := DefaultLimits()
	if c.Limits != nil {
		lim = *c.Limits
	}
	checkWindows(&errs, "Limits.Connection", lim.Connection)
	lim.checkMessages(&errs, "Limits")
	if lim.MaxDelay < 0 || lim.MaxDelay > maxMaxDelay {
		errs.addf("Limits.MaxDelay", "must be between 0 (hold nothing) and %v, got %v", maxMaxDelay, lim.MaxDelay)
	}
	checkRead(&errs, "Limits.Read", lim.Read)
	c.ReadCost.validate(&errs, "ReadCost")

	b := c.Bounds
	for _, f := range []struct {
		name   string
		v, max int
	}{
		{"MaxTags", b.MaxTags, maxMaxTags},
		{"MaxTagValueBytes", b.MaxTagValueBytes, maxMaxTagValueBytes},
		{"MaxFilterValues", b.MaxFilterValues, maxMaxFilterValues},
		{"MaxFanout", b.MaxFanout, maxMaxFanout},
	} {
		if f.v < 0 || f.v > f.max {
			errs.addf("Bounds."+f.name, "must be between 0 (its default) and %d, got %d", f.max, f.v)
		}
	}

	if len(c.Kinds) > maxClasses {
		errs.addf("Kinds", "%d kind classes, at most %d", len(c.Kinds), maxClasses)
	}
	classOf := map[int]string{}
	seen := map[string]bool{}
	for i, cl := range c.Kinds[:min(len(c.Kinds), maxClasses)] {
		path := fmt.Sprintf("Kinds[%d]", i)
		checkName(&errs, path+".Name", "kind class", cl.Name, seen)
		if len(cl.Kinds) == 0 {
			errs.addf(path+".Kinds", "must list at least one kind")
		}
		for j, r := range cl.Kinds {
			p := fmt.Sprintf("%s.Kinds[%d]", path, j)
			if r[0] < 0 || r[1] > 65535 || r[0] > r[1] {
				errs.addf(p, "kinds %d-%d must lie within 0-65535, low to high", r[0], r[1])
				continue
			}
			for k := r[0]; k <= r[1]; k++ {
				if other, ok := classOf[k]; ok && other != cl.Name {
					errs.addf(p, "kind %d is also in kind class %q", k, other)
					break
				}
				classOf[k] = cl.Name
			}
		}
		if len(cl.Limits) == 0 {
			errs.addf(path+".Limits", "must list at least one window")
		}
		checkWindows(&errs, path+".Limits", cl.Limits)
	}

	if len(c.Tiers) > maxTiers {
		errs.addf("Tiers", "%d tiers, at most %d", len(c.Tiers), maxTiers)
	}
	tierOf := map[scan.Hex32]string{}
	seen = map[string]bool{}
	for i, t := range c.Tiers[:min(len(c.Tiers), maxTiers)] {
		path := fmt.Sprintf("Tiers[%d]", i)
		checkName(&errs, path+".Name", "tier", t.Name, seen)
		t.Limits.checkMessages(&errs, path+".Limits")
		checkRead(&errs, path+".Limits.Read", t.Limits.Read)
		for j, pk := range t.Pubkeys {
			p := fmt.Sprintf("%s.Pubkeys[%d]", path, j)
			k, ok := scan.DecodeHex32(pk)
			if !ok || k.String() != pk {
				errs.addf(p, "must be 64 lowercase hex digits, got %q", pk)
				continue
			}
			if other, dup := tierOf[k]; dup && other != t.Name {
				errs.addf(p, "pubkey %s is also in tier %q", pk, other)
				continue
			}
			tierOf[k] = t.Name
		}
	}

	if len(c.Aggregates) > maxAggregates {
		errs.addf("Aggregates", "%d aggregates, at most %d", len(c.Aggregates), maxAggregates)
	}
	clientBits := c.Identity.IPv6Prefix
	if clientBits <= 0 || clientBits > 128 {
		clientBits = 64
	}
	type family struct {
		v4   bool
		bits int
	}
	seenAgg := map[family]bool{}
	for i, a := range c.Aggregates[:min(len(c.Aggregates), maxAggregates)] {
		path := fmt.Sprintf("Aggregates[%d]", i)
		// An aggregate narrower than a client is no aggregate: its
		// clients would never share it.
		lo, hi, why := 8, clientBits-1, "wider than the IPv6 client prefix"
		if a.V4 {
			hi, why = 31, "wider than one address"
		}
		switch {
		case a.Bits < lo || a.Bits > hi:
			errs.addf(path+".Bits", "must be %d to %d (%s), got %d", lo, hi, why, a.Bits)
		case seenAgg[family{a.V4, a.Bits}]:
			errs.addf(path+".Bits", "/%d is listed twice", a.Bits)
		}
		seenAgg[family{a.V4, a.Bits}] = true
		if len(a.Limits) == 0 && len(a.Read) == 0 {
			errs.addf(path+".Limits", "must list at least one window (or Read one)")
		}
		checkWindows(&errs, path+".Limits", a.Limits)
		checkRead(&errs, path+".Read", a.Read)
	}

	c.Identity.validate(&errs)
	if c.Penalty != nil {
		if err := c.Penalty.Validate(); err != nil {
			errs.add("Penalty", err)
		}
	}
	return errors.Join(errs...)
}

// checkWindows adds an error for each window of ls at path that the
// ratelimit package refuses: one Limit.Validate refuses, the first past
// ratelimit.MaxWindows (those beyond it are not looked at), and one whose
// period an earlier window has (ratelimit.NewWindows).
func checkWindows(errs *fieldErrors, path string, ls []ratelimit.Limit) {
	ok := make([]ratelimit.Limit, 0, ratelimit.MaxWindows+1)
	for i, l := range ls[:min(len(ls), ratelimit.MaxWindows+1)] {
		p := fmt.Sprintf("%s[%d]", path, i)
		if i == ratelimit.MaxWindows {
			errs.add(p, fmt.Errorf("%w: %d windows, at most %d", ratelimit.ErrInvalidLimit, len(ls), ratelimit.MaxWindows))
			break
		}
		if err := l.Validate(); err != nil {
			errs.add(p, err)
			continue
		}
		if _, err := ratelimit.NewWindows(append(ok, l)...); err != nil {
			errs.add(p, err) // a period an earlier window has
			continue
		}
		ok = append(ok, l)
	}
}

// checkMessages checks the windows of every message type, under
// path.Message[TYPE].
func (l *Limits) checkMessages(errs *fieldErrors, path string) {
	for t := range l.Message {
		checkWindows(errs, fmt.Sprintf("%s.Message[%v]", path, wire.Type(t)), l.Message[t])
	}
}
