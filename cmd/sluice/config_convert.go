package main

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// This file turns a fileConfig into the library's types (a config, from
// which buildPolicy makes the policy.Config and gateOptions the
// relay.Options), asks the library about them, and names the file's field
// in each error the library reports. Conversion keeps every list the
// length the file has (an entry it cannot read becomes a value the library
// refuses, whose error is then not repeated), so the library's indexes are
// the file's.

// libPaths maps the library's field paths (policy.FieldError.Path) onto
// the file's: the kind classes, tiers and aggregates are lists in the
// library and named or split entries in the file.
type libPaths struct {
	c     *config
	kinds []string // Kinds[i]: "limits.kinds.<name>"
	tiers []string // Tiers[i]: "tiers.<name>"
	aggs  []string // Aggregates[i]: "identity.ipv6_aggregate[k]"
	// windows are the file's windows the library took, by path, for the
	// binary's own bounds (checker.checkWindow).
	windows []pathLimit
}

type pathLimit struct {
	path string
	l    ratelimit.Limit
}

// fileFields are the file's names of the library's top-level fields, by
// the library's path.
var fileFields = []struct{ lib, file string }{
	{"Limits", "limits"},
	{"Bounds.MaxFilters", "limits.max_filters"},
	{"Bounds.MaxTags", "limits.max_event_tags"},
	{"Bounds.MaxTagValueBytes", "limits.max_tag_value_bytes"},
	{"Bounds.MaxFilterValues", "limits.max_filter_values"},
	{"Bounds.MaxFanout", "limits.max_filter_fanout"},
	{"Kinds", "limits.kinds"},
	{"ReadCost", "limits.read_cost"},
	{"Tiers", "tiers"},
	{"Aggregates", "identity"},
	{"Identity.IPv6Prefix", "identity.ipv6_prefix"},
	{"Identity.TrustedProxies", "identity.trusted_proxies"},
	{"Identity.Header", "identity.header"},
	{"Identity.AllowIPs", "allow.ips"},
	{"Identity.AllowPubkeys", "allow.pubkeys"},
	{"FrameSize", "limits.frame_size"},
	{"RelayURL", "relay_url"},
	{"QueueBytes", "limits.max_queued_bytes"},
	{"Penalty", "penalty"},
}

// fileNames are the file's names of nested library fields; "" drops the
// segment (a class's or tier's Name is its key in the file).
var fileNames = map[string]string{
	"Connection": "connection", "Message": "message", "Limits": "limits", "Kinds": "kinds",
	"Read": "read", "Narrow": "narrow", "Wide": "wide", "Scrape": "scrape",
	"ScrapeLimit": "scrape_limit", "ScrapeSpan": "scrape_span", "Rate": "rate", "Cost": "cost",
	"Bits": "prefix", "Pubkeys": "pubkeys", "Name": "", "MaxDelay": "max_delay",
}

var (
	listEntryRE = regexp.MustCompile(`^(Kinds|Tiers|Aggregates)\[(\d+)\](.*)$`)
	memberRE    = regexp.MustCompile(`^\.Pubkeys\[(\d+)\]$`)
	segmentRE   = regexp.MustCompile(`\.([A-Za-z0-9]+)|\[([^\]]*)\]`)
)

// file returns the file's path of the library's path p, or p itself when
// it names nothing the file has.
func (lp *libPaths) file(p string) string {
	p = strings.TrimPrefix(p, "Policy.")
	if m := listEntryRE.FindStringSubmatch(p); m != nil {
		i, _ := strconv.Atoi(m[2])
		var list []string
		switch m[1] {
		case "Kinds":
			list = lp.kinds
		case "Tiers":
			list = lp.tiers
		case "Aggregates":
			list = lp.aggs
		}
		if i >= len(list) {
			return p
		}
		if mm := memberRE.FindStringSubmatch(m[3]); m[1] == "Tiers" && mm != nil {
			return lp.member(i, mm[1])
		}
		return list[i] + fileSegments(m[3])
	}
	for _, f := range fileFields {
		if p == f.lib || within(p, f.lib) {
			return f.file + fileSegments(p[len(f.lib):])
		}
	}
	return p
}

// member names where tier i's j-th pubkey came from.
func (lp *libPaths) member(i int, j string) string {
	k, _ := strconv.Atoi(j)
	ts := lp.c.Tiers[i]
	if k >= len(ts.from) {
		return lp.tiers[i] + ".pubkeys"
	}
	if f := ts.from[k]; f >= 0 {
		return fmt.Sprintf("%s.pubkeys[%d]", lp.tiers[i], f)
	} else {
		return fmt.Sprintf("%s.pubkeys_file (%s, line %d)", lp.tiers[i], ts.File, -f)
	}
}

