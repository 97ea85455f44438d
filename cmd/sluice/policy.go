package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goccy/go-yaml/ast"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// This file reads the policy sections of the config (issue 14): mode,
// shadow windows, kind classes, member tiers and prefix aggregates, and
// builds the one policy.Config that start-up, `sluice check` and a SIGHUP
// reload all compile.

// kindClassConfig is one limits.kinds entry.
type kindClassConfig struct {
	Kinds  []kindSpec    `yaml:"kinds"`
	Limits []limitConfig `yaml:"limits"`
}

// kindSpec is a kind (7) or an inclusive range of kinds ("20000-29999").
type kindSpec struct{ from, to int64 }

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (k *kindSpec) UnmarshalYAML(n ast.Node) error {
	switch n := n.(type) {
	case *ast.IntegerNode:
		switch v := n.Value.(type) {
		case int64:
			k.from, k.to = v, v
			return nil
		case uint64:
			if v <= math.MaxInt32 {
				k.from, k.to = int64(v), int64(v)
				return nil
			}
		}
	case *ast.StringNode:
		a, b, ok := strings.Cut(n.Value, "-")
		from, errA := strconv.ParseInt(strings.TrimSpace(a), 10, 64)
		to, errB := strconv.ParseInt(strings.TrimSpace(b), 10, 64)
		if ok && errA == nil && errB == nil {
			k.from, k.to = from, to
			return nil
		}
	}
	return typeError(n, `a kind (a whole number) or a range of kinds ("20000-29999")`)
}

// tierConfig is one tiers entry.
type tierConfig struct {
	Pubkeys     []string         `yaml:"pubkeys"`
	PubkeysFile string           `yaml:"pubkeys_file"`
	Limits      tierLimitsConfig `yaml:"limits"`
	Quota       *tierQuotaConfig `yaml:"quota"`
}

// tierLimitsConfig is a tier's limits: per message type only (a
// connection is charged at its upgrade, before any AUTH).
type tierLimitsConfig struct {
	Message map[string][]limitConfig `yaml:"message"`
}

// tierQuotaConfig is a tier's quota; a field left out is the global
// quota's.
type tierQuotaConfig struct {
	Events    *integer `yaml:"events"`
	Window    string   `yaml:"window"`
	Unlimited boolean  `yaml:"unlimited"`
}

// aggregateConfig is one identity.ipv6_aggregate or ipv4_aggregate entry.
type aggregateConfig struct {
	Prefix *integer      `yaml:"prefix"`
	Limits []limitConfig `yaml:"limits"`
}

// tierSpec is a validated tier: the policy's Tier without its quota,
// which is built on the store the binary runs (buildPolicy).
type tierSpec struct {
	policy.Tier
	// QuotaSet: the tier has a quota of its own, of QuotaEvents per
	// QuotaWindow, or none when QuotaUnlimited.
	QuotaSet       bool
	QuotaEvents    int
	QuotaWindow    time.Duration
	QuotaUnlimited bool
	// File is the pubkeys_file as resolved ("" for none).
	File string
}

// maxPubkeysFile bounds a tier's pubkeys_file: 64 MiB is about 800,000
// npubs, past which a tier is a database, not a config.
const maxPubkeysFile = 64 << 20

