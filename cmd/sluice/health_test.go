package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
)

// failingStore is a store that cannot decide.
type failingStore struct{ err error }

func (f failingStore) Decide(context.Context, string, *ratelimit.Windows, time.Time) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, f.err
}

func getHealth(t *testing.T, h http.Handler, path string) (int, healthBody) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
	var body healthBody
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s: body is not JSON: %v\n%s", path, err, w.Body.String())
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	return w.Code, body
}

// deadAddr is a loopback address nothing listens on (it was free a moment
// ago).
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestReadyMemoryStore(t *testing.T) {
	h := newMetrics().handler(nil, storeCheck(ratelimit.NewMemoryStore(16), nil))
	for _, path := range []string{"/healthz", "/readyz"} {
		code, body := getHealth(t, h, path)
		if code != http.StatusOK || !body.OK {
			t.Errorf("%s: %d %+v, want 200 ok", path, code, body)
		}
	}
	// Probed twice within its 1 ms window, the reserved key is refused:
	// still a decision, so still ready.
	for range 5 {
		if code, body := getHealth(t, h, "/readyz"); code != http.StatusOK {
			t.Fatalf("/readyz again: %d %+v", code, body)
		}
	}
}

func TestReadyFailingStore(t *testing.T) {
	h := newMetrics().handler(nil, storeCheck(failingStore{errors.New("ratelimit: store unavailable: boom")}, nil))
	code, body := getHealth(t, h, "/readyz")
	if code != http.StatusServiceUnavailable || body.OK || len(body.Checks) != 1 {
		t.Fatalf("/readyz with a failing store: %d %+v, want 503 not ok", code, body)
	}
	if c := body.Checks[0]; c.Name != "store" || c.OK || !strings.Contains(c.Error, "boom") {
		t.Errorf("store check: %+v, want not ok with the store's error", c)
	}
	// The process still serves.
	if code, body := getHealth(t, h, "/healthz"); code != http.StatusOK || !body.OK {
		t.Errorf("/healthz with a failing store: %d %+v, want 200", code, body)
	}
}

// TestReadyRedisDown: the Redis store with nothing listening is not ready,
// and the body names the breaker's state.
func TestReadyRedisDown(t *testing.T) {
	client, err := redisstore.NewClient("redis://" + deadAddr(t) + "/0")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	st, err := redisstore.New(client, redisstore.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h := newMetrics().handler(nil, storeCheck(st, st.BreakerState))
	code, body := getHealth(t, h, "/readyz")
	if code != http.StatusServiceUnavailable || body.OK {
		t.Fatalf("/readyz with Redis down: %d %+v, want 503", code, body)
	}
	if c := body.Checks[0]; c.OK || c.Error == "" || !strings.HasPrefix(c.Detail, "redis, breaker ") {
		t.Errorf("store check: %+v", c)
	}
}

func TestReadyUpstream(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		c.Close()
	}))
	defer up.Close()
	mem := storeCheck(ratelimit.NewMemoryStore(16), nil)

	h := newMetrics().handler(nil, mem, upstreamCheck("ws"+strings.TrimPrefix(up.URL, "http")))
	if code, body := getHealth(t, h, "/readyz"); code != http.StatusOK || !body.OK || len(body.Checks) != 2 {
		t.Errorf("/readyz with a live upstream: %d %+v, want 200 and two checks", code, body)
	}

	dead := newMetrics().handler(nil, mem, upstreamCheck("ws://"+deadAddr(t)))
	code, body := getHealth(t, dead, "/readyz")
	if code != http.StatusServiceUnavailable || body.OK {
		t.Fatalf("/readyz with a dead upstream: %d %+v, want 503", code, body)
	}
	if c := body.Checks[1]; c.Name != "upstream" || c.OK || !strings.Contains(c.Error, "refused") {
		t.Errorf("upstream check: %+v, want connection refused", c)
	}
	if c := body.Checks[0]; !c.OK {
		t.Errorf("store check with a dead upstream: %+v, want ok", c)
	}

	// An HTTP server that is not a WebSocket endpoint is not a relay.
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	h = newMetrics().handler(nil, upstreamCheck("ws"+strings.TrimPrefix(plain.URL, "http")))
	if code, body := getHealth(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body.Checks[0].Error, "HTTP 404") {
		t.Errorf("/readyz with a plain HTTP upstream: %d %+v, want 503 and HTTP 404", code, body)
	}
}

