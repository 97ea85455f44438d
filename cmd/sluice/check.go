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
)

// printCheck writes what cfg means: where budgets live; for every limit,
// the burst it admits from rest and the rate it sustains after; what a
// forwarded frame may hold; and which URL an AUTH must name.
func printCheck(w io.Writer, cfg *config) {
	fmt.Fprintln(w, "configuration OK")
	if cfg.Redis == "" {
		fmt.Fprintln(w, "store: memory (bounded; budgets are this process's own)")
	} else {
		fmt.Fprintf(w, "store: redis %s (prefix %q, timeout %v)\n", redisstore.RedactURL(cfg.Redis), cfg.Prefix, cfg.StoreTimeout)
	}
	v6 := cfg.Identity.IPv6Prefix
	fmt.Fprintf(w, "limits, per client (an IPv4 address or an IPv6 /%d):\n", v6)

	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	printWindows(tw, "connection", cfg.Limits.Connection)
	for _, t := range typeOrder() {
		printWindows(tw, t.String(), cfg.Limits.Message[t])
	}
	tw.Flush()
	for _, line := range strings.SplitAfter(table.String(), "\n") {
		// Free types pad empty cells; keep the lines clean.
		io.WriteString(w, strings.TrimRight(line, " \n"))
		if strings.HasSuffix(line, "\n") {
			io.WriteString(w, "\n")
		}
	}

	printShape(w, cfg)
	fmt.Fprintf(w, "open at once: at most %d subscriptions per connection (NIP-11 max_subscriptions), %d connections per client in this process\n", cfg.Subscriptions, cfg.MaxConnections)

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
	// The gate lowers the bound to what every REQ window admits at once.
	maxFilters := policy.EffectiveMaxFilters(cfg.MaxFilters, cfg.Limits.Message[relay.TypeREQ])
	lowered := ""
	if maxFilters < cfg.MaxFilters {
		lowered = fmt.Sprintf("; limits.max_filters %d, lowered so that every REQ window admits a REQ of %d at once", cfg.MaxFilters, maxFilters)
	}
	fmt.Fprintf(w, "REQ: at most %d filters (NIP-11 max_filters%s), each filter charged as one REQ; COUNT: one filter\n", maxFilters, lowered)

	fmt.Fprintln(w, "largest frame forwarded, in bytes (a larger one is answered \"invalid: …\"):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range typeOrder() {
		if t == relay.TypeOther {
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
func typeOrder() []relay.Type {
	return []relay.Type{
		relay.TypeEVENT, relay.TypeREQ, relay.TypeCLOSE, relay.TypeCOUNT, relay.TypeAUTH,
		relay.TypeNEGOPEN, relay.TypeNEGMSG, relay.TypeNEGCLOSE, relay.TypeOther,
	}
}

func printWindows(w io.Writer, name string, ls []ratelimit.Limit) {
	if len(ls) == 0 {
		fmt.Fprintf(w, "  %s\tfree\t\t\n", name)
		return
	}
	burst, sustained := -1, 0.0
	for i, l := range ls {
		label := name
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(w, "  %s\t%s\tburst %d\tsustained %s (one every %s)\n",
			label, limitString(l), l.Burst(), rate(l.Sustained()), round(l.Interval()))
		if b := l.Burst(); burst < 0 || b < burst {
			burst = b
		}
		if s := l.Sustained(); i == 0 || s < sustained {
			sustained = s
		}
	}
	if len(ls) > 1 {
		// Every window must admit a message: the tightest one sets both.
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
