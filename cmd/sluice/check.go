package main

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// printCheck writes what cfg means: where budgets live; for every limit,
// the burst it admits from rest and the rate it sustains after; what a
// forwarded frame may hold; and which URL an AUTH must name.
func printCheck(w io.Writer, cfg *config) {
	fmt.Fprintln(w, "configuration OK")
	if cfg.Shadow {
		fmt.Fprintln(w, "mode: shadow (every window decides and counts, none refuses: what it would refuse is forwarded and counted shadow_limited)")
	} else {
		fmt.Fprintln(w, "mode: enforce (windows marked (shadow) decide and count but refuse nothing)")
	}
	if cfg.Redis == "" {
		fmt.Fprintln(w, "store: memory (bounded; budgets are this process's own)")
	} else {
		fmt.Fprintf(w, "store: redis %s (prefix %q, timeout %v)\n", redisstore.RedactURL(cfg.Redis), cfg.Prefix, cfg.StoreTimeout)
	}
	v6 := cfg.Identity.IPv6Prefix
	fmt.Fprintf(w, "limits, per client (an IPv4 address or an IPv6 /%d):\n", v6)

	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	sh := cfg.Shadow
	printWindows(tw, "connection", cfg.Limits.Connection, sh)
	for _, t := range typeOrder() {
		printWindows(tw, t.String(), cfg.Limits.Message[t], sh)
	}
	flushTable(w, tw, &table)

	if len(cfg.Kinds) > 0 {
		fmt.Fprintln(w, "kind classes, charged to an EVENT of their kinds in addition to EVENT's windows:")
		for _, c := range cfg.Kinds {
			printWindows(tw, "kind "+c.Name+" ("+kindList(c.Kinds)+")", c.Limits, sh)
		}
		flushTable(w, tw, &table)
	}
	if len(cfg.Aggregates) > 0 {
		fmt.Fprintln(w, "prefix aggregates, charged with every charge of a client inside them:")
		for _, a := range cfg.Aggregates {
			fam := "IPv6"
			if a.V4 {
				fam = "IPv4"
			}
			printWindows(tw, fmt.Sprintf("%s /%d", fam, a.Bits), a.Limits, sh)
		}
		flushTable(w, tw, &table)
	}
	if len(cfg.Tiers) > 0 {
		fmt.Fprintln(w, "tiers, charged by the pubkey a connection proved (NIP-42) instead of its address:")
		for _, ts := range cfg.Tiers {
			quota := "the global quota"
			switch {
			case !ts.QuotaSet && cfg.QuotaUnlimited:
				quota = "no quota (the global one is off)"
			case ts.QuotaSet && ts.QuotaUnlimited:
				quota = "no quota (unlimited)"
			case ts.QuotaSet:
				quota = fmt.Sprintf("%d events per %s", ts.QuotaEvents, formatDuration(ts.QuotaWindow))
			}
			from := ""
			if ts.File != "" {
				from = ", pubkeys_file " + ts.File
			}
			fmt.Fprintf(w, "  tier %s: %d members%s; quota: %s\n", ts.Name, len(ts.Pubkeys), from, quota)
			for _, t := range typeOrder() {
				printWindows(tw, "  "+t.String(), ts.Limits.Message[t], sh)
			}
			flushTable(w, tw, &table)
		}
	}

	printShape(w, cfg)
	fmt.Fprintf(w, "open at once: at most %d subscriptions per connection (NIP-11 max_subscriptions), %d connections, %d NIP-77 syncs and %d bytes of open REQs per client in this process\n", cfg.Subscriptions, cfg.MaxConnections, cfg.Syncs, cfg.MaxFilterBytes)
	fmt.Fprintf(w, "waiting for one client: at most %d bytes (limits.max_queued_bytes); past it the client is cut (1008)\n", cfg.QueueBytes)
	fmt.Fprintf(w, "NIP-77 (sluice relay): a sync covers at most the newest %d events it matches (max_sync_events)\n", cfg.MaxSyncEvents)

	if cfg.QuotaUnlimited {
		fmt.Fprintln(w, "quota: off (unlimited)")
	} else {
		fmt.Fprintf(w, "quota: %d validated events per actor per %s (fixed windows)\n", cfg.QuotaEvents, formatDuration(cfg.QuotaWindow))
	}
	if cfg.RelayURL != "" {
		fmt.Fprintf(w, "NIP-42: an AUTH's relay tag must name %s\n", cfg.RelayURL)
	} else {
		fmt.Fprintln(w, "NIP-42: an AUTH's relay tag must name the host the client connected to (set relay_url to name one)")
	}
	fmt.Fprintf(w, "a refused client is told the exact wait, rounded up to whole seconds: \"rate-limited: …; retry in Ns\"\n")
}

