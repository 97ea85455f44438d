package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

// The pieces the slow-reader modes (stall, backlog, slowread) share: a
// client socket read at a set rate, a store filled before the clock
// starts, a probe that finds a connection the relay has cut even when the
// client reads nothing, and a scrape of a process's goroutines and RSS.

// slowConn is a client socket whose reads, once armed (after the
// upgrade), take at most rate bytes a second: each read is capped at a
// twentieth of a second's worth and followed by the time it takes at that
// rate. A reader that finds nothing to read waits for it as any reader
// does, so the rate is a ceiling, never a burst of bytes saved up.
type slowConn struct {
	net.Conn
	rate  int // bytes a second; only used once armed
	armed atomic.Bool
	read  atomic.Int64 // bytes read once armed
	done  chan struct{}
	once  sync.Once
}

func (s *slowConn) Read(p []byte) (int, error) {
	if !s.armed.Load() || s.rate <= 0 {
		return s.Conn.Read(p)
	}
	if chunk := max(64, s.rate/20); len(p) > chunk {
		p = p[:chunk]
	}
	n, err := s.Conn.Read(p)
	s.read.Add(int64(n))
	if n > 0 {
		t := time.NewTimer(time.Duration(float64(n) / float64(s.rate) * float64(time.Second)))
		select {
		case <-t.C:
		case <-s.done:
			t.Stop()
		}
	}
	return n, err
}

func (s *slowConn) Close() error {
	s.once.Do(func() { close(s.done) })
	return s.Conn.Close()
}

// slowDialer opens connections with a receive buffer of rcvbuf bytes (0:
// the kernel's default, which autotunes) read at rate bytes a second.
type slowDialer struct {
	url     string
	timeout time.Duration
	rcvbuf  int
	rate    int
}

// dial opens one connection; xff, when not "", is its X-Forwarded-For.
// The returned slowConn is armed: from now on its reads are paced.
func (d *slowDialer) dial(ctx context.Context, xff string) (*websocket.Conn, *slowConn, error) {
	var sc *slowConn
	nd := &net.Dialer{Timeout: d.timeout}
	if d.rcvbuf > 0 {
		// Set before connect, so that the window the relay sees is the
		// small one from the first byte (the kernel doubles the value).
		nd.Control = func(_, _ string, rc syscall.RawConn) error {
			return setRcvbuf(rc, d.rcvbuf)
		}
	}
	ws := websocket.Dialer{
		Proxy:            nil,
		HandshakeTimeout: d.timeout,
		ReadBufferSize:   4096,
		WriteBufferSize:  4096,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := nd.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			sc = &slowConn{Conn: c, rate: d.rate, done: make(chan struct{})}
			return sc, nil
		},
	}
	var h http.Header
	if xff != "" {
		h = http.Header{"X-Forwarded-For": {xff}}
	}
	c, resp, err := ws.DialContext(ctx, d.url, h)
	if err != nil {
		if resp != nil {
			resp.Body.Close()
			return nil, nil, fmt.Errorf("upgrade refused with HTTP %d", resp.StatusCode)
		}
		return nil, nil, err
	}
	c.SetReadLimit(readLimit)
	sc.armed.Store(true)
	return c, sc, nil
}

// probeCut writes an empty ping on c every interval until stop is closed
// or a write fails, and returns the time of the failed write (zero if
// none). A relay that has closed the socket answers the next bytes with a
// reset: so a client that reads nothing, or whose reads are far behind
// the close frame, still learns when it was cut, within about interval.
func probeCut(c *websocket.Conn, interval time.Duration, stop <-chan struct{}) time.Time {
	tk := time.NewTicker(interval)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return time.Time{}
		case <-tk.C:
			if err := c.WriteControl(websocket.PingMessage, nil, time.Now().Add(interval)); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					// Our own socket is full of unread pings: the relay
					// stopped reading us, which is not a cut.
					continue
				}
				return time.Now()
			}
		}
	}
}

// fill stores n events of size bytes of content (kind 1) at url before a
// scenario starts, over up to 16 connections (each its own client with
// xff), and fails unless every one is accepted.
func fill(ctx context.Context, url string, n, size int, xff bool, timeout time.Duration) error {
	if n <= 0 {
		return nil
	}
	o := &publishOpts{
		common: common{url: url, conns: min(16, n), xff: xff, timeout: timeout, parallel: 16},
		events: n, size: size, kind: 1, inflight: 4,
	}
	rep, err := runPublish(ctx, o)
	if err != nil {
		return err
	}
	if rep.OKTrue != n {
		return fmt.Errorf("filling the store: %d of %d events accepted (replies %v, errors %v, connection failures %v)",
			rep.OKTrue, n, rep.Prefixes, rep.Errors, rep.ConnFailures)
	}
	return nil
}