// TestHealthCommand runs "sluice health" against real servers: ready, not
// ready, nothing listening, and the address taken from the configuration.
func TestHealthCommand(t *testing.T) {
	ready := httptest.NewServer(newMetrics().handler(nil, storeCheck(ratelimit.NewMemoryStore(16), nil)))
	defer ready.Close()
	down := httptest.NewServer(newMetrics().handler(nil, storeCheck(failingStore{errors.New("boom")}, nil)))
	defer down.Close()
	env := func(vars map[string]string) func(string) string {
		return func(k string) string { return vars[k] }
	}
	none := env(nil)

	for _, tc := range []struct {
		name   string
		args   []string
		getenv func(string) string
		code   int
		out    string
	}{
		{"ready", []string{"--url", ready.URL}, none, 0, `"ok":true`},
		{"ready, path given", []string{"--url", ready.URL + "/readyz"}, none, 0, `"ok":true`},
		{"not ready", []string{"--url", down.URL}, none, 1, `"error":"boom"`},
		{"live though not ready", []string{"--url", down.URL + "/healthz"}, none, 0, `"ok":true`},
		{"nothing listening", []string{"--url", "http://" + deadAddr(t)}, none, 1, ""},
		{"address from the environment", nil, env(map[string]string{"SLUICE_METRICS_LISTEN": strings.TrimPrefix(ready.URL, "http://")}), 0, `"ok":true`},
		{"address from the flag", []string{"--metrics-listen", strings.TrimPrefix(down.URL, "http://")}, none, 1, `"ok":false`},
		{"metrics off", []string{"--metrics-listen", ""}, none, 1, ""},
		{"bad url", []string{"--url", "ftp://x"}, none, 1, ""},
		{"stray argument", []string{"now"}, none, 1, ""},
		{"bad flag", []string{"--nonesuch"}, none, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"health"}, tc.args...), tc.getenv, &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.out) {
				t.Errorf("stdout %q lacks %q", stdout.String(), tc.out)
			}
		})
	}
}

func TestProbeAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0:9777":   "127.0.0.1:9777",
		":9777":          "127.0.0.1:9777",
		"[::]:9777":      "[::1]:9777",
		"10.0.0.5:9777":  "10.0.0.5:9777",
		"localhost:9777": "localhost:9777",
	} {
		if got := probeAddr(in); got != want {
			t.Errorf("probeAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestReadyCluster: on a Redis Cluster, /readyz asks every master for a
// decision on a reserved key of its own slots, and says in its detail
// which answered. One master dead: still ready (the masters are shared by
// every instance; unready would only pull the healthy masters' clients out
// of the load balancer too), the dead one named, and its
// sluice_redis_master_breaker_open series 1 once its breaker opens while
// the others stay 0. Every master dead: not ready.
func TestReadyCluster(t *testing.T) {
	srvs := redistest.StartCluster(t)
	var addrs []string
	for _, s := range srvs {
		addrs = append(addrs, s.Addr())
	}
	cfg, err := parseAndValidate([]byte("store:\n  redis: redis+cluster://" + strings.Join(addrs, ",") + "\n  timeout: 200ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics()
	p, err := newLimiter(context.Background(), cfg, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	h := m.handler(nil, p.ready)
	code, body := getHealth(t, h, "/readyz")
	if code != http.StatusOK || !body.OK {
		t.Fatalf("/readyz on a healthy cluster: %d %+v", code, body)
	}
	for _, a := range addrs {
		if !strings.Contains(body.Checks[0].Detail, a+" ok") {
			t.Errorf("detail %q does not say master %s answered", body.Checks[0].Detail, a)
		}
	}

	srvs[1].Kill()
	var series string
	for probe := 0; probe < 60; probe++ {
		code, body = getHealth(t, h, "/readyz")
		if code != http.StatusOK || !body.OK {
			t.Fatalf("/readyz with one of three masters dead: %d %+v, want 200 (two masters answer)", code, body)
		}
		if d := body.Checks[0].Detail; !strings.Contains(d, addrs[1]+" unavailable") || !strings.Contains(d, addrs[0]+" ok") || !strings.Contains(d, addrs[2]+" ok") {
			t.Fatalf("detail %q, want %s unavailable and the others ok", d, addrs[1])
		}
		series = metricLines(t, h, "sluice_redis_master_breaker_open")
		if strings.Contains(series, `master="`+addrs[1]+`"} 1`) {
			break
		}
	}
	if !strings.Contains(series, `master="`+addrs[1]+`"} 1`) || !strings.Contains(series, `master="`+addrs[0]+`"} 0`) || !strings.Contains(series, `master="`+addrs[2]+`"} 0`) {
		t.Errorf("after 60 probes with %s dead:\n%s\nwant its breaker open (1) and the others closed (0)", addrs[1], series)
	}

	srvs[0].Kill()
	srvs[2].Kill()
	code, body = getHealth(t, h, "/readyz")
	if code != http.StatusServiceUnavailable || body.OK || !strings.Contains(body.Checks[0].Error, "no master answers") {
		t.Errorf("/readyz with every master dead: %d %+v, want 503, no master answers", code, body)
	}
}

// metricLines returns the lines of /metrics that start with name.
func metricLines(t *testing.T, h http.Handler, name string) string {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	var out []string
	for _, l := range strings.Split(w.Body.String(), "\n") {
		if strings.HasPrefix(l, name+"{") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