// validatePolicy reads mode, the kind classes, the tiers and the
// aggregates of fc into c (c.Limits, c.QuotaEvents/Window and
// c.Identity.IPv6Prefix already read), naming each bad field.
func (fc *fileConfig) validatePolicy(c *config, bad func(string, string, ...any)) {
	switch fc.Mode {
	case "enforce":
	case "shadow":
		c.Shadow = true
	default:
		bad("mode", "must be enforce or shadow, got %q", fc.Mode)
	}

	names := slices.Sorted(maps.Keys(fc.Limits.Kinds))
	if len(names) > policy.MaxClasses {
		bad("limits.kinds", "%d kind classes, at most %d", len(names), policy.MaxClasses)
	}
	owner := map[int64]string{} // kind → class, for a kind in two classes
	for _, name := range names {
		path := "limits.kinds." + name
		kc := fc.Limits.Kinds[name]
		if !validName(name) {
			bad(path, "a class name is 1 to 32 letters, digits, '_' or '-'")
			continue
		}
		if len(kc.Kinds) == 0 {
			bad(path+".kinds", "must list at least one kind (7) or range (\"20000-29999\")")
			continue
		}
		cl := policy.Class{Name: name}
		ok := true
		for i, k := range kc.Kinds {
			p := fmt.Sprintf("%s.kinds[%d]", path, i)
			if k.from < 0 || k.to > 65535 || k.from > k.to {
				bad(p, "kinds %d-%d must lie within 0-65535, low to high", k.from, k.to)
				ok = false
				continue
			}
			if k.to-k.from <= 65535 {
				for x := k.from; x <= k.to; x++ {
					if other, dup := owner[x]; dup && other != name {
						bad(p, "kind %d is also in kind class %q", x, other)
						ok = false
						break
					}
					owner[x] = name
				}
			}
			cl.Kinds = append(cl.Kinds, policy.KindRange{From: int(k.from), To: int(k.to)})
		}
		if len(kc.Limits) == 0 {
			bad(path+".limits", "must list at least one window")
			continue
		}
		cl.Limits = resolveLimits(path+".limits", kc.Limits, bad)
		if ok && cl.Limits != nil {
			c.Kinds = append(c.Kinds, cl)
		}
	}

	names = slices.Sorted(maps.Keys(fc.Tiers))
	if len(names) > policy.MaxTiers {
		bad("tiers", "%d tiers, at most %d", len(names), policy.MaxTiers)
	}
	member := map[string]string{} // pubkey → tier
	for _, name := range names {
		path := "tiers." + name
		tc := fc.Tiers[name]
		if !validName(name) {
			bad(path, "a tier name is 1 to 32 letters, digits, '_' or '-'")
			continue
		}
		ts := tierSpec{Tier: policy.Tier{Name: name}}
		ok := true
		add := func(where, s string) {
			pk, err := parsePubkey(s)
			if err == nil {
				if _, hex := wire.DecodeHex32(pk); !hex {
					err = fmt.Errorf("must be 64 hex digits or an npub, got %q", s)
				}
			}
			if err != nil {
				bad(where, "%v", err)
				ok = false
				return
			}
			pk = strings.ToLower(pk)
			if other, dup := member[pk]; dup {
				if other != name {
					bad(where, "pubkey %s is also in tier %q", pk, other)
					ok = false
				}
				return
			}
			member[pk] = name
			ts.Pubkeys = append(ts.Pubkeys, pk)
		}
		for i, s := range tc.Pubkeys {
			add(fmt.Sprintf("%s.pubkeys[%d]", path, i), s)
		}
		if tc.PubkeysFile != "" {
			ts.File = tc.PubkeysFile
			if !filepath.IsAbs(ts.File) && fc.dir != "" {
				ts.File = filepath.Join(fc.dir, ts.File)
			}
			if err := readPubkeysFile(ts.File, func(line int, s string) {
				add(fmt.Sprintf("%s.pubkeys_file (%s, line %d)", path, ts.File, line), s)
			}); err != nil {
				bad(path+".pubkeys_file", "%v", err)
				ok = false
			}
		}
		if len(ts.Pubkeys) == 0 && ok {
			bad(path, "has no members: give pubkeys or a pubkeys_file with at least one")
			continue
		}
		// A type the tier does not name keeps the address's windows.
		ts.Limits.Message = c.Limits.Message
		for _, label := range slices.Sorted(maps.Keys(tc.Limits.Message)) {
			p := path + ".limits.message." + label
			t, known := relay.ParseType(label)
			if !known {
				bad(p, "unknown message type; known are %s", knownTypes())
				ok = false
				continue
			}
			ls := tc.Limits.Message[label]
			if ls == nil {
				bad(p, "must be a list of windows; write [] to let %s pass free", label)
				ok = false
				continue
			}
			if t == relay.TypeOther && len(ls) == 0 {
				bad(p, "must have at least one window: the catch-all bucket is never free")
				ok = false
				continue
			}
			r := resolveLimits(p, ls, bad)
			if r == nil && len(ls) > 0 {
				ok = false
			}
			ts.Limits.Message[t] = r
		}
		if q := tc.Quota; q != nil {
			ts.QuotaSet = true
			ts.QuotaUnlimited = bool(q.Unlimited)
			ts.QuotaEvents, ts.QuotaWindow = c.QuotaEvents, c.QuotaWindow
			if q.Events != nil {
				ts.QuotaEvents = int(max(min(*q.Events, math.MaxInt32), math.MinInt32))
			}
			if q.Window != "" {
				if d, err := parseDuration(q.Window); err != nil {
					bad(path+".quota.window", "%v", err)
					ok = false
				} else if d < time.Second || d > maxPeriod {
					bad(path+".quota.window", "must be between 1s and %v, got %v", maxPeriod, d)
					ok = false
				} else {
					ts.QuotaWindow = d
				}
			}
			events := int64(c.QuotaEvents)
			if q.Events != nil {
				events = int64(*q.Events)
			}
			if msg := quotaEventsProblem(events, path+".quota.unlimited"); msg != "" {
				bad(path+".quota.events", "%s", msg)
				ok = false
			} else if ok && ts.QuotaWindow > 0 {
				if _, err := ratelimit.NewQuota(ts.QuotaEvents, ts.QuotaWindow); err != nil {
					bad(path+".quota.events", "%v", err)
					ok = false
				}
			}
		}
		if ok {
			c.Tiers = append(c.Tiers, ts)
		}
	}

	nAggs := len(fc.Identity.IPv6Aggregate) + len(fc.Identity.IPv4Aggregate)
	if nAggs > policy.MaxAggregates {
		bad("identity", "%d prefix aggregates (ipv6_aggregate and ipv4_aggregate), at most %d", nAggs, policy.MaxAggregates)
	}
	for _, fam := range []struct {
		field  string
		v4     bool
		lo, hi int64
		why    string
	}{
		{"identity.ipv6_aggregate", false, 8, int64(min(fc.Identity.IPv6Prefix, 128)) - 1, "wider than identity.ipv6_prefix"},
		{"identity.ipv4_aggregate", true, 8, 31, "wider than a whole address"},
	} {
		list := fc.Identity.IPv6Aggregate
		if fam.v4 {
			list = fc.Identity.IPv4Aggregate
		}
		seen := map[int64]bool{}
		for i, ac := range list {
			path := fmt.Sprintf("%s[%d]", fam.field, i)
			if ac.Prefix == nil {
				bad(path+".prefix", "is required (e.g. 48 for IPv6, 24 for IPv4)")
				continue
			}
			bits := int64(*ac.Prefix)
			if bits < fam.lo || bits > fam.hi {
				bad(path+".prefix", "must be %d to %d (%s), got %d", fam.lo, fam.hi, fam.why, bits)
				continue
			}
			if seen[bits] {
				bad(path+".prefix", "/%d is listed twice", bits)
				continue
			}
			seen[bits] = true
			if len(ac.Limits) == 0 {
				bad(path+".limits", "must list at least one window")
				continue
			}
			if ls := resolveLimits(path+".limits", ac.Limits, bad); ls != nil {
				c.Aggregates = append(c.Aggregates, policy.Aggregate{Bits: int(bits), V4: fam.v4, Limits: ls})
			}
		}
	}
}