// printShape writes the bounds on forwarded frames: filters per REQ (as
// the gate computes them, which may be below limits.max_filters) and the
// largest frame of each type.
func printShape(w io.Writer, cfg *config) {
	// The gate lowers the bound to what every REQ window admits at once,
	// the tiers' included.
	pc, _ := buildPolicy(cfg, localQuotas(nil))
	maxFilters := policy.EffectiveMaxFilters(pc)
	b := cfg.Bounds // every zero field at its default:
	for _, f := range []struct {
		v   *int
		def int
	}{
		{&b.MaxTags, wire.DefaultBounds().MaxTags},
		{&b.MaxTagValueBytes, wire.DefaultBounds().MaxTagValueBytes},
		{&b.MaxFilterValues, wire.DefaultBounds().MaxFilterValues},
		{&b.MaxFanout, wire.DefaultBounds().MaxFanout},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	lowered := ""
	if maxFilters < cfg.MaxFilters {
		lowered = fmt.Sprintf("; limits.max_filters %d, lowered so that every REQ window admits a REQ of %d at once", cfg.MaxFilters, maxFilters)
	}
	fmt.Fprintf(w, "REQ: at most %d filters (NIP-11 max_filters%s), each filter charged as one REQ; COUNT: one filter\n", maxFilters, lowered)
	fmt.Fprintf(w, "EVENT: at most %d tags (NIP-11 max_event_tags), none empty; a one-letter tag has a value of at most %d bytes (max_tag_value_bytes)\n", b.MaxTags, b.MaxTagValueBytes)
	fmt.Fprintf(w, "filters (REQ, COUNT, NEG-OPEN): at most %d values per field (max_filter_values) and %d index scans, such as authors x kinds (max_filter_fanout)\n", b.MaxFilterValues, b.MaxFanout)

	fmt.Fprintln(w, "largest frame forwarded, in bytes (a larger one is answered \"invalid: …\"):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range typeOrder() {
		if t == wire.TypeOther {
			continue // never forwarded
		}
		n, note := cfg.FrameSize[t], ""
		if n == 0 {
			n = relay.DefaultFrameSize(t, cfg.ReadLimit)
			if int64(n) == cfg.ReadLimit {
				note = "\t(read_limit)"
			}
		}
		fmt.Fprintf(tw, "  %s\t%d%s\n", t, n, note)
	}
	tw.Flush()
}

// typeOrder lists the message types as the config file does.
func typeOrder() []wire.Type {
	return []wire.Type{
		wire.TypeEVENT, wire.TypeREQ, wire.TypeCLOSE, wire.TypeCOUNT, wire.TypeAUTH,
		wire.TypeNEGOPEN, wire.TypeNEGMSG, wire.TypeNEGCLOSE, wire.TypeOther,
	}
}

// flushTable writes the table tw has been filling into buf to w, and
// empties buf for the next.
func flushTable(w io.Writer, tw *tabwriter.Writer, buf *bytes.Buffer) {
	tw.Flush()
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		// Free types pad empty cells; keep the lines clean.
		io.WriteString(w, strings.TrimRight(line, " \n"))
		if strings.HasSuffix(line, "\n") {
			io.WriteString(w, "\n")
		}
	}
	buf.Reset()
}

// kindList writes a class's kinds as the config does: "7, 20000-29999".
func kindList(rs []policy.KindRange) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strconv.Itoa(r.From)
		if r.To != r.From {
			parts[i] += "-" + strconv.Itoa(r.To)
		}
	}
	return strings.Join(parts, ", ")
}

// printWindows writes the windows ls of name; every one is marked
// "(shadow)" when it is in shadow, or all are when shadow (mode: shadow).
func printWindows(w io.Writer, name string, ls []ratelimit.Limit, shadow bool) {
	if len(ls) == 0 {
		fmt.Fprintf(w, "  %s\tfree\t\t\n", name)
		return
	}
	burst, sustained, enforcing := -1, 0.0, 0
	for i, l := range ls {
		label := name
		if i > 0 {
			label = ""
		}
		mark := ""
		if l.Shadow || shadow {
			mark = " (shadow)"
		}
		fmt.Fprintf(w, "  %s\t%s%s\tburst %d\tsustained %s (one every %s)\n",
			label, limitString(l), mark, l.Burst(), rate(l.Sustained()), round(l.Interval()))
		if mark != "" {
			continue // refuses nothing
		}
		if b := l.Burst(); burst < 0 || b < burst {
			burst = b
		}
		if s := l.Sustained(); enforcing == 0 || s < sustained {
			sustained = s
		}
		enforcing++
	}
	if enforcing > 1 {
		// Every enforcing window must admit a message: the tightest one
		// sets both.
		fmt.Fprintf(w, "  \ttogether\tburst %d\tsustained %s\n", burst, rate(sustained))
	}
}

// limitString writes a limit as the config does: "240/60s", "10/1s cost 2".
func limitString(l ratelimit.Limit) string {
	s := strconv.FormatFloat(l.Rate, 'g', -1, 64) + "/" + formatDuration(l.Period)
	if c := l.EffectiveCost(); c != 1 {
		s += " cost " + strconv.FormatFloat(c, 'g', -1, 64)
	}
	return s
}

// rate renders messages per second with three significant digits.
func rate(perSecond float64) string {
	return strconv.FormatFloat(perSecond, 'g', 3, 64) + "/s"
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}
