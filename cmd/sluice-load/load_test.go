package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// startKhatru serves plain khatru (the khatru mode's setup) on a badger
// store in a temporary directory and returns its ws:// URL.
func startKhatru(t *testing.T) string {
	t.Helper()
	kr, closeDB, err := newPlainKhatru(t.TempDir(), "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(kr)
	t.Cleanup(func() {
		srv.Close()
		closeDB()
	})
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// fakeRelay serves a WebSocket relay whose replies are answer's, and
// records the X-Forwarded-For of every upgrade.
type fakeRelay struct {
	url string
	mu  sync.Mutex
	xff []string
}

func startFake(t *testing.T, answer func(c *websocket.Conn, m message)) *fakeRelay {
	return startFakeHeld(t, answer, 0)
}

// startFakeHeld is startFake whose first hold upgrades each wait until
// all hold have arrived: hold connections at once, so that hold workers
// that dial one connection at a time each dial one of them.
func startFakeHeld(t *testing.T, answer func(c *websocket.Conn, m message), hold int) *fakeRelay {
	t.Helper()
	f := &fakeRelay{}
	var held sync.WaitGroup
	held.Add(hold)
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.xff = append(f.xff, r.Header.Get("X-Forwarded-For"))
		n := len(f.xff)
		f.mu.Unlock()
		if n <= hold {
			held.Done()
			held.Wait()
		}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				return
			}
			m, err := parseMessage(b)
			if err != nil {
				t.Errorf("the tool sent %q", b)
				return
			}
			answer(c, m)
		}
	}))
	t.Cleanup(srv.Close)
	f.url = "ws" + strings.TrimPrefix(srv.URL, "http")
	return f
}

func (f *fakeRelay) headers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.xff...)
}

// eventID is the id of the event in an EVENT message.
func eventID(t *testing.T, m message) string {
	var ev struct {
		ID string `json:"id"`
	}
	if len(m.args) != 1 || json.Unmarshal(m.args[0], &ev) != nil || ev.ID == "" {
		t.Errorf("not an EVENT message: %v", m)
	}
	return ev.ID
}

// okRelay answers every EVENT with OK (accepted, reason) and every REQ
// with CLOSED (reason) or EOSE when reason is "".
func okRelay(t *testing.T, accepted bool, reason string) func(*websocket.Conn, message) {
	return func(c *websocket.Conn, m message) {
		var reply []any
		switch m.label {
		case "EVENT":
			reply = []any{"OK", eventID(t, m), accepted, reason}
		case "REQ":
			if reason == "" {
				reply = []any{"EOSE", m.str(0)}
			} else {
				reply = []any{"CLOSED", m.str(0), reason}
			}
		default:
			return
		}
		if err := c.WriteJSON(reply); err != nil {
			t.Log(err)
		}
	}
}

func testCommon(url string, conns int) common {
	return common{url: url, conns: conns, timeout: 10 * time.Second, parallel: 64}
}

func checkCounts(t *testing.T, rep *report, connected, sent, replies, okTrue int, prefixes map[string]int) {
	t.Helper()
	if rep.Connected != connected || rep.Sent != sent || rep.Replies != replies || rep.OKTrue != okTrue {
		t.Errorf("connected %d sent %d replies %d ok %d, want %d %d %d %d",
			rep.Connected, rep.Sent, rep.Replies, rep.OKTrue, connected, sent, replies, okTrue)
	}
	if prefixes != nil && !maps.Equal(rep.Prefixes, prefixes) {
		t.Errorf("prefixes %v, want %v", rep.Prefixes, prefixes)
	}
	if len(rep.Errors) != 0 {
		t.Errorf("errors %v", rep.Errors)
	}
	if len(rep.ConnFailures) != 0 {
		t.Errorf("connection failures %v", rep.ConnFailures)
	}
}

func TestPublishKhatru(t *testing.T) {
	url := startKhatru(t)
	for _, inflight := range []int{1, 8} {
		rep, err := runPublish(context.Background(), &publishOpts{
			common: testCommon(url, 4), events: 200, size: 100, kind: 1, inflight: inflight,
		})
		if err != nil {
			t.Fatal(err)
		}
		checkCounts(t, rep, 4, 200, 200, 200, map[string]int{"": 200})
		if rep.Latency.Count != 200 || rep.Latency.Max < rep.Latency.P50 {
			t.Errorf("inflight %d: latency %+v", inflight, rep.Latency)
		}
	}
}

// TestPublishLive: with -live, every event OK'd is timed at the
// subscriber, and the report says so.
func TestPublishLive(t *testing.T) {
	url := startKhatru(t)
	rep, err := runPublish(context.Background(), &publishOpts{
		common: testCommon(url, 4), events: 200, size: 100, kind: 1, inflight: 4, live: url,
	})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, rep, 4, 200, 200, 200, map[string]int{"": 200})
	if rep.Live == nil || rep.Live.Count != 200 || rep.Undelivered != 0 || rep.Live.Max < rep.Live.P50 {
		t.Fatalf("live %+v, undelivered %d: want 200 delivered", rep.Live, rep.Undelivered)
	}
}