// fileSegments turns the rest of a library path (".Limits.Message[REQ][0]")
// into the file's (".limits.message.REQ[0]").
func fileSegments(rest string) string {
	var b strings.Builder
	for _, m := range segmentRE.FindAllStringSubmatch(rest, -1) {
		switch {
		case m[1] != "":
			name, ok := fileNames[m[1]]
			if !ok {
				name = m[1]
			}
			if name != "" {
				b.WriteString("." + name)
			}
		case m[2] != "" && strings.Trim(m[2], "0123456789") == "":
			b.WriteString("[" + m[2] + "]")
		default:
			b.WriteString("." + m[2])
		}
	}
	return b.String()
}

// library asks relay.Options.Validate about what the file converts into
// and reports each of its errors at the file's path, unless the binary
// has reported a problem there already; then the binary's own bounds on
// the windows the library took.
func (v *checker) library(c *config, lp *libPaths) {
	pc, _ := buildPolicy(c, func(string, int, time.Duration, bool) (ratelimit.ActorQuota, error) { return nil, nil })
	opts := gateOptions(c, pc)
	if v.covered("read_limit") {
		// Frame sizes would be judged against a read limit that is wrong.
		opts.ReadLimit, opts.FrameSize = 0, [wire.NumTypes]int{}
	}
	var fes []*policy.FieldError
	if err := opts.Validate(); err != nil {
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			var fe *policy.FieldError
			if errors.As(e, &fe) {
				fes = append(fes, fe)
			}
		}
	}
	for _, fe := range fes {
		if p := lp.file(fe.Path); !v.covered(p) {
			v.bad(p, "%v", fe.Err)
		}
	}
	for _, w := range lp.windows {
		if !v.covered(w.path) {
			v.checkWindow(w.path, w.l)
		}
	}
}

// gateOptions is the one place relay.Options are made from a config: its
// policy pc, read limit, frame sizes, relay URL and caps. The caller adds
// the limiter, Stored, the observer and the logger.
func gateOptions(c *config, pc policy.Config) relay.Options {
	return relay.Options{
		Policy:           pc,
		ReadLimit:        c.ReadLimit,
		FrameSize:        c.FrameSize,
		RelayURL:         c.RelayURL,
		MaxSubscriptions: c.Subscriptions,
		MaxConnections:   c.MaxConnections,
		MaxSyncs:         c.Syncs,
		MaxFilterBytes:   c.MaxFilterBytes,
		QueueBytes:       c.QueueBytes,
	}
}

