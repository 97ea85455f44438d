package relay

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// Control frames cost a gate and a relay work without carrying a message:
// a ping must be answered, and a message may be split into any number of
// empty continuation frames, each read and unmasked. None of them reaches
// the limiter, so they are bounded here, in bytes of the client's stream
// that are not message payload (frame headers, masks, ping and pong
// payloads): a connection may owe up to controlBurst such bytes, repaid at
// controlRate per second and by messageAllowance per message. A client
// that owes more is closed with 1008 "sluice: too many control frames".
//
// Closing, rather than charging, is the answer: no client needs more than
// a ping every few seconds or a handful of fragments per message, and a
// charge would cost a store call per frame of a flood that asks for
// nothing. An honest client never comes near the bound: 16 KiB is ~2,700
// empty pings, or ~500 with full 125-byte payloads, in a burst.
const (
	controlBurst     = 16 << 10
	controlRate      = 1 << 10 // bytes a second
	messageAllowance = 64      // header bytes credited per message
)

// errControlFlood is returned by a metered connection's Read once the
// client owes more than controlBurst.
var errControlFlood = errors.New("relay: too many control frames")

// controlMeter is the balance of one client connection. The client's
// reader goroutine (gorilla's reads, the gate's frame reads) is its only
// user, but for flooded, which end reads.
type controlMeter struct {
	tokens  int64
	last    time.Time // monotonic
	flooded atomic.Bool
}

func newControlMeter() *controlMeter {
	return &controlMeter{tokens: controlBurst, last: time.Now()}
}

// spend takes n bytes read off the wire; false once the balance is spent.
func (m *controlMeter) spend(n int) bool {
	now := time.Now()
	if d := now.Sub(m.last); d > 0 {
		m.tokens = min(controlBurst, m.tokens+int64(d)*controlRate/int64(time.Second))
		m.last = now
	}
	m.tokens -= int64(n)
	if m.tokens < 0 {
		m.flooded.Store(true)
		return false
	}
	return true
}

// credit gives back n bytes that were message payload.
func (m *controlMeter) credit(n int) {
	m.tokens = min(controlBurst, m.tokens+int64(n))
}

// meteredWriter hands gorilla's upgrader a connection whose reads the
// meter sees. The upgrader must have a ReadBufferSize of its own, or it
// would read through the server's buffered reader instead.
type meteredWriter struct {
	http.ResponseWriter
	m *controlMeter
}

// Hijack implements http.Hijacker.
func (w meteredWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("relay: response does not implement http.Hijacker")
	}
	c, brw, err := h.Hijack()
	if err != nil {
		return nil, nil, err
	}
	return meteredConn{Conn: c, m: w.m}, brw, nil
}

// meteredConn charges every byte read to its meter.
type meteredConn struct {
	net.Conn
	m *controlMeter
}

// Read implements net.Conn.
func (c meteredConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.m.spend(n) {
		return n, errControlFlood
	}
	return n, err
}