func TestPublishKeyPool(t *testing.T) {
	o := &publishOpts{common: testCommon("ws://unused", 5), events: 23, size: 10, kind: 7, keys: 2}
	evs, err := presign(o)
	if err != nil {
		t.Fatal(err)
	}
	pubkeys := map[string]bool{}
	ids := map[string]bool{}
	n := 0
	for c, list := range evs {
		if len(list) != share(23, 5, c) {
			t.Errorf("conn %d has %d events", c, len(list))
		}
		for _, ev := range list {
			var msg []json.RawMessage
			var e struct {
				ID     string `json:"id"`
				Pubkey string `json:"pubkey"`
				Kind   int    `json:"kind"`
			}
			if json.Unmarshal(ev.frame, &msg) != nil || len(msg) != 2 || json.Unmarshal(msg[1], &e) != nil {
				t.Fatalf("frame %s", ev.frame)
			}
			if e.ID != ev.id || e.Kind != 7 {
				t.Errorf("event %+v, id %s", e, ev.id)
			}
			pubkeys[e.Pubkey] = true
			ids[e.ID] = true
			n++
		}
	}
	if n != 23 || len(ids) != 23 || len(pubkeys) != 2 {
		t.Errorf("%d events, %d ids, %d pubkeys; want 23, 23, 2", n, len(ids), len(pubkeys))
	}
}

