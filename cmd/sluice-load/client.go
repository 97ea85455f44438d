package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

// readLimit bounds one frame the tool reads from the relay.
const readLimit = 16 << 20

// xffFor is the X-Forwarded-For address of connection (or worker) i:
// 10.a.b.c counted from 10.0.0.1, distinct for the first 16,777,214.
func xffFor(i int) string {
	n := i + 1
	return fmt.Sprintf("10.%d.%d.%d", n>>16&0xff, n>>8&0xff, n&0xff)
}

// dialer opens WebSocket connections to one URL.
type dialer struct {
	url     string
	xff     bool
	timeout time.Duration
	ws      websocket.Dialer
}

func newDialer(url string, xff bool, timeout time.Duration) *dialer {
	return &dialer{
		url:     url,
		xff:     xff,
		timeout: timeout,
		ws: websocket.Dialer{
			Proxy:            nil, // loopback measurements: never a proxy from the environment
			HandshakeTimeout: timeout,
			ReadBufferSize:   4096,
			WriteBufferSize:  4096,
		},
	}
}

// dial opens connection i. On failure it returns the HTTP status of the
// refused upgrade (0 when there was no HTTP answer).
func (d *dialer) dial(ctx context.Context, i int) (*websocket.Conn, int, error) {
	var h http.Header
	if d.xff {
		h = http.Header{"X-Forwarded-For": {xffFor(i)}}
	}
	c, resp, err := d.ws.DialContext(ctx, d.url, h)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
			resp.Body.Close()
		}
		return nil, status, err
	}
	c.SetReadLimit(readLimit)
	return c, 0, nil
}

// closeConn ends c cleanly: a close frame, then waiting (up to wait) for
// the relay to close its side, so that the relay sees a normal close and
// not a reset.
func closeConn(c *websocket.Conn, wait time.Duration) {
	deadline := time.Now().Add(wait)
	_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), deadline)
	_ = c.SetReadDeadline(deadline)
	for {
		if _, _, err := c.NextReader(); err != nil {
			break
		}
	}
	c.Close()
}

// errKey names an error for a table: stable across connections (no
// addresses or ports), short.
func errKey(err error) string {
	var ce *websocket.CloseError
	var ne net.Error
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ce):
		return fmt.Sprintf("closed by relay (%d)", ce.Code)
	case errors.Is(err, context.Canceled):
		return "interrupted"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return "no free local port (EADDRNOTAVAIL)"
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return "too many open files"
	case errors.Is(err, websocket.ErrBadHandshake):
		return "bad handshake"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	}
	s := err.Error()
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// message is a relay message, decoded as far as the tool needs.
type message struct {
	label string
	args  []json.RawMessage // after the label
}

var eventPrefix = []byte(`["EVENT"`)

// isEvent reports whether b is an EVENT message, without decoding it: a
// REQ may bring many.
func isEvent(b []byte) bool {
	return bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), eventPrefix)
}

// parseMessage decodes a relay message: a JSON array whose first element
// is a string.
func parseMessage(b []byte) (message, error) {
	var arr []json.RawMessage
	if err := json.Unmarshal(b, &arr); err != nil || len(arr) == 0 {
		return message{}, fmt.Errorf("not a relay message: %.60q", b)
	}
	var m message
	if err := json.Unmarshal(arr[0], &m.label); err != nil {
		return message{}, fmt.Errorf("not a relay message: %.60q", b)
	}
	m.args = arr[1:]
	return m, nil
}

// str returns argument i as a string ("" when it is not one).
func (m message) str(i int) string {
	var s string
	if i < len(m.args) {
		_ = json.Unmarshal(m.args[i], &s)
	}
	return s
}

// tally is a table of counts safe for concurrent use.
type tally struct {
	mu sync.Mutex
	m  map[string]int
}

func (t *tally) add(k string, n int) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[string]int{}
	}
	t.m[k] += n
	t.mu.Unlock()
}

func (t *tally) into(dst map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, v := range t.m {
		dst[k] += v
	}
}

// dialAll opens n connections with up to par dials at once and returns
// them indexed by connection (nil where the dial failed) with how long
// each dial took, recording failures in fails.
func dialAll(ctx context.Context, d *dialer, n, par int, fails *tally) ([]*websocket.Conn, []time.Duration) {
	conns := make([]*websocket.Conn, n)
	lats := make([]time.Duration, n)
	sem := make(chan struct{}, max(1, par))
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			t := time.Now()
			c, status, err := d.dial(ctx, i)
			if err != nil {
				fails.add(statusKey(status, err), 1)
				return
			}
			lats[i] = time.Since(t)
			conns[i] = c
		}()
	}
	wg.Wait()
	return conns, lats
}