// convert reads fc into a config, reporting what the binary refuses as
// it goes.
func (v *checker) convert() (*config, *libPaths) {
	fc := v.fc
	c := &config{
		Listen:           fc.Listen,
		MetricsListen:    fc.MetricsListen,
		DataDir:          fc.DataDir,
		Database:         fc.Database,
		Upstream:         fc.Upstream,
		UpstreamVerifies: bool(fc.UpstreamVerifies),
		RelayURL:         fc.RelayURL,
		ReadLimit:        int64(fc.ReadLimit),
		MaxSyncEvents:    int(min(max(fc.MaxSyncEvents, 0), maxMaxSyncEvents)),
		LogFormat:        fc.Log.Format,
		LogLevel:         fc.Log.Level,
		Info:             fc.Info,
		Redis:            fc.Store.Redis,
		Prefix:           fc.Store.Prefix,
		QuotaEvents:      int(fc.Quota.Events),
		QuotaUnlimited:   bool(fc.Quota.Unlimited),
	}
	lp := &libPaths{c: c}
	v.checkBasics(c)
	v.checkCaps(c)

	switch fc.Auth {
	case "relay":
	case "gate":
		c.GateAuth = true
	default:
		v.bad("auth", "must be relay or gate, got %q", fc.Auth)
	}

	switch fc.Mode {
	case "enforce":
	case "shadow":
		c.Shadow = true
	default:
		v.bad("mode", "must be enforce or shadow, got %q", fc.Mode)
	}

	// A null where a list or mapping belongs would otherwise read as "no
	// limits at all" (parseConfigOver refuses it in a file; this guards
	// every other way in).
	if fc.Limits.Connection == nil {
		v.bad("limits.connection", "must be a list of windows; write [] for no connection limit")
	}
	if fc.Limits.Message == nil {
		v.bad("limits.message", "must be a mapping of message types to windows; leave it out to keep the defaults")
	}
	c.Limits.Connection = v.windows(lp, "limits.connection", fc.Limits.Connection)
	v.messages(lp, "limits.message", fc.Limits.Message, &c.Limits)
	if d, err := parseDuration(fc.Limits.MaxDelay); err != nil {
		v.bad("limits.max_delay", "%v", err)
	} else {
		c.Limits.MaxDelay = d // bounded by policy.Config.Validate
	}
	if fc.Limits.Read == nil {
		v.bad("limits.read", "must be a list of windows; write [] for no read budget")
	}
	c.Limits.Read = v.windows(lp, "limits.read", fc.Limits.Read)
	rc := fc.Limits.ReadCost
	c.ReadCost = policy.ReadCost{Narrow: int(rc.Narrow), Wide: int(rc.Wide), Scrape: int(rc.Scrape), ScrapeLimit: int(min(rc.ScrapeLimit, math.MaxInt32))}
	if rc.ScrapeSpan != "" {
		if d, err := time.ParseDuration(rc.ScrapeSpan); err != nil || d <= 0 {
			v.bad("limits.read_cost.scrape_span", "must be a positive duration such as 2h, got %q", rc.ScrapeSpan)
		} else {
			c.ReadCost.ScrapeSpan = d
		}
	}

	c.Bounds = wire.Bounds{
		MaxTags:          int(fc.Limits.MaxEventTags),
		MaxTagValueBytes: int(fc.Limits.MaxTagValueBytes),
		MaxFilterValues:  int(fc.Limits.MaxFilterValues),
		MaxFanout:        int(fc.Limits.MaxFilterFanout),
	}
	for _, label := range slices.Sorted(maps.Keys(fc.Limits.FrameSize)) {
		path := "limits.frame_size." + label
		t, known := parseType(label)
		switch n := fc.Limits.FrameSize[label]; {
		case !known:
			v.bad(path, "unknown message type; known are %s", forwardedTypes())
		case t == wire.TypeOther:
			// OTHER frames are answered by the gate, never forwarded: a
			// size for them would bound nothing.
			v.bad(path, "OTHER frames are never forwarded; sizes are for %s", forwardedTypes())
		case n < minFrameSize:
			// The gate reads 0 as its default; in the file a size is a
			// size, and below minFrameSize it bounds nothing.
			v.bad(path, "must be at least %d bytes, got %d", minFrameSize, n)
		default:
			c.FrameSize[t] = int(min(n, math.MaxInt32))
		}
	}

	if d, ok := v.checkQuotaWindow("quota.window", fc.Quota.Window); ok {
		c.QuotaWindow = d
	}
	// Checked even when unlimited: 0 there is a mistake in the making.
	if msg := quotaEventsProblem(int64(fc.Quota.Events), "quota.unlimited"); msg != "" {
		v.bad("quota.events", "%s", msg)
	}

	v.penalty(c)
	v.identity(c)
	v.kinds(c, lp)
	v.tiers(c, lp)
	v.aggregates(c, lp)
	return c, lp
}

// penalty reads the penalty section: durations here, the rest is the
// library's to refuse (ratelimit.Penalty.Validate, reported at "penalty").
// Off, it is read all the same, so a mistake shows before it is turned on.
func (v *checker) penalty(c *config) {
	fc := v.fc.Penalty
	p := ratelimit.Penalty{Threshold: float64(fc.Threshold)}
	for _, f := range []struct {
		path, s string
		d       *time.Duration
	}{{"penalty.half_life", fc.HalfLife, &p.HalfLife}, {"penalty.ban", fc.Ban, &p.Ban}, {"penalty.max_ban", fc.MaxBan, &p.MaxBan}} {
		d, err := parseDuration(f.s)
		if err != nil {
			v.bad(f.path, "%v", err)
			continue
		}
		*f.d = d
	}
	if p.Threshold <= 0 {
		v.bad("penalty.threshold", "must be greater than 0, got %v", fc.Threshold)
	}
	if bool(fc.Enabled) {
		c.Penalty = &p
	} else if err := p.Validate(); err != nil && !v.covered("penalty") {
		v.bad("penalty", "%v", err)
	}
}

