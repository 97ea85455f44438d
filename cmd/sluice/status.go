package main

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// The status page keeps a sample of the frame counters every
// statusInterval, statusSamples of them: the last five minutes.
const (
	statusInterval = 10 * time.Second
	statusSamples  = 30
)

// statusSample is the frame counters and open connections at one instant.
type statusSample struct {
	at     time.Time
	frames [wire.NumTypes][numOutcomes]uint64
	open   int64
}

// statusPage serves a small self-contained HTML page (no scripts, no
// external assets; it reloads itself) on the metrics address: the
// readiness checks (the store, its breaker, the upstream), open
// connections, and frames by type and outcome over the last minutes.
// Safe for concurrent use.
type statusPage struct {
	m      *metrics
	checks []readyCheck
	now    func() time.Time // nil: time.Now
	start  time.Time

	mu      sync.Mutex
	samples []statusSample // oldest first, at most statusSamples+1
}

func newStatusPage(m *metrics, checks []readyCheck, now func() time.Time) *statusPage {
	s := &statusPage{m: m, checks: checks, now: now}
	s.start = s.clock()
	s.sample(s.start)
	return s
}

func (s *statusPage) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// run samples every statusInterval until ctx is done.
func (s *statusPage) run(ctx context.Context) {
	t := time.NewTicker(statusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sample(now)
		}
	}
}

func (s *statusPage) read(at time.Time) statusSample {
	x := statusSample{at: at, open: s.m.openCount.Load()}
	for t := range x.frames {
		for o := range x.frames[t] {
			x.frames[t][o] = s.m.frameCounts[t][o].Load()
		}
	}
	return x
}

