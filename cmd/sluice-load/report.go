package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// report is what one run measured. Fields that a mode does not measure
// stay zero and are left out of the JSON.
type report struct {
	Mode string `json:"mode"`
	URL  string `json:"url"`

	// Conns is the number of connections (workers in connect -churn)
	// asked for; Connected how many were set up.
	Conns     int `json:"conns"`
	Connected int `json:"connected"`
	// ConnFailures counts failed upgrades by HTTP status ("429", "503")
	// or, when no HTTP answer came, by the kind of error ("dial: connection
	// refused", "handshake: EOF").
	ConnFailures map[string]int `json:"conn_failures"`

	// Sent counts EVENTs (publish), REQs (req) or connection attempts
	// (connect).
	Sent int `json:"sent"`
	// Replies counts OKs (publish), EOSEs and CLOSEDs (req), or successful
	// upgrades (connect).
	Replies int `json:"replies"`
	// OKTrue counts OK true (publish) or EOSE (req), the replies that mean
	// the relay did the work; Rate is OKTrue per second of wall time
	// (connect: upgrades per second).
	OKTrue int `json:"ok_true"`
	// Events counts the EVENTs received in answer to REQs (req only).
	Events int `json:"events_received,omitempty"`

	Elapsed  float64 `json:"elapsed_s"`
	Rate     float64 `json:"rate_per_s"`
	RateUnit string  `json:"rate_unit"`

	// Latency is write→OK (publish), REQ→EOSE (req) or dial→upgrade
	// (connect), in milliseconds.
	Latency latencySummary `json:"latency_ms"`

	// Prefixes counts replies by the NIP-01 prefix of their reason: ""
	// for OK true with no reason (publish) or EOSE (req), "rate-limited:",
	// "error:", "invalid:", "duplicate:", …; a reason without a prefix
	// counts as "(no prefix)". A NOTICE counts as "NOTICE " + its prefix.
	Prefixes map[string]int `json:"prefixes"`
	// Errors counts what went wrong on connections that were set up: a
	// reply that did not come within -timeout, a connection the relay
	// closed, a reply to nothing sent.
	Errors map[string]int `json:"errors"`

	// Live is each OK'd event's write→arrival at the -live subscriber
	// (publish -live only); Undelivered counts the OK'd events that did
	// not arrive within -timeout of the last OK.
	Live        *latencySummary `json:"live_delivery_ms,omitempty"`
	Undelivered int             `json:"undelivered,omitempty"`

	// Params echoes the flags that shape the load (size, kind, inflight…).
	Params map[string]any `json:"params"`
}

// latencySummary is the distribution of one run's latencies.
type latencySummary struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

func newReport(mode, url string, conns int) *report {
	return &report{
		Mode:         mode,
		URL:          url,
		Conns:        conns,
		ConnFailures: map[string]int{},
		Prefixes:     map[string]int{},
		Errors:       map[string]int{},
		Params:       map[string]any{},
	}
}

// perSecond is n per second of d (0 for no time).
func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// percentile returns the p-th percentile (0 < p ≤ 100) of sorted by the
// nearest-rank method: the smallest value with at least p% of the values
// at or below it. It returns 0 for no values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = max(1, min(rank, n))
	return sorted[rank-1]
}

// summarize sorts lat in place and summarizes it.
func summarize(lat []time.Duration) latencySummary {
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	s := latencySummary{Count: len(lat)}
	if len(lat) > 0 {
		s.P50 = ms(percentile(lat, 50))
		s.P90 = ms(percentile(lat, 90))
		s.P99 = ms(percentile(lat, 99))
		s.Max = ms(lat[len(lat)-1])
	}
	return s
}

// reasonPrefix returns the machine-readable prefix of a NIP-01 OK or
// CLOSED reason, colon included ("rate-limited:"), or "(no prefix)" for a
// non-empty reason without one, or "" for an empty reason.
func reasonPrefix(reason string) string {
	if reason == "" {
		return ""
	}
	i := strings.IndexByte(reason, ':')
	if i <= 0 || i > 32 {
		return "(no prefix)"
	}
	for _, c := range reason[:i] {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return "(no prefix)"
		}
	}
	return reason[:i+1]
}

// statusKey names a failed upgrade: its HTTP status when there was one.
func statusKey(status int, err error) string {
	if status != 0 {
		return strconv.Itoa(status)
	}
	return errKey(err)
}

func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	return enc.Encode(r)
}

// writeText prints the report for a person.
func (r *report) writeText(w io.Writer) {
	p := func(f string, a ...any) { fmt.Fprintf(w, f, a...) }
	p("sluice-load %s %s\n", r.Mode, r.URL)
	if len(r.Params) > 0 {
		keys := slices.Sorted(maps.Keys(r.Params))
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%v", k, r.Params[k]))
		}
		p("  params       %s\n", strings.Join(parts, " "))
	}
	if _, churn := r.Params["churn"]; churn {
		p("  connections  %d set up by %d workers\n", r.Connected, r.Conns)
	} else {
		p("  connections  %d of %d set up\n", r.Connected, r.Conns)
	}
	switch r.Mode {
	case "publish":
		p("  events sent  %d\n", r.Sent)
		p("  OKs          %d (OK true %d)\n", r.Replies, r.OKTrue)
	case "req":
		p("  REQs sent    %d\n", r.Sent)
		p("  replies      %d (EOSE %d, CLOSED %d), %d events received\n", r.Replies, r.OKTrue, r.Replies-r.OKTrue, r.Events)
	case "connect":
		p("  attempts     %d\n", r.Sent)
		p("  upgrades     %d\n", r.OKTrue)
	}
	p("  elapsed      %.3fs\n", r.Elapsed)
	p("  rate         %.0f %s\n", r.Rate, r.RateUnit)
	l := r.Latency
	p("  latency      p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms  (%d samples)\n", l.P50, l.P90, l.P99, l.Max, l.Count)
	if r.Live != nil {
		l := *r.Live
		p("  live         p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms  (%d delivered, %d not)\n",
			l.P50, l.P90, l.P99, l.Max, l.Count, r.Undelivered)
	}
	if r.Mode != "connect" {
		p("  replies by prefix\n")
		printTable(w, r.Prefixes, true)
	}
	p("  connection failures\n")
	printTable(w, r.ConnFailures, false)
	if len(r.Errors) > 0 {
		p("  errors\n")
		printTable(w, r.Errors, false)
	}
}

func printTable(w io.Writer, m map[string]int, quote bool) {
	if len(m) == 0 {
		fmt.Fprintf(w, "    (none)\n")
		return
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		name := k
		if quote {
			name = strconv.Quote(k)
		}
		fmt.Fprintf(w, "    %-24s %d\n", name, m[k])
	}
}