// windows reads the windows at path, one for one: a window the file
// cannot mean (a field missing, a period that is not a duration, a cost of
// 0, which ratelimit.Limit reads as 1) is reported and kept as it reads,
// for the library to refuse in silence.
func (v *checker) windows(lp *libPaths, path string, ls []limitConfig) []ratelimit.Limit {
	out := make([]ratelimit.Limit, len(ls))
	for i, lc := range ls {
		p := fmt.Sprintf("%s[%d]", path, i)
		fine := true
		l := ratelimit.Limit{Cost: 1, Shadow: bool(lc.Shadow)}
		if lc.Rate == nil {
			v.bad(p+".rate", "is required")
			fine = false
		} else {
			l.Rate = float64(*lc.Rate)
		}
		if lc.Cost != nil {
			if l.Cost = float64(*lc.Cost); l.Cost == 0 {
				v.bad(p+".cost", "must be greater than 0 (leave it out for the default, 1)")
				fine = false
			}
		}
		if lc.Period == "" {
			v.bad(p+".period", "is required")
			fine = false
		} else if d, err := parseDuration(lc.Period); err != nil {
			v.bad(p+".period", "%v", err)
			fine = false
		} else {
			l.Period = d
		}
		out[i] = l
		if fine {
			lp.windows = append(lp.windows, pathLimit{p, l})
		}
	}
	return out
}

// messages reads a limits.message mapping into lim.Message: a type it
// names replaces lim's windows for that type.
func (v *checker) messages(lp *libPaths, path string, msg map[string][]limitConfig, lim *policy.Limits) {
	for _, label := range slices.Sorted(maps.Keys(msg)) {
		p := path + "." + label
		t, known := parseType(label)
		ls := msg[label]
		switch {
		case !known:
			v.bad(p, "unknown message type; known are %s", knownTypes())
		case ls == nil:
			v.bad(p, "must be a list of windows; write [] to let %s pass free", label)
		case t == wire.TypeOther && len(ls) == 0:
			// The catch-all bucket is never free (DESIGN.md): otherwise a
			// client could send anything the gate cannot classify without
			// limit, and the relay would still have to read and reject
			// every frame. The library lets a caller make it free; sluice
			// does not.
			v.bad(p, "must have at least one window: the catch-all bucket is never free")
		default:
			lim.Message[t] = v.windows(lp, p, ls)
		}
	}
}

// identity reads identity and allow into c.Identity.
func (v *checker) identity(c *config) {
	fc := v.fc
	// The library takes 0 (its default) and 1…128; below /16 every IPv6
	// client of a continent would share one budget.
	if p := fc.Identity.IPv6Prefix; p < 16 || p > 128 {
		v.bad("identity.ipv6_prefix", "must be between 16 and 128, got %d", p)
	} else {
		c.Identity.IPv6Prefix = int(p)
	}
	c.Identity.TrustedProxies = v.prefixes("identity.trusted_proxies", fc.Identity.TrustedProxies)
	c.Identity.Header = fc.Identity.Header
	if c.Identity.Header == "" {
		// The library reads "" as X-Forwarded-For; in the file it is
		// more likely a value forgotten.
		v.bad("identity.header", "must not be empty (X-Forwarded-For, X-Real-IP or another forwarding header)")
	}
	c.Identity.AllowIPs = v.prefixes("allow.ips", fc.Allow.IPs)
	for i, s := range fc.Allow.Pubkeys {
		pk, err := parsePubkey(s)
		if err != nil {
			v.bad(fmt.Sprintf("allow.pubkeys[%d]", i), "%v", err)
			pk = s
		}
		c.Identity.AllowPubkeys = append(c.Identity.AllowPubkeys, pk)
	}
}

// prefixes reads a list of networks, one for one (an unreadable entry
// becomes the zero Prefix, which the library refuses).
func (v *checker) prefixes(path string, ss []string) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range ss {
		p, err := parsePrefix(s)
		if err != nil {
			v.bad(fmt.Sprintf("%s[%d]", path, i), "%v", err)
		}
		out = append(out, p)
	}
	return out
}

// kinds reads limits.kinds, in the order of the names.
func (v *checker) kinds(c *config, lp *libPaths) {
	for _, name := range slices.Sorted(maps.Keys(v.fc.Limits.Kinds)) {
		path := "limits.kinds." + name
		kc := v.fc.Limits.Kinds[name]
		cl := policy.Class{Name: name, Limits: v.windows(lp, path+".limits", kc.Limits)}
		for _, k := range kc.Kinds {
			cl.Kinds = append(cl.Kinds, [2]int{int(max(min(k.from, math.MaxInt32), math.MinInt32)), int(max(min(k.to, math.MaxInt32), math.MinInt32))})
		}
		c.Kinds = append(c.Kinds, cl)
		lp.kinds = append(lp.kinds, path)
	}
}

