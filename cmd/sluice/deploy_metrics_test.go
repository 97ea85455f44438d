package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"
)

// exported is what a registry exports: metric name → label → values seen.
type exported map[string]map[string]map[string]bool

// gatherExported builds sluice's metrics exactly as serve does (newGate:
// the metrics, the limiter over the store, the gate), with the memory store
// and with the Redis store (on an address nothing listens on: the metrics
// are registered all the same), and returns every series either exports.
func gatherExported(t *testing.T) exported {
	t.Helper()
	out := exported{}
	add := func(name string, labels []*dto.LabelPair) {
		if out[name] == nil {
			out[name] = map[string]map[string]bool{}
		}
		for _, l := range labels {
			if out[name][l.GetName()] == nil {
				out[name][l.GetName()] = map[string]bool{}
			}
			out[name][l.GetName()][l.GetValue()] = true
		}
	}
	for _, redis := range []string{"", "redis://" + deadAddr(t) + "/0"} {
		cfg, err := parseAndValidate(nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Redis = redis
		// Mode shadow once, so that the series that exist only while some
		// window is in shadow (sluice_shadow_windows) are exported too.
		cfg.Shadow = redis == ""
		ctx, cancel := context.WithCancel(context.Background())
		_, parts, m, err := newGate(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		fams, err := m.reg.Gather()
		cancel()
		parts.close()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			for _, s := range f.GetMetric() {
				if f.GetType() == dto.MetricType_HISTOGRAM {
					add(f.GetName()+"_bucket", append(slices.Clone(s.GetLabel()), &dto.LabelPair{Name: strPtr("le"), Value: strPtr("+Inf")}))
					add(f.GetName()+"_sum", s.GetLabel())
					add(f.GetName()+"_count", s.GetLabel())
					continue
				}
				add(f.GetName(), s.GetLabel())
			}
		}
	}
	return out
}

func strPtr(s string) *string { return &s }

var (
	reMatchers  = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}`)
	reMatcher   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	reGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	reRange     = regexp.MustCompile(`\[[^\]]*\]`)
	reString    = regexp.MustCompile(`"[^"]*"`)
	reIdent     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	reVariable  = regexp.MustCompile(`\$[a-zA-Z_]+|\$\{[^}]*\}`)
	promqlWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "and": true, "or": true, "unless": true, "bool": true, "offset": true, "le": true}
	// Series Prometheus makes itself, and the labels it adds to every
	// series it scrapes.
	prometheusOwn    = map[string]bool{"up": true}
	prometheusLabels = map[string]bool{"job": true, "instance": true}
)

// metricRefs returns the metric names expr uses, each with the label
// matchers written on it (label → op and value).
func metricRefs(expr string) map[string][][3]string {
	refs := map[string][][3]string{}
	expr = reVariable.ReplaceAllString(expr, "1")
	for _, m := range reMatchers.FindAllStringSubmatch(expr, -1) {
		if m[1] == "" {
			continue
		}
		for _, mm := range reMatcher.FindAllStringSubmatch(m[2], -1) {
			refs[m[1]] = append(refs[m[1]], [3]string{mm[1], mm[2], mm[3]})
		}
		if refs[m[1]] == nil {
			refs[m[1]] = [][3]string{}
		}
	}
	rest := reMatchers.ReplaceAllStringFunc(expr, func(s string) string { return s[:strings.IndexByte(s, '{')] + " " })
	rest = reGrouping.ReplaceAllString(rest, " ")
	rest = reRange.ReplaceAllString(rest, " ")
	rest = reString.ReplaceAllString(rest, " ")
	for _, id := range reIdent.FindAllString(rest, -1) {
		if strings.HasSuffix(id, "(") || promqlWords[id] {
			continue // a function, or a keyword
		}
		if refs[id] == nil {
			refs[id] = [][3]string{}
		}
	}
	// Numbers such as 0.25 and 1e3 are not identifiers; durations were
	// inside [ ] or after offset.
	return refs
}

