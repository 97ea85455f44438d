package main

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

func scrape(t *testing.T, m *metrics) string {
	t.Helper()
	w := httptest.NewRecorder()
	m.handler(nil).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(w.Result().Body)
	return string(body)
}

func TestMetrics(t *testing.T) {
	m := newMetrics()
	state := "closed"
	m.watch(ratelimit.NewLimiter(ratelimit.NewMemoryStore(16), nil), func() string { return state })

	o := m.observer()
	o.Frame("203.0.113.7", wire.TypeEVENT, policy.RateLimited)
	o.Frame("203.0.113.7", wire.TypeEVENT, policy.RateLimited)
	o.Frame("203.0.113.8", wire.TypeREQ, policy.Unavailable)
	o.Frame("203.0.113.8", wire.NumTypes, policy.Admitted) // out of range: ignored, no panic
	o.Connection("203.0.113.9", policy.RateLimited)
	o.Open(1)
	o.Open(1)
	o.Open(-1)
	m.observeStore(3*time.Millisecond, nil)
	m.observeStore(150*time.Millisecond, errors.New("timeout"))
	o.Held(wire.TypeREQ, 30*time.Millisecond, false)
	o.Held(wire.TypeREQ, 2*time.Second, true)

	body := scrape(t, m)
	for _, want := range []string{
		`sluice_frames_total{outcome="rate_limited",type="EVENT"} 2`,
		`sluice_frames_total{outcome="unavailable",type="REQ"} 1`,
		`sluice_frames_total{outcome="admitted",type="NEG-OPEN"} 0`, // every series exists from the start
		`sluice_connections_total{outcome="rate_limited"} 1`,
		`sluice_open_connections 1`,
		`sluice_store_latency_seconds_bucket{result="ok",le="0.005"} 1`,
		`sluice_store_latency_seconds_count{result="error"} 1`,
		`sluice_breaker_open 0`,
		`sluice_held_seconds_bucket{mode="enforce",le="0.05"} 1`,
		`sluice_held_seconds_count{mode="enforce"} 1`,
		`sluice_held_seconds_bucket{mode="shadow",le="1"} 0`,
		`sluice_held_seconds_count{mode="shadow"} 1`,
		`sluice_limiter_store_calls_total 0`,
		`sluice_limiter_local_refusals_total 0`,
		`sluice_build_info{version=`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	state = "half-open"
	if body := scrape(t, m); !strings.Contains(body, "sluice_breaker_open 1") {
		t.Errorf("half-open breaker not reported as open")
	}
}

// TestConnectionOutcomes: sluice_connections_total has a series for each
// outcome an upgrade can have, and none for a frame's (quota_exceeded,
// invalid), which could never move.
func TestConnectionOutcomes(t *testing.T) {
	m := newMetrics()
	o := m.observer()
	o.Connection("203.0.113.9", policy.Invalid) // not an upgrade's: ignored, no panic
	o.Connection("203.0.113.9", policy.OverCap)
	body := scrape(t, m)
	for _, out := range []string{"admitted", "rate_limited", "unavailable", "allowlisted"} {
		if !strings.Contains(body, `sluice_connections_total{outcome="`+out+`"} 0`) {
			t.Errorf("no sluice_connections_total{outcome=%q}", out)
		}
	}
	if !strings.Contains(body, `sluice_connections_total{outcome="over_cap"} 1`) {
		t.Error("over_cap not counted")
	}
	for _, out := range []string{"quota_exceeded", "invalid"} {
		if strings.Contains(body, `sluice_connections_total{outcome="`+out+`"}`) {
			t.Errorf("sluice_connections_total has outcome %q, which no upgrade can have", out)
		}
	}
}

// TestMemoryStoreMetrics: with the memory store there is no Redis latency
// histogram and no breaker gauge; with the Redis store there are.
func TestMemoryStoreMetrics(t *testing.T) {
	mem := newMetrics()
	mem.watch(ratelimit.NewLimiter(ratelimit.NewMemoryStore(16), nil), nil)
	body := scrape(t, mem)
	for _, name := range []string{"sluice_store_latency_seconds", "sluice_breaker_open"} {
		if strings.Contains(body, name) {
			t.Errorf("memory store exports %s", name)
		}
	}
	red := newMetrics()
	red.watch(ratelimit.NewLimiter(ratelimit.NewMemoryStore(16), nil), func() string { return "closed" })
	red.observeStore(time.Millisecond, nil)
	body = scrape(t, red)
	for _, name := range []string{"sluice_store_latency_seconds_count", "sluice_breaker_open"} {
		if !strings.Contains(body, name) {
			t.Errorf("Redis store does not export %s", name)
		}
	}
}

// TestReadMetrics: what the relay sent each payer is counted by payer
// kind, and its readers are at /top and on the status page.
func TestReadMetrics(t *testing.T) {
	m := newMetrics()
	o := m.observer()
	o.Sent("198.51.100.7", 3<<20, 700)
	o.Sent("pk:ab", 1<<20, 100)
	o.Sent("198.51.100.7", 1<<20, 200)
	o.ReadSpent("198.51.100.7")

	body := scrape(t, m)
	for _, want := range []string{
		`sluice_read_bytes_total{budget="address"} 4.194304e+06`,
		`sluice_read_bytes_total{budget="tier"} 1.048576e+06`,
		`sluice_read_events_total{budget="address"} 900`,
		`sluice_read_refusals_total{budget="address"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	w := httptest.NewRecorder()
	m.serveTop(w, httptest.NewRequest("GET", "/top", nil))
	if got := w.Body.String(); !strings.Contains(got, `"readers":[{"client":"198.51.100.7","mib":4,"overestimate":0},{"client":"pk:ab","mib":1,"overestimate":0}]`) {
		t.Errorf("/top: %s", got)
	}
}