func TestPublishRateLimited(t *testing.T) {
	f := startFake(t, okRelay(t, false, "rate-limited: slow down; retry in 1s"))
	rep, err := runPublish(context.Background(), &publishOpts{
		common: testCommon(f.url, 3), events: 30, kind: 1, inflight: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, rep, 3, 30, 30, 0, map[string]int{"rate-limited:": 30})
	if rep.Rate != 0 {
		t.Errorf("rate %v with no OK true", rep.Rate)
	}
}

func TestReqKhatru(t *testing.T) {
	url := startKhatru(t)
	if _, err := runPublish(context.Background(), &publishOpts{
		common: testCommon(url, 2), events: 30, kind: 1, inflight: 1,
	}); err != nil {
		t.Fatal(err)
	}
	filter, err := parseFilter(`{"kinds":[1],"limit":10}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, inflight := range []int{1, 3} {
		rep, err := runReq(context.Background(), &reqOpts{
			common: testCommon(url, 4), reqs: 40, filters: 2, filter: filter, inflight: inflight,
		})
		if err != nil {
			t.Fatal(err)
		}
		checkCounts(t, rep, 4, 40, 40, 40, map[string]int{"": 40})
		// Up to 10 events per filter; khatru answers each filter apart.
		if rep.Events < 40*10 || rep.Events > 40*20 {
			t.Errorf("inflight %d: %d events received, want 400…800", inflight, rep.Events)
		}
		if rep.Latency.Count != 40 {
			t.Errorf("latency %+v", rep.Latency)
		}
	}
}

func TestReqClosed(t *testing.T) {
	f := startFake(t, okRelay(t, false, "rate-limited: slow down; retry in 2s"))
	filter, _ := parseFilter(`{"kinds":[1]}`)
	rep, err := runReq(context.Background(), &reqOpts{
		common: testCommon(f.url, 2), reqs: 10, filters: 1, filter: filter, inflight: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, rep, 2, 10, 10, 0, map[string]int{"rate-limited:": 10})
	if rep.Latency.Count != 0 {
		t.Errorf("latency counted CLOSED: %+v", rep.Latency)
	}
}

func TestConnectKhatru(t *testing.T) {
	url := startKhatru(t)
	rep, err := runConnect(context.Background(), &connectOpts{common: testCommon(url, 5)})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, rep, 5, 5, 5, 5, nil)
	if rep.Latency.Count != 5 {
		t.Errorf("latency %+v", rep.Latency)
	}

	rep, err = runConnect(context.Background(), &connectOpts{common: testCommon(url, 4), churn: 30})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, rep, 30, 30, 30, 30, nil)
	if rep.Latency.Count != 30 {
		t.Errorf("latency %+v", rep.Latency)
	}
}

func TestConnectRefusedByStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "rate-limited: slow down", http.StatusTooManyRequests)
	}))
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(srv.URL, "http")
	rep, err := runConnect(context.Background(), &connectOpts{common: testCommon(url, 4), churn: 10})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Connected != 0 || rep.Sent != 10 || !maps.Equal(rep.ConnFailures, map[string]int{"429": 10}) {
		t.Errorf("connected %d sent %d failures %v", rep.Connected, rep.Sent, rep.ConnFailures)
	}

	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"publish", "-url", url, "-conns", "3", "-events", "3"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "upgrade refused with HTTP 429") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
	if !strings.Contains(out.String(), "429") {
		t.Errorf("report does not show the 429s:\n%s", out.String())
	}
}

func TestXFF(t *testing.T) {
	f := startFake(t, okRelay(t, true, ""))
	o := &publishOpts{common: testCommon(f.url, 16), events: 32, kind: 1, inflight: 1}
	o.xff = true
	rep, err := runPublish(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, rep, 16, 32, 32, 32, map[string]int{"": 32})
	got := map[string]bool{}
	for _, h := range f.headers() {
		if net.ParseIP(h) == nil || !strings.HasPrefix(h, "10.") {
			t.Errorf("X-Forwarded-For %q", h)
		}
		got[h] = true
	}
	if len(got) != 16 {
		t.Errorf("%d distinct X-Forwarded-For values, want 16: %v", len(got), got)
	}

	// connect -churn: one address per worker. The first three upgrades are
	// held until all three have arrived, so that every worker dials one
	// (else a fast worker could take all twelve before another starts).
	g := startFakeHeld(t, okRelay(t, true, ""), 3)
	co := &connectOpts{common: testCommon(g.url, 3), churn: 12}
	co.xff = true
	if _, err := runConnect(context.Background(), co); err != nil {
		t.Fatal(err)
	}
	got = map[string]bool{}
	for _, h := range g.headers() {
		got[h] = true
	}
	if len(g.headers()) != 12 || len(got) != 3 {
		t.Errorf("%d upgrades with %d distinct X-Forwarded-For, want 12 and 3: %v", len(g.headers()), len(got), got)
	}

	// Without -xff the tool sends none.
	h := startFake(t, okRelay(t, true, ""))
	if _, err := runConnect(context.Background(), &connectOpts{common: testCommon(h.url, 2)}); err != nil {
		t.Fatal(err)
	}
	for _, v := range h.headers() {
		if v != "" {
			t.Errorf("X-Forwarded-For %q without -xff", v)
		}
	}
}

func TestXFFFor(t *testing.T) {
	for i, want := range map[int]string{0: "10.0.0.1", 1: "10.0.0.2", 254: "10.0.0.255", 255: "10.0.1.0", 65535: "10.1.0.0"} {
		if got := xffFor(i); got != want {
			t.Errorf("xffFor(%d) = %s, want %s", i, got, want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i))
	}
	for _, c := range []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 50, 0},
		{[]time.Duration{7}, 50, 7},
		{[]time.Duration{7}, 99, 7},
		{hundred, 50, 50},
		{hundred, 90, 90},
		{hundred, 99, 99},
		{hundred, 100, 100},
		{hundred, 0.5, 1},
		{[]time.Duration{1, 2, 3, 4}, 50, 2},
		{[]time.Duration{1, 2, 3, 4}, 51, 3},
		{[]time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99, 10},
	} {
		if got := percentile(c.in, c.p); got != c.want {
			t.Errorf("percentile(%v, %v) = %v, want %v", c.in, c.p, got, c.want)
		}
	}
	s := summarize([]time.Duration{4 * time.Millisecond, time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond})
	if s != (latencySummary{Count: 4, P50: 2, P90: 4, P99: 4, Max: 4}) {
		t.Errorf("summarize: %+v", s)
	}
}

func TestReasonPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"":                                     "",
		"rate-limited: slow down; retry in 1s": "rate-limited:",
		"error: rate limiter unavailable":      "error:",
		"duplicate: already have this event":   "duplicate:",
		"auth-required: please":                "auth-required:",
		"slow down":                            "(no prefix)",
		"no prefix: here":                      "(no prefix)",
		":empty":                               "(no prefix)",
	} {
		if got := reasonPrefix(in); got != want {
			t.Errorf("reasonPrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRunUsageAndUnreachable(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"nosuchmode"},
		{"publish"},
		{"publish", "-url", "http://127.0.0.1:1"},
		{"publish", "-url", "ws://127.0.0.1:1", "-conns", "0"},
		{"publish", "-url", "ws://127.0.0.1:1", "-bogus"},
		{"req", "-url", "ws://127.0.0.1:1", "-filter", "[1]"},
		{"connect", "-url", "ws://127.0.0.1:1", "-churn", "5", "-hold", "1s"},
		{"connect", "-url", "ws://127.0.0.1:1", "extra"},
		{"khatru"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != 2 || errOut.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a message", args, code, errOut.String())
		}
	}

	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"connect", "-url", "ws://" + addr, "-conns", "2"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "could not connect to ws://"+addr+": connection refused") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}

func TestRunJSON(t *testing.T) {
	url := startKhatru(t)
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"publish", "-url", url, "-conns", "2", "-events", "10", "-json"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var rep report
	dec := json.NewDecoder(&out)
	if err := dec.Decode(&rep); err != nil {
		t.Fatal(err)
	}
	if dec.More() {
		t.Error("more than one JSON value")
	}
	if rep.Mode != "publish" || rep.OKTrue != 10 || rep.Prefixes[""] != 10 || rep.Latency.Count != 10 {
		t.Errorf("%+v", rep)
	}
}