// checkExprs fails for every metric an expression names that sluice does
// not export, and every label value it matches that no series has.
func checkExprs(t *testing.T, where string, exprs []string, have exported) {
	t.Helper()
	if len(exprs) == 0 {
		t.Fatalf("%s: no expressions found", where)
	}
	for _, expr := range exprs {
		for name, matchers := range metricRefs(expr) {
			if prometheusOwn[name] {
				continue
			}
			labels, ok := have[name]
			if !ok {
				t.Errorf("%s: %q uses %s, which sluice does not export", where, expr, name)
				continue
			}
			for _, m := range matchers {
				label, op, value := m[0], m[1], m[2]
				if prometheusLabels[label] {
					continue
				}
				values, ok := labels[label]
				if !ok {
					t.Errorf("%s: %s has no label %q (in %q)", where, name, label, expr)
					continue
				}
				if op == "=~" || op == "!~" {
					for _, v := range strings.Split(value, "|") {
						if regexp.QuoteMeta(v) == v && !values[v] {
							t.Errorf("%s: %s{%s} has no value %q (in %q)", where, name, label, v, expr)
						}
					}
				} else if !values[value] {
					t.Errorf("%s: %s{%s} has no value %q (in %q)", where, name, label, value, expr)
				}
			}
		}
	}
}

func TestMetricRefs(t *testing.T) {
	got := metricRefs(`sum by (instance, le) (rate(sluice_x_bucket{result="ok",instance=~"$instance"}[5m])) / up > 0.5 and on (job) go_goroutines`)
	want := []string{"go_goroutines", "sluice_x_bucket", "up"}
	var names []string
	for n := range got {
		names = append(names, n)
	}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("names %v, want %v", names, want)
	}
	if m := got["sluice_x_bucket"]; len(m) != 2 || m[0] != [3]string{"result", "=", "ok"} {
		t.Errorf("matchers %v", m)
	}
}

// TestAlertRulesUseExportedMetrics: every metric and label value the
// Prometheus rules name is one sluice exports.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("../../deploy/prometheus/sluice-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v lacks alert, expr, severity or summary", r)
			}
			alerts[r.Alert] = true
			exprs = append(exprs, r.Expr)
		}
	}
	// The failures an operator must be paged for: Redis unavailable, the
	// breaker open, a spike of refused frames, slow readers being cut.
	for _, a := range []string{"SluiceStoreUnavailable", "SluiceBreakerOpen", "SluiceFrameRefusalSpike", "SluiceSlowReaderCuts"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
	checkExprs(t, "sluice-alerts.yml", exprs, gatherExported(t))
}

// TestDashboardUsesExportedMetrics: every panel query and template
// variable of the Grafana dashboard names metrics sluice exports.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("../../deploy/grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("dashboard lacks a title, uid or panels")
	}
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	reLabelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),\s*([a-zA-Z_]+)\)$`)
	for _, v := range dash.Templating.List {
		if v.Definition == "" {
			continue
		}
		m := reLabelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		exprs = append(exprs, m[1])
	}
	have := gatherExported(t)
	checkExprs(t, "sluice.json", exprs, have)
	// Every sluice_ metric has a place on the dashboard.
	used := map[string]bool{}
	for _, e := range exprs {
		for n := range metricRefs(e) {
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")] = true
		}
	}
	for n := range have {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")
		if strings.HasPrefix(n, "sluice_") && !used[base] {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
}

// TestSystemdUnit: the unit's sluice commands parse as sluice reads them,
// and it has ExecReload=/bin/kill -HUP $MAINPID exactly when sluice
// handles SIGHUP (main.go asks signal.Notify for it): a unit that reloads
// a process that does not handle SIGHUP would end it, and one that does
// not would leave `systemctl reload` without its meaning.
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile("../../deploy/systemd/sluice.service")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	reloads := regexp.MustCompile(`signal\.Notify\([^)]*syscall\.SIGHUP`).Match(src)
	var execs int
	reload := ""
	for _, line := range strings.Split(string(data), "\n") {
		key, value, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		switch key {
		case "ExecReload":
			reload = value
		case "ExecStart", "ExecStartPre":
			execs++
			args := strings.Fields(value)
			if args[0] != "/usr/local/bin/sluice" || len(args) < 2 {
				t.Errorf("%s=%s: not /usr/local/bin/sluice CMD …", key, value)
				continue
			}
			fs, _ := newFlagSet(args[1], io.Discard)
			if err := fs.Parse(args[2:]); err != nil || fs.NArg() > 0 {
				t.Errorf("%s=%s: sluice %s does not take these flags: %v", key, value, args[1], err)
			}
		}
	}
	if execs != 2 {
		t.Errorf("found %d Exec lines, want ExecStartPre and ExecStart", execs)
	}
	switch {
	case reloads && reload != "/bin/kill -HUP $MAINPID":
		t.Errorf("ExecReload=%q, want /bin/kill -HUP $MAINPID: sluice reloads on SIGHUP", reload)
	case !reloads && reload != "":
		t.Errorf("ExecReload=%s, but sluice does not handle SIGHUP", reload)
	}
}