// sample records the counters at now.
func (s *statusPage) sample(now time.Time) {
	x := s.read(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	// statusSamples intervals need one sample more.
	if len(s.samples) == statusSamples+1 {
		copy(s.samples, s.samples[1:])
		s.samples = s.samples[:statusSamples]
	}
	s.samples = append(s.samples, x)
}

// statusView is what the template renders.
type statusView struct {
	Version   string
	Now       string
	Uptime    string
	Ready     bool
	Checks    []checkResult
	Open      int64
	Window    string
	Outcomes  []string
	Rows      []statusRow
	Totals    []uint64
	Total     uint64
	Bars      []statusBar
	BarWidth  int
	ChartMax  uint64
	Refresh   int
	IntervalS int
	// Offenders are the clients refused most, their counts fading by half
	// every HalfLife.
	Offenders []Offender
	HalfLife  string
	// Bans are the penalty box's bans this process knows of.
	Bans []Ban
	// Readers are the clients the relay sent most, in MiB fading alike.
	Readers []reader
}

type statusRow struct {
	Type   string
	Counts []uint64
	Total  uint64
}

// statusBar is one interval of the chart: admitted (and allow-listed)
// frames above, refused ones (every other outcome) stacked on them.
type statusBar struct {
	X, AdmittedY, AdmittedH, RefusedY, RefusedH int
	Title                                       string
}

const chartHeight = 120

func (s *statusPage) view(ctx context.Context) statusView {
	now := s.clock()
	live := s.read(now)
	s.mu.Lock()
	samples := append(append([]statusSample(nil), s.samples...), live)
	s.mu.Unlock()

	v := statusView{
		Version:   buildVersion(),
		Now:       now.UTC().Format("2006-01-02 15:04:05 UTC"),
		Uptime:    now.Sub(s.start).Round(time.Second).String(),
		Ready:     true,
		Open:      live.open,
		Refresh:   int(statusInterval / time.Second),
		IntervalS: int(statusInterval / time.Second),
	}
	for _, c := range s.checks {
		cctx, cancel := context.WithTimeout(ctx, readyTimeout)
		err := c.check(cctx)
		cancel()
		r := checkResult{Name: c.name, OK: err == nil}
		if c.detail != nil {
			r.Detail = c.detail()
		}
		if err != nil {
			r.Error = err.Error()
			v.Ready = false
		}
		v.Checks = append(v.Checks, r)
	}

	first := samples[0]
	v.Window = now.Sub(first.at).Round(time.Second).String()
	for o := policy.Outcome(0); o < numOutcomes; o++ {
		v.Outcomes = append(v.Outcomes, o.String())
	}
	v.Totals = make([]uint64, numOutcomes)
	for t := wire.Type(0); t < wire.NumTypes; t++ {
		row := statusRow{Type: t.String(), Counts: make([]uint64, numOutcomes)}
		for o := range row.Counts {
			n := live.frames[t][o] - first.frames[t][o]
			row.Counts[o] = n
			row.Total += n
			v.Totals[o] += n
		}
		v.Total += row.Total
		v.Rows = append(v.Rows, row)
	}

	// One bar per interval between samples, newest at the right.
	type split struct{ admitted, refused uint64 }
	var bars []split
	for i := 1; i < len(samples); i++ {
		var b split
		for t := range samples[i].frames {
			for o := range samples[i].frames[t] {
				n := samples[i].frames[t][o] - samples[i-1].frames[t][o]
				if policy.Outcome(o) == policy.Admitted || policy.Outcome(o) == policy.Allowlisted {
					b.admitted += n
				} else {
					b.refused += n
				}
			}
		}
		bars = append(bars, b)
		v.ChartMax = max(v.ChartMax, b.admitted+b.refused)
	}
	v.Offenders = s.m.offenders.Top(10)
	v.Readers = s.m.topReaders(10)
	v.HalfLife = DefaultOffendersHalfLife.String()
	v.Bans = s.m.bans.active()
	v.BarWidth = 600 / (statusSamples + 1) // and the live interval
	for i, b := range bars {
		x := 600 - (len(bars)-i)*v.BarWidth
		bar := statusBar{X: x, Title: fmt.Sprintf("%d admitted, %d refused", b.admitted, b.refused)}
		if v.ChartMax > 0 {
			bar.AdmittedH = int(b.admitted * chartHeight / v.ChartMax)
			bar.RefusedH = int(b.refused * chartHeight / v.ChartMax)
			if b.refused > 0 && bar.RefusedH == 0 {
				bar.RefusedH = 1 // a refusal is never invisible
			}
		}
		bar.AdmittedY = chartHeight - bar.AdmittedH
		bar.RefusedY = bar.AdmittedY - bar.RefusedH
		v.Bars = append(v.Bars, bar)
	}
	return v
}

func (s *statusPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	v := s.view(r.Context())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// Nothing on the page loads from anywhere, this page included.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:")
	if err := statusTemplate.Execute(w, v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

var statusTemplate = template.Must(template.New("status").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sluice status</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1f2328; background: #fff; max-width: 1000px; }
h1 { font-size: 1.4em; margin: 0 0 .2em; }
h2 { font-size: 1.1em; margin: 1.4em 0 .5em; }
.meta { color: #656d76; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 14px; min-width: 180px; }
.card .label { color: #656d76; font-size: .85em; text-transform: uppercase; letter-spacing: .04em; }
.card .value { font-size: 1.5em; font-weight: 600; }
.ok { color: #1a7f37; }
.bad { color: #cf222e; }
.badge { display: inline-block; padding: 1px 10px; border-radius: 10px; color: #fff; font-weight: 600; }
.badge.ok { background: #1a7f37; color: #fff; }
.badge.bad { background: #cf222e; color: #fff; }
.error { color: #cf222e; font-family: ui-monospace, monospace; font-size: .85em; word-break: break-all; }
table { border-collapse: collapse; }
th, td { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eaeef2; }
th:first-child, td:first-child { text-align: left; }
tfoot td { font-weight: 600; border-top: 2px solid #d0d7de; }
td.zero { color: #afb8c1; }
svg .admitted { fill: #1a7f37; }
svg .refused { fill: #cf222e; }
svg .axis { stroke: #d0d7de; }
.legend span { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 12px; }
</style>
</head>
<body>
<h1>sluice <span class="badge {{if .Ready}}ok{{else}}bad{{end}}" id="ready">{{if .Ready}}ready{{else}}not ready{{end}}</span></h1>
<div class="meta">version {{.Version}} · up {{.Uptime}} · {{.Now}} · reloads every {{.Refresh}}s</div>

<div class="cards">
{{range .Checks}}<div class="card" id="check-{{.Name}}">
<div class="label">{{.Name}}</div>
<div class="value {{if .OK}}ok{{else}}bad{{end}}">{{if .OK}}ok{{else}}failing{{end}}</div>
{{if .Detail}}<div class="detail">{{.Detail}}</div>{{end}}
{{if .Error}}<div class="error">{{.Error}}</div>{{end}}
</div>
{{end}}<div class="card" id="open">
<div class="label">open connections</div>
<div class="value">{{.Open}}</div>
</div>
</div>

<h2>Frames, last {{.Window}}</h2>
<svg id="chart" width="600" height="120" viewBox="0 0 600 120" role="img" aria-label="frames per {{.IntervalS}}s, admitted and refused">
<line class="axis" x1="0" y1="120" x2="600" y2="120"/>
{{$w := .BarWidth}}{{range .Bars}}<g><title>{{.Title}}</title><rect class="admitted" x="{{.X}}" y="{{.AdmittedY}}" width="{{$w}}" height="{{.AdmittedH}}"/><rect class="refused" x="{{.X}}" y="{{.RefusedY}}" width="{{$w}}" height="{{.RefusedH}}"/></g>
{{end}}</svg>
<div class="legend meta">per {{.IntervalS}}s, tallest {{.ChartMax}}<span style="background:#1a7f37"></span>admitted or allow-listed<span style="background:#cf222e"></span>refused</div>

<table id="frames">
<thead><tr><th>type</th>{{range .Outcomes}}<th>{{.}}</th>{{end}}<th>total</th></tr></thead>
<tbody>
{{range .Rows}}<tr data-type="{{.Type}}"><td>{{.Type}}</td>{{range .Counts}}<td{{if eq . 0}} class="zero"{{end}}>{{.}}</td>{{end}}<td>{{.Total}}</td></tr>
{{end}}</tbody>
<tfoot><tr><td>all</td>{{range .Totals}}<td>{{.}}</td>{{end}}<td id="total">{{.Total}}</td></tr></tfoot>
</table>
<p class="meta">Counts since the oldest sample kept ({{.Window}} ago); Prometheus has the whole history at /metrics.</p>
<h2>Refused most</h2>
{{if .Offenders}}<table id="offenders">
<thead><tr><th>client</th><th>refusals</th><th>at most over</th></tr></thead>
<tbody>
{{range .Offenders}}<tr><td>{{.Client}}</td><td>{{printf "%.1f" .Refusals}}</td><td>{{printf "%.1f" .Overestimate}}</td></tr>
{{end}}</tbody>
</table>{{else}}<p class="meta" id="offenders">No client has been refused lately.</p>{{end}}
<p class="meta">Refusals fade by half every {{.HalfLife}}; a fixed-size view (the 64 clients refused most), also as JSON at /top.</p>
<h2>Banned</h2>
{{if .Bans}}<table id="bans">
<thead><tr><th>client or prefix</th><th>retry after</th><th>until</th></tr></thead>
<tbody>
{{range .Bans}}<tr><td>{{.Key}}</td><td>{{.RetryAfter}}s</td><td>{{.Until.Format "15:04:05 UTC"}}</td></tr>
{{end}}</tbody>
</table>{{else}}<p class="meta" id="bans">No client is banned (penalty box).</p>{{end}}
<h2>Read most</h2>
{{if .Readers}}<table id="readers">
<thead><tr><th>client</th><th>MiB sent</th><th>at most over</th></tr></thead>
<tbody>
{{range .Readers}}<tr><td>{{.Client}}</td><td>{{printf "%.1f" .MiB}}</td><td>{{printf "%.1f" .Overestimate}}</td></tr>
{{end}}</tbody>
</table>{{else}}<p class="meta" id="readers">The relay has sent no client much lately.</p>{{end}}
<p class="meta">What the relay sent each client (limits.read), fading by half every {{.HalfLife}}; also as JSON at /top ("readers").</p>
</body>
</html>
`))
