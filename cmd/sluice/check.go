package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay"
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
	if cfg.Database != "" {
		fmt.Fprintf(w, "events (sluice relay): postgres %s (shared by every sluice relay on it)\n", redisstore.RedactURL(cfg.Database))
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
			if len(a.Read) > 0 {
				printWindows(tw, fmt.Sprintf("%s /%d read (bytes)", fam, a.Bits), a.Read, sh)
			}
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
	printReads(w, cfg)
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
	if d := cfg.Limits.MaxDelay; d > 0 {
		fmt.Fprintf(w, "shaping: a frame whose wait, counted from the first of a run of held frames, is at most %s is held and forwarded when admitted instead (limits.max_delay)\n", formatDuration(d))
	} else {
		fmt.Fprintln(w, "shaping: off (limits.max_delay: 0s); every frame over its budget is refused with its wait")
	}
}

// printShape writes the bounds on forwarded frames: filters per REQ and
// the largest frame of each type.
func printShape(w io.Writer, cfg *config) {
	pc, _ := buildPolicy(cfg, localQuotas(nil))
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
	fmt.Fprintf(w, "REQ: at most %d filters (NIP-11 max_filters), each filter charged its price by shape (read cost, below), a REQ at most what its windows admit at once; COUNT: one filter\n", reqFilters(pc))
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
			n = relay.Options{ReadLimit: cfg.ReadLimit}.Resolved().FrameSize[t]
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
func kindList(rs [][2]int) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = strconv.Itoa(r[0])
		if r[1] != r[0] {
			parts[i] += "-" + strconv.Itoa(r[1])
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

// printReads writes the read side: the read budget in bytes and the price
// of a filter by its shape.
func printReads(w io.Writer, cfg *config) {
	if len(cfg.Limits.Read) == 0 {
		fmt.Fprintln(w, "read budget: none (limits.read is empty): reads are priced by shape only")
	} else {
		fmt.Fprintln(w, "read budget, per client, in bytes the relay sends back (stored results and live events, on all its connections; charged after it is sent, per 64 KiB or query answered; not through the khatru/rely hooks):")
		for _, l := range cfg.Limits.Read {
			mark := ""
			if l.Shadow || cfg.Shadow {
				mark = " (shadow)"
			}
			fmt.Fprintf(w, "  read %s per %s%s: a burst of %s from rest, then about %s per %s (%s/s)\n",
				byteSize(l.Rate), formatDuration(l.Period), mark, byteSize(l.Rate), byteSize(l.Sustained()*l.Period.Seconds()), formatDuration(l.Period), byteSize(l.Sustained()))
		}
		fmt.Fprintln(w, "  a spent client's subscriptions are closed and its REQs refused: \"rate-limited: read budget spent; retry in Ns\"")
	}
	rc := cfg.ReadCost.Resolved()
	fmt.Fprintf(w, "read cost of a filter by its shape (limits.read_cost), charged to the REQ, COUNT or NEG-OPEN windows with the frame:\n")
	fmt.Fprintf(w, "  narrow %d: ids; or authors or a #tag, with no limit or one of at most %d\n", rc.Narrow, rc.ScrapeLimit)
	fmt.Fprintf(w, "  wide   %d: authors or a #tag with a limit above %d; or none of these, a limit of at most %d and a span of at most %s\n", rc.Wide, rc.ScrapeLimit, rc.ScrapeLimit, spanString(rc.ScrapeSpan))
	fmt.Fprintf(w, "  scrape %d: no ids, authors or tag, and a limit above %d or a span above %s (no since: all of time)\n", rc.Scrape, rc.ScrapeLimit, spanString(rc.ScrapeSpan))
}

// byteSize writes n bytes for a person: "16 MiB", "190 KiB".
func byteSize(n float64) string {
	switch {
	case n >= 1<<20:
		return strings.TrimSuffix(strconv.FormatFloat(n/(1<<20), 'f', 1, 64), ".0") + " MiB"
	case n >= 1<<10:
		return strconv.FormatFloat(n/(1<<10), 'f', 0, 64) + " KiB"
	}
	return strconv.FormatFloat(n, 'f', 0, 64) + " B"
}

// spanString writes a span as limits.read_cost.scrape_span would: "2h".
func spanString(d time.Duration) string {
	if d%time.Hour == 0 {
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	}
	return formatDuration(d)
}

// pingTimeout bounds sluice check's dial and PING of the Redis store.
const pingTimeout = 5 * time.Second

// pingRedis dials the configured Redis store and PINGs it: a URL that
// parses may still name a server that is not there, or refuses the
// password.
func pingRedis(ctx context.Context, cfg *config) error {
	client, err := redisstore.NewClient(cfg.Redis)
	if err != nil {
		return fmt.Errorf("redis %s: %w", redisstore.RedactURL(cfg.Redis), err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s did not answer PING: %w", redisstore.RedactURL(cfg.Redis), err)
	}
	return nil
}
