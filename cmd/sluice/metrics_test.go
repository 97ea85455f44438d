package main

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay"
)

func scrape(t *testing.T, m *metrics) string {
	t.Helper()
	w := httptest.NewRecorder()
	m.handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(w.Result().Body)
	return string(body)
}

func TestMetrics(t *testing.T) {
	m := newMetrics()
	state := redisstore.BreakerClosed
	m.watch(ratelimit.NewLimiter(ratelimit.NewMemoryStore(16), ratelimit.LimiterOptions{}), func() redisstore.BreakerState { return state })

	o := m.observer()
	o.Frame(relay.TypeEVENT, relay.RateLimited)
	o.Frame(relay.TypeEVENT, relay.RateLimited)
	o.Frame(relay.TypeREQ, relay.Unavailable)
	o.Frame(relay.NumTypes, relay.Admitted) // out of range: ignored, no panic
	o.Connection(relay.RateLimited)
	o.Open(1)
	o.Open(1)
	o.Open(-1)
	m.observeStore(3*time.Millisecond, nil)
	m.observeStore(150*time.Millisecond, errors.New("timeout"))

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
		`sluice_limiter_store_calls_total 0`,
		`sluice_limiter_local_refusals_total 0`,
		`sluice_build_info{version=`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	state = redisstore.BreakerHalfOpen
	if body := scrape(t, m); !strings.Contains(body, "sluice_breaker_open 1") {
		t.Errorf("half-open breaker not reported as open")
	}
}
