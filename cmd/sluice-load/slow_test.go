package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// cutOnREQ answers as okRelay does, but closes the connection when a REQ
// with subscription id cutID arrives: a relay that cuts the staller.
func cutOnREQ(t *testing.T, cutID string) func(*websocket.Conn, message) {
	ok := okRelay(t, true, "")
	return func(c *websocket.Conn, m message) {
		if m.label == "REQ" && m.str(0) == cutID {
			c.Close()
			return
		}
		ok(c, m)
	}
}

func TestStallKhatruUnloaded(t *testing.T) {
	url := startKhatru(t)
	rep, err := runStall(context.Background(), &stallOpts{
		url: url, timeout: 5 * time.Second, publishers: 2, rate: 20, size: 100, fill: 5,
		duration: 500 * time.Millisecond, stallers: 0, filters: 1, probe: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every honest event answered OK true and delivered live, once.
	if rep.Sent < 2 || rep.Publish.Count != rep.Sent || rep.Unanswered != 0 || len(rep.Refused) != 0 {
		t.Errorf("sent %d, OK %d, unanswered %d, refused %v", rep.Sent, rep.Publish.Count, rep.Unanswered, rep.Refused)
	}
	if rep.Delivery.Count != rep.Sent || rep.Undelivered != 0 {
		t.Errorf("sent %d, delivered %d, undelivered %d", rep.Sent, rep.Delivery.Count, rep.Undelivered)
	}
	if rep.StallersUp != 0 || rep.StallerCuts != 0 || len(rep.HonestErrors) != 0 {
		t.Errorf("stallers %d, cuts %d, errors %v", rep.StallersUp, rep.StallerCuts, rep.HonestErrors)
	}
}

// TestStallerCutsCounted: a relay that closes the staller when its stored
// set is asked for; the staller, reading or not, finds out, is counted as
// cut and comes back. The relay delivers nothing live: every honest event
// is counted undelivered, none twice.
func TestStallerCutsCounted(t *testing.T) {
	for _, read := range []int{0, 256000} {
		f := startFake(t, cutOnREQ(t, "stall"))
		rep, err := runStall(context.Background(), &stallOpts{
			url: f.url, timeout: time.Second, publishers: 1, rate: 10, size: 10, fill: 0,
			duration: 1500 * time.Millisecond, stallers: 1, stallRead: read, rcvbuf: 4096,
			filters: 2, reconnect: true, probe: 100 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		if rep.StallerCuts < 1 || rep.StallersUp < 2 || rep.StallersUp > rep.StallerCuts+1 {
			t.Errorf("read %d: %d subscriptions, %d cuts; want at least one cut and one more subscription than cuts at most",
				read, rep.StallersUp, rep.StallerCuts)
		}
		if rep.CutAfter.Count != rep.StallerCuts {
			t.Errorf("read %d: %d cut times for %d cuts", read, rep.CutAfter.Count, rep.StallerCuts)
		}
		if rep.Sent < 1 || rep.Publish.Count != rep.Sent || rep.Undelivered != rep.Sent || rep.Delivery.Count != 0 {
			t.Errorf("read %d: sent %d, OK %d, delivered %d, undelivered %d", read, rep.Sent, rep.Publish.Count, rep.Delivery.Count, rep.Undelivered)
		}
	}
	// Without -reconnect a cut staller stays away.
	f := startFake(t, cutOnREQ(t, "stall"))
	rep, err := runStall(context.Background(), &stallOpts{
		url: f.url, timeout: time.Second, publishers: 1, rate: 10, size: 10,
		duration: time.Second, stallers: 1, filters: 1, probe: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.StallersUp != 1 || rep.StallerCuts != 1 {
		t.Errorf("no reconnect: %d subscriptions, %d cuts; want 1 and 1", rep.StallersUp, rep.StallerCuts)
	}
}

// TestStallerSubscribesLiveThenStored: the staller's first REQ is live
// only, its second holds -stall-filters copies of the stored set's filter.
func TestStallerSubscribesLiveThenStored(t *testing.T) {
	got := make(chan message, 4)
	f := startFake(t, func(c *websocket.Conn, m message) {
		if m.label == "REQ" && strings.HasPrefix(m.str(0), "stall") {
			got <- m
			return
		}
		okRelay(t, true, "")(c, m)
	})
	if _, err := runStall(context.Background(), &stallOpts{
		url: f.url, timeout: time.Second, publishers: 1, rate: 10, size: 10,
		duration: 200 * time.Millisecond, stallers: 1, filters: 3, probe: time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	first, second := <-got, <-got
	if first.str(0) != "stall-live" || len(first.args) != 2 || string(first.args[1]) != `{"kinds":[1],"limit":0}` {
		t.Errorf("first REQ %s %s", first.str(0), first.args)
	}
	if second.str(0) != "stall" || len(second.args) != 4 {
		t.Fatalf("second REQ %s with %d filters, want stall with 3", second.str(0), len(second.args)-1)
	}
	for _, a := range second.args[1:] {
		if string(a) != `{"kinds":[1],"limit":1000}` {
			t.Errorf("filter %s", a)
		}
	}
}

func TestSlowConnCapsEachRead(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	s := &slowConn{Conn: b, rate: 1 << 20, done: make(chan struct{})}
	defer s.Close()
	data := bytes.Repeat([]byte("x"), 200_000)
	go func() {
		a.Write(data)
		a.Close()
	}()
	buf := make([]byte, 64<<10)
	total, reads := 0, 0
	// Before it is armed (the upgrade), a read takes what it is given.
	n, err := s.Read(buf)
	if err != nil || n != len(buf) {
		t.Fatalf("unarmed read: %d, %v; want %d", n, err, len(buf))
	}
	total += n
	s.armed.Store(true)
	for {
		n, err := s.Read(buf)
		total += n
		if n > 0 {
			reads++
		}
		if n > (1<<20)/20 {
			t.Fatalf("an armed read took %d bytes, more than a twentieth of a second's worth", n)
		}
		if err != nil {
			break
		}
	}
	if total != len(data) || s.read.Load() != int64(len(data)-len(buf)) {
		t.Errorf("read %d bytes (%d armed), want %d (%d)", total, s.read.Load(), len(data), len(data)-len(buf))
	}
	if reads < (len(data)-len(buf))/((1<<20)/20) {
		t.Errorf("%d armed reads", reads)
	}
}

func TestSlowreadKhatru(t *testing.T) {
	url := startKhatru(t)
	rep, err := runSlowread(context.Background(), &slowreadOpts{
		url: url, timeout: 5 * time.Second, fill: 40, size: 100, read: 1 << 20,
		filter: `{"kinds":[1],"limit":1000}`, probe: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.EOSE || rep.Cut || rep.Events != 40 || rep.BytesRead < 40*100 {
		t.Errorf("EOSE %v, cut %v (%s), %d events, %d bytes; want the 40 events whole", rep.EOSE, rep.Cut, rep.CutHow, rep.Events, rep.BytesRead)
	}
}

func TestSlowreadCut(t *testing.T) {
	for _, read := range []int{1, 1 << 20} {
		f := startFake(t, cutOnREQ(t, "slow"))
		rep, err := runSlowread(context.Background(), &slowreadOpts{
			url: f.url, timeout: time.Second, read: read, filter: `{"kinds":[1]}`, probe: 50 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Cut || rep.EOSE || rep.CutHow == "" {
			t.Errorf("read %d: cut %v (%q), EOSE %v; want cut", read, rep.Cut, rep.CutHow, rep.EOSE)
		}
	}
}

// metricsServer serves Prometheus text with go_goroutines g.
func metricsServer(t *testing.T, g int) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "# HELP go_goroutines x\ngo_goroutines %d\ngo_goroutines_other 7\nprocess_resident_memory_bytes 1.5e+06\n", g)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

func TestBacklogCountsAndSamples(t *testing.T) {
	f := startFake(t, func(c *websocket.Conn, m message) {
		if m.label == "COUNT" {
			c.WriteJSON([]any{"COUNT", m.str(0), map[string]int{"count": 3}})
			return
		}
		okRelay(t, true, "")(c, m)
	})
	rep, err := runBacklog(context.Background(), &backlogOpts{
		url: f.url, timeout: time.Second, read: 1 << 20, eventRate: 20, countRate: 40, eventSize: 10,
		duration: 600 * time.Millisecond, metrics: []string{metricsServer(t, 42)}, sample: 100 * time.Millisecond,
		probe: time.Second, filter: `{"kinds":[1]}`, filters: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Cut || rep.EventsSent < 2 || rep.CountsSent < 2 || rep.CountsSent < rep.EventsSent {
		t.Errorf("cut %v, %d EVENTs and %d COUNTs sent", rep.Cut, rep.EventsSent, rep.CountsSent)
	}
	if rep.OKs < 1 || rep.OKs > rep.EventsSent || rep.Counts < 1 || rep.Counts > rep.CountsSent {
		t.Errorf("%d OKs for %d EVENTs, %d COUNTs for %d", rep.OKs, rep.EventsSent, rep.Counts, rep.CountsSent)
	}
	if len(rep.Procs) != 1 || len(rep.Procs[0].Samples) < 2 {
		t.Fatalf("procs %+v", rep.Procs)
	}
	p := rep.Procs[0]
	if p.First.Goroutines != 42 || p.Last.Goroutines != 42 || p.Max.RSSBytes != 1.5e6 || p.Errors != 0 {
		t.Errorf("samples %+v", p)
	}
}

func TestBacklogCut(t *testing.T) {
	f := startFake(t, cutOnREQ(t, "backlog"))
	rep, err := runBacklog(context.Background(), &backlogOpts{
		url: f.url, timeout: time.Second, read: 1000, eventRate: 5, countRate: 5,
		duration: 5 * time.Second, sample: time.Second, probe: 50 * time.Millisecond, filter: `{"kinds":[1]}`, filters: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Cut || rep.CutHow == "" {
		t.Errorf("cut %v (%q), want cut", rep.Cut, rep.CutHow)
	}
}

func TestParseMetrics(t *testing.T) {
	g, r, err := parseMetrics(strings.NewReader("go_goroutines 12\nprocess_resident_memory_bytes 3.4e+07\n"))
	if err != nil || g != 12 || r != 3.4e7 {
		t.Errorf("%v %v %v", g, r, err)
	}
	for _, in := range []string{"", "go_goroutines 12\n", "process_resident_memory_bytes 1\ngo_goroutines_x 3\n"} {
		if _, _, err := parseMetrics(strings.NewReader(in)); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

func TestKhatruMetrics(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	maddr := mln.Addr().String()
	mln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runKhatru(ctx, addr, t.TempDir(), "", maddr, discardLogger())
	}()
	var g, rss float64
	for range 100 {
		if g, rss, err = scrape(context.Background(), "http://"+maddr+"/metrics"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // polls, up to 5 s, for runKhatru's metrics listener to come up
	}
	cancel()
	if err != nil || g < 1 || rss <= 0 {
		t.Errorf("goroutines %v, RSS %v, %v", g, rss, err)
	}
	if err := <-done; err != nil {
		t.Error(err)
	}
}

func TestSlowModesUsage(t *testing.T) {
	for _, args := range [][]string{
		{"stall"},
		{"stall", "-url", "ws://127.0.0.1:1", "-publishers", "0"},
		{"stall", "-url", "ws://127.0.0.1:1", "-stall-filters", "0"},
		{"stall", "-url", "ws://127.0.0.1:1", "-rate", "0"},
		{"backlog", "-url", "ws://127.0.0.1:1", "-read", "0"},
		{"backlog", "-url", "ws://127.0.0.1:1", "-event-rate", "0", "-count-rate", "0"},
		{"backlog", "-url", "ws://127.0.0.1:1", "-filter", "[]"},
		{"slowread", "-url", "http://127.0.0.1:1"},
		{"slowread", "-url", "ws://127.0.0.1:1", "extra"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != 2 || errOut.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a message", args, code, errOut.String())
		}
	}
	// A relay that is not there: exit 1, with the reason.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"slowread", "-url", "ws://" + addr, "-fill", "0"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "connection refused") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