// readPubkeysFile calls add with every pubkey of the file at path: one a
// line, '#' starting a comment, blank lines skipped.
func readPubkeysFile(path string, add func(line int, s string)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// A FIFO or a device would hold start-up (or a reload) on a read that
	// may never end.
	if st, err := f.Stat(); err != nil {
		return err
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	sc := bufio.NewScanner(io.LimitReader(f, maxPubkeysFile+1))
	n, size := 0, 0
	for sc.Scan() {
		n++
		size += len(sc.Bytes()) + 1
		if size > maxPubkeysFile {
			return fmt.Errorf("%s is larger than %d bytes", path, maxPubkeysFile)
		}
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line != "" {
			add(n, line)
		}
	}
	return sc.Err()
}

func validName(s string) bool {
	if len(s) < 1 || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// quotaMaker returns the actor quota of owner ("" for the global one, else
// a tier's name): events per window, or none when unlimited.
type quotaMaker func(owner string, events int, window time.Duration, unlimited bool) (ratelimit.ActorQuota, error)

// localQuotas makes in-process quotas on clock (nil: the real one), a new
// one at every call: what `sluice check` and validation compile with.
func localQuotas(clock ratelimit.Clock) quotaMaker {
	return func(_ string, events int, window time.Duration, unlimited bool) (ratelimit.ActorQuota, error) {
		if unlimited {
			return ratelimit.Unlimited().WithClock(clock), nil
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
	owner     string
	events    int
	window    time.Duration
	unlimited bool
}

func (qc *quotaCache) make(owner string, events int, window time.Duration, unlimited bool) (ratelimit.ActorQuota, error) {
	k := quotaKey{owner, events, window, unlimited}
	if unlimited {
		k.events, k.window = 0, 0
	}
	qc.mu.Lock()
	defer qc.mu.Unlock()
	if q, ok := qc.made[k]; ok {
		return q, nil
	}
	var q ratelimit.ActorQuota
	var err error
	switch {
	case unlimited:
		q = ratelimit.Unlimited().WithClock(qc.limiter.Now)
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
	pc := policy.Config{
		Limits:     c.Limits,
		MaxFilters: c.MaxFilters,
		Bounds:     c.Bounds,
		Kinds:      c.Kinds,
		Aggregates: c.Aggregates,
		Shadow:     c.Shadow,
		Identity:   c.Identity,
	}
	var err error
	if !c.QuotaUnlimited {
		if pc.Quota, err = mk("", c.QuotaEvents, c.QuotaWindow, false); err != nil {
			return pc, fmt.Errorf("%w: quota: %v", errConfig, err)
		}
	}
	for _, ts := range c.Tiers {
		t := ts.Tier
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
		if t.Free {
			continue
		}
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