// tiers reads tiers, in the order of the names: members (npubs read here,
// a pubkeys_file read relative to the config file), message limits over
// the address's, and a quota of the tier's own.
func (v *checker) tiers(c *config, lp *libPaths) {
	fc := v.fc
	for _, name := range slices.Sorted(maps.Keys(fc.Tiers)) {
		path := "tiers." + name
		tc := fc.Tiers[name]
		ts := tierSpec{Tier: policy.Tier{Name: name}}
		seen := map[string]bool{}
		ok := true
		add := func(where string, from int32, s string) {
			pk, err := parsePubkey(s)
			if err != nil {
				v.bad(where, "%v", err)
				ok = false
				return
			}
			// The library takes lowercase hex; npubs and the file may
			// have either case.
			if pk = strings.ToLower(pk); !seen[pk] {
				seen[pk] = true
				ts.Pubkeys = append(ts.Pubkeys, pk)
				ts.from = append(ts.from, from)
			}
		}
		for i, s := range tc.Pubkeys {
			add(fmt.Sprintf("%s.pubkeys[%d]", path, i), int32(i), s)
		}
		if tc.PubkeysFile != "" {
			ts.File = tc.PubkeysFile
			if !filepath.IsAbs(ts.File) && fc.dir != "" {
				ts.File = filepath.Join(fc.dir, ts.File)
			}
			if err := readPubkeysFile(ts.File, func(line int, s string) {
				add(fmt.Sprintf("%s.pubkeys_file (%s, line %d)", path, ts.File, line), -int32(min(line, math.MaxInt32)), s)
			}); err != nil {
				v.bad(path+".pubkeys_file", "%v", err)
				ok = false
			}
		}
		if len(ts.Pubkeys) == 0 && ok {
			v.bad(path, "has no members: give pubkeys or a pubkeys_file with at least one")
		}
		// A type the tier does not name keeps the address's windows.
		ts.Limits.Message = c.Limits.Message
		ts.Limits.Read = c.Limits.Read // a tier reads on the address's read windows, by its own key
		v.messages(lp, path+".limits.message", tc.Limits.Message, &ts.Limits)
		if q := tc.Quota; q != nil {
			ts.QuotaSet = true
			ts.QuotaUnlimited = bool(q.Unlimited)
			ts.QuotaEvents, ts.QuotaWindow = c.QuotaEvents, c.QuotaWindow
			events := int64(c.QuotaEvents)
			if q.Events != nil {
				events = int64(*q.Events)
				ts.QuotaEvents = int(max(min(events, math.MaxInt32), math.MinInt32))
			}
			if q.Window != "" {
				if d, ok := v.checkQuotaWindow(path+".quota.window", q.Window); ok {
					ts.QuotaWindow = d
				}
			}
			if msg := quotaEventsProblem(events, path+".quota.unlimited"); msg != "" {
				v.bad(path+".quota.events", "%s", msg)
			}
		}
		c.Tiers = append(c.Tiers, ts)
		lp.tiers = append(lp.tiers, path)
	}
}

// aggregates reads identity.ipv6_aggregate, then ipv4_aggregate.
func (v *checker) aggregates(c *config, lp *libPaths) {
	for _, fam := range []struct {
		field string
		v4    bool
		list  []aggregateConfig
	}{
		{"identity.ipv6_aggregate", false, v.fc.Identity.IPv6Aggregate},
		{"identity.ipv4_aggregate", true, v.fc.Identity.IPv4Aggregate},
	} {
		for i, ac := range fam.list {
			path := fmt.Sprintf("%s[%d]", fam.field, i)
			a := policy.Aggregate{V4: fam.v4, Limits: v.windows(lp, path+".limits", ac.Limits), Read: v.windows(lp, path+".read", ac.Read)}
			if ac.Prefix == nil {
				v.bad(path+".prefix", "is required (e.g. 48 for IPv6, 24 for IPv4)")
			} else {
				a.Bits = int(max(min(*ac.Prefix, 1<<16), -1))
			}
			c.Aggregates = append(c.Aggregates, a)
			lp.aggs = append(lp.aggs, path)
		}
	}
}

// parsePrefix reads a CIDR ("10.0.0.0/8", "2001:db8::/32") or a single
// address (taken as /32 or /128) of identity.trusted_proxies or allow.ips;
// the library takes netip.Prefix values there and judges them.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not a CIDR: %q", s)
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		// A zone would be dropped by netip.PrefixFrom and match every
		// interface's address.
		return netip.Prefix{}, fmt.Errorf("not an IP address or CIDR: %q", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parsePubkey turns an npub into hex and returns anything else as it is,
// for the library to judge as hex.
func parsePubkey(s string) (string, error) {
	if !strings.HasPrefix(s, "npub1") {
		return s, nil
	}
	prefix, v, err := nip19.Decode(s)
	if err != nil || prefix != "npub" {
		return "", fmt.Errorf("not a valid npub: %q", s)
	}
	pk, _ := v.(string)
	return pk, nil
}