// procSample is what a process's Prometheus metrics say of it at one
// moment.
type procSample struct {
	At         float64 `json:"at_s"` // seconds since the scenario started
	Goroutines float64 `json:"goroutines"`
	RSSBytes   float64 `json:"rss_bytes"`
}

// scrapeClient asks for metrics on a new connection each time, closed
// after the answer: a connection kept alive between samples is a
// goroutine of the process being measured.
var scrapeClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

// scrape reads go_goroutines and process_resident_memory_bytes from a
// Prometheus text endpoint.
func scrape(ctx context.Context, url string) (goroutines, rss float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics finds go_goroutines and process_resident_memory_bytes in
// Prometheus text; both must be there.
func parseMetrics(r io.Reader) (goroutines, rss float64, err error) {
	var haveG, haveR bool
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		v, perr := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if perr != nil {
			continue
		}
		switch name {
		case "go_goroutines":
			goroutines, haveG = v, true
		case "process_resident_memory_bytes":
			rss, haveR = v, true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if !haveG || !haveR {
		return 0, 0, fmt.Errorf("go_goroutines or process_resident_memory_bytes missing from the metrics")
	}
	return goroutines, rss, nil
}

// sampler scrapes url every interval (and once at the start) until stop,
// keeping every sample.
type sampler struct {
	mu      sync.Mutex
	samples []procSample
	errs    int
}

func (s *sampler) run(ctx context.Context, url string, start time.Time, interval time.Duration, stop <-chan struct{}) {
	take := func() {
		g, r, err := scrape(ctx, url)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.errs++
			return
		}
		s.samples = append(s.samples, procSample{At: time.Since(start).Seconds(), Goroutines: g, RSSBytes: r})
	}
	take()
	tk := time.NewTicker(interval)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			take()
			return
		case <-ctx.Done():
			return
		case <-tk.C:
			take()
		}
	}
}

// procSummary is a process's goroutines and RSS over a scenario.
type procSummary struct {
	URL     string       `json:"url"`
	First   procSample   `json:"first"`
	Last    procSample   `json:"last"`
	Max     procSample   `json:"max"` // the largest of each, not one sample
	Samples []procSample `json:"samples"`
	Errors  int          `json:"scrape_errors,omitempty"`
}

func (s *sampler) summary(url string) *procSummary {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := &procSummary{URL: url, Samples: s.samples, Errors: s.errs}
	if len(s.samples) == 0 {
		return p
	}
	p.First, p.Last = s.samples[0], s.samples[len(s.samples)-1]
	for _, x := range s.samples {
		p.Max.Goroutines = max(p.Max.Goroutines, x.Goroutines)
		p.Max.RSSBytes = max(p.Max.RSSBytes, x.RSSBytes)
	}
	return p
}

func (p *procSummary) writeText(w io.Writer, name string) {
	if p == nil {
		return
	}
	if len(p.Samples) == 0 {
		fmt.Fprintf(w, "  %-12s no sample (%d scrape errors)\n", name, p.Errors)
		return
	}
	fmt.Fprintf(w, "  %-12s goroutines %.0f → %.0f (max %.0f)  RSS %.1f → %.1f MB (max %.1f)  %d samples\n",
		name, p.First.Goroutines, p.Last.Goroutines, p.Max.Goroutines,
		p.First.RSSBytes/1e6, p.Last.RSSBytes/1e6, p.Max.RSSBytes/1e6, len(p.Samples))
}

// writeResult prints v as one JSON object, or as text.
func writeResult(w io.Writer, asJSON bool, v interface{ writeText(io.Writer) }) error {
	if asJSON {
		return json.NewEncoder(w).Encode(v)
	}
	v.writeText(w)
	return nil
}

// closeKey names how a connection ended, for a table.
func closeKey(err error) string {
	if ce, ok := err.(*websocket.CloseError); ok {
		return fmt.Sprintf("closed by relay (%d %s)", ce.Code, ce.Text)
	}
	return errKey(err)
}
