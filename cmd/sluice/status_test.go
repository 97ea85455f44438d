package main

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

var statusT0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// statusFixture is a status page over metrics fed a known traffic, at
// fixed instants: 2 minutes of samples, then the page read 5 s later.
func statusFixture(t *testing.T, checks ...readyCheck) (*metrics, *statusPage, *time.Time) {
	t.Helper()
	m := newMetrics()
	// The offenders' counts fade with time: on a frozen clock they read
	// exactly what was counted however long a browser takes to load.
	m.offenders = NewOffenders(0, 0, func() time.Time { return statusT0 })
	now := statusT0
	s := newStatusPage(m, checks, func() time.Time { return now })
	o := m.observer()
	o.Open(1)
	o.Open(1)
	o.Open(1)
	for i := 1; i <= 12; i++ {
		for range 10 * i {
			o.Frame("203.0.113.7", wire.TypeEVENT, policy.Admitted)
		}
		for range i {
			o.Frame("203.0.113.7", wire.TypeREQ, policy.Admitted)
		}
		if i > 8 {
			for range 5 {
				o.Frame("203.0.113.7", wire.TypeEVENT, policy.RateLimited)
			}
		}
		now = statusT0.Add(time.Duration(i) * statusInterval)
		s.sample(now)
	}
	o.Frame("203.0.113.7", wire.TypeCOUNT, policy.Unavailable)
	now = now.Add(5 * time.Second)
	return m, s, &now
}

func getStatus(t *testing.T, h http.Handler) string {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/status", nil))
	if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("/status: %d %s", w.Code, w.Header().Get("Content-Type"))
	}
	body, _ := io.ReadAll(w.Result().Body)
	return string(body)
}

func TestStatusPage(t *testing.T) {
	m, s, _ := statusFixture(t, storeCheck(ratelimit.NewMemoryStore(16), nil))
	body := getStatus(t, m.handler(s))
	for _, want := range []string{
		`id="ready">ready<`,
		`<div class="detail">memory</div>`,
		"<div class=\"label\">open connections</div>\n<div class=\"value\">3</div>",
		"Frames, last 2m5s",
		// 10+20+…+120 = 780 admitted EVENTs, 4×5 rate-limited.
		`<tr data-type="EVENT"><td>EVENT</td><td>780</td><td>20</td>`,
		`<tr data-type="REQ"><td>REQ</td><td>78</td>`,
		`<tr data-type="COUNT"><td>COUNT</td><td class="zero">0</td><td class="zero">0</td><td>1</td>`,
		`<td id="total">879</td>`,
		"<title>132 admitted, 5 refused</title>", // the busiest interval
		"<title>0 admitted, 1 refused</title>",   // the live one
		"tallest 137",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
	// Self-contained: nothing is fetched from anywhere.
	for _, ext := range []string{"<script", "<link", "src=", "url(", "http://", "https://"} {
		if strings.Contains(body, ext) {
			t.Errorf("/status contains %q: the page must load nothing", ext)
		}
	}
}

func TestStatusPageNotReady(t *testing.T) {
	m, s, _ := statusFixture(t, storeCheck(failingStore{errors.New("ratelimit: store unavailable: breaker open")}, nil),
		upstreamCheck("ws://"+deadAddr(t)))
	body := getStatus(t, m.handler(s))
	for _, want := range []string{`id="ready">not ready<`, `id="check-store"`, "breaker open", `id="check-upstream"`, "refused"} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
}

// TestStatusWindow: the page keeps statusSamples samples, so its counts
// cover the last five minutes, not the whole life of the process.
func TestStatusWindow(t *testing.T) {
	m := newMetrics()
	now := statusT0
	s := newStatusPage(m, nil, func() time.Time { return now })
	o := m.observer()
	for range 1000 {
		o.Frame("203.0.113.7", wire.TypeEVENT, policy.Admitted) // before the window
	}
	for i := 1; i <= 2*statusSamples; i++ {
		now = statusT0.Add(time.Duration(i) * statusInterval)
		s.sample(now)
		o.Frame("203.0.113.7", wire.TypeEVENT, policy.Admitted)
	}
	body := getStatus(t, m.handler(s))
	if !strings.Contains(body, "Frames, last 5m0s") || !strings.Contains(body, `<td id="total">31</td>`) {
		t.Errorf("window not bounded to %d samples:\n%s", statusSamples, body)
	}
}

// newLoopbackServer serves h on a loopback port until the test ends and
// returns its http:// URL.
func newLoopbackServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// The clients refused most are on the status page and at /top, from the
// gate's Observer (the refusals that were the client's doing), most
// refused first.
func TestTopOffenders(t *testing.T) {
	m, s, _ := statusFixture(t, storeCheck(ratelimit.NewMemoryStore(16), nil))
	o := m.observer()
	for range 30 {
		o.Frame("198.51.100.7", wire.TypeEVENT, policy.RateLimited)
	}
	for range 3 {
		o.Frame("2001:db8:1::/64", wire.TypeREQ, policy.Invalid)
		o.Frame("2001:db8:1::/64", wire.TypeREQ, policy.Unavailable) // the store's doing
		o.Frame("2001:db8:1::/64", wire.TypeREQ, policy.Admitted)
	}
	body := getStatus(t, m.handler(s))
	for _, want := range []string{`<table id="offenders">`, "<tr><td>198.51.100.7</td><td>30.0</td>", "<tr><td>2001:db8:1::/64</td><td>3.0</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
	w := httptest.NewRecorder()
	m.handler(s).ServeHTTP(w, httptest.NewRequest("GET", "/top?n=1", nil))
	if got := w.Body.String(); w.Code != 200 || got != `{"half_life_seconds":60,"clients":[{"client":"198.51.100.7","refusals":30,"overestimate":0}],"bans":[],"readers":[]}`+"\n" {
		t.Errorf("/top?n=1: %d %s", w.Code, got)
	}
	w = httptest.NewRecorder()
	m.handler(s).ServeHTTP(w, httptest.NewRequest("GET", "/top?n=x", nil))
	if w.Code != http.StatusBadRequest {
		t.Errorf("/top?n=x: %d", w.Code)
	}
}

// TestTopBans: a ban of the penalty box the gate reports (Observer.Ban)
// shows on /top and on the status page with its Retry-After, and is gone
// from both once it ends.
func TestTopBans(t *testing.T) {
	m, s, _ := statusFixture(t, storeCheck(ratelimit.NewMemoryStore(16), nil))
	body := getStatus(t, m.handler(s))
	if !strings.Contains(body, `<p class="meta" id="bans">`) {
		t.Error("/status without a ban lacks its note")
	}
	m.observer().Ban("203.0.113.9", 90*time.Second)
	body = getStatus(t, m.handler(s))
	if !strings.Contains(body, `<table id="bans">`) || !strings.Contains(body, "<tr><td>203.0.113.9</td><td>90s</td>") {
		t.Errorf("/status lacks the ban:\n%s", body)
	}
	w := httptest.NewRecorder()
	m.handler(s).ServeHTTP(w, httptest.NewRequest("GET", "/top", nil))
	if got := w.Body.String(); !strings.Contains(got, `"bans":[{"key":"203.0.113.9","retry_after_seconds":90,"until":`) {
		t.Errorf("/top: %s", got)
	}
	m.observer().Ban("203.0.113.10", time.Nanosecond)
	if bans := m.bans.active(); len(bans) != 1 || bans[0].Key != "203.0.113.9" {
		t.Errorf("an ended ban is still listed: %+v", bans)
	}
}
