package relay

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"os"
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

// solvent repays the balance for the time since it was last asked and
// reports whether it owes nothing: false (and flooded) once what was read
// and not credited as payload is more than controlBurst.
func (m *controlMeter) solvent() bool {
	now := time.Now()
	if d := now.Sub(m.last); d > 0 {
		m.tokens = min(controlBurst, m.tokens+int64(d)*controlRate/int64(time.Second))
		m.last = now
	}
	if m.tokens < 0 {
		m.flooded.Store(true)
		return false
	}
	return true
}

// spend takes n bytes read off the wire. The balance may go below zero
// for the length of one read: a read of a large frame's payload (gorilla
// reads it straight into the frame buffer, in pieces larger than
// controlBurst) is credited back as payload only once it has returned, so
// the balance is judged before the next read (solvent), not after this
// one, or an honest client sending one event over 16 KiB (a long-form
// article, a contact list of a few hundred follows) would be cut.
func (m *controlMeter) spend(n int) { m.tokens -= int64(n) }

// credit gives back n bytes that were message payload.
func (m *controlMeter) credit(n int) {
	m.tokens = min(controlBurst, m.tokens+int64(n))
}

// meteredWriter hands gorilla's upgrader the client's connection wrapped
// in mc, whose reads the meter sees and whose writes the client's writer
// coalesces. The upgrader must have a ReadBufferSize of its own, or it
// would read through the server's buffered reader instead.
type meteredWriter struct {
	http.ResponseWriter
	mc *meteredConn
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
	w.mc.Conn = c
	return w.mc, brw, nil
}

// maxCoalesce is the most a client's writer gathers before a socket write.
const maxCoalesce = 64 << 10

// meteredConn is a client's socket. Every byte read is charged to the
// meter; writes made while the client's writer is coalescing (a batch of
// queued frames) are gathered and written at once, so a batch costs a
// socket write or two rather than one per frame.
type meteredConn struct {
	net.Conn
	m *controlMeter
	// stall, when set, is how long one write may make no progress at all
	// (writeProgressing): a client that reads slowly is never timed out by
	// a large write, and one that stops reading is within stall.
	stall time.Duration
	// limit is the deadline last set by SetWriteDeadline (unix ns, 0:
	// none), which caps stall's and the wait for the write lock: gorilla
	// sets one before every write, under its own write lock, the zero time
	// for messages (the gate sets none) and its own for control frames,
	// whose short deadlines (a close frame's 10 ms or second) hold.
	limit atomic.Int64

	// The read deadline last set (unix ns, 0: none), the span it was set
	// for and the bytes the client had acknowledged then: see Read.
	rdAt, rdSpan, rdAcked atomic.Int64

	// The write lock, a channel so that a write with a deadline gives up
	// waiting for it at the deadline: the client's writer holds it
	// through a flush of its batch, outside gorilla's own write lock, for
	// as long as the client makes progress, and a close frame written
	// meanwhile (a cut, from another goroutine) must not wait that long.
	wmu      writeLock
	wbuf     []byte // under wmu
	batching bool   // under wmu
}

// newMeteredConn returns a client's socket (set Conn at the hijack)
// metered by m, its writes given stall to make progress (0: no limit).
func newMeteredConn(m *controlMeter, stall time.Duration) *meteredConn {
	return &meteredConn{m: m, stall: stall, wmu: newWriteLock()}
}

// Read implements net.Conn. A read that times out at the deadline last
// set through SetReadDeadline goes on, with the deadline moved one span
// ahead, when the client has read meanwhile: bytes of a backlog it was
// sent are waiting in the socket, and it acknowledged more of them than
// when the deadline was set. Such a client is alive though its answer to
// a keepalive ping waits behind what the kernel holds for it (megabytes
// of send and receive buffer, which a slow reader takes minutes to get
// through). A client whose application reads nothing stops acknowledging
// once its receive buffer is full, and one that is sent nothing but pings
// has no backlog, so either is still closed at its deadline.
func (c *meteredConn) Read(p []byte) (int, error) {
	for {
		if !c.m.solvent() {
			return 0, errControlFlood
		}
		n, err := c.Conn.Read(p)
		c.m.spend(n)
		if n > 0 || err == nil || !c.readingBehind(err) {
			return n, err
		}
	}
}

// SetReadDeadline implements net.Conn, noting what Read needs to tell a
// client that reads behind a backlog from a silent one.
func (c *meteredConn) SetReadDeadline(t time.Time) error {
	var at, span int64
	if !t.IsZero() {
		at, span = t.UnixNano(), int64(time.Until(t))
		acked, _ := ackedBytes(c.Conn)
		c.rdAcked.Store(acked)
	}
	c.rdSpan.Store(span)
	c.rdAt.Store(at)
	return c.Conn.SetReadDeadline(t)
}

// readingBehind reports whether err is the read deadline set through
// SetReadDeadline passing while the client reads behind a backlog (see
// Read), and if so moves the deadline one span ahead.
func (c *meteredConn) readingBehind(err error) bool {
	span, at := c.rdSpan.Load(), c.rdAt.Load()
	// A deadline set on the socket directly (to end reads at once) is
	// not one of these.
	if span <= 0 || !isTimeout(err) || time.Now().UnixNano() < at {
		return false
	}
	if unsent, ok := unsentBytes(c.Conn); !ok || unsent == 0 {
		return false
	}
	acked, ok := ackedBytes(c.Conn)
	if !ok || acked <= c.rdAcked.Load() {
		return false
	}
	c.rdAcked.Store(acked)
	next := time.Now().Add(time.Duration(span))
	c.rdAt.Store(next.UnixNano())
	return c.Conn.SetReadDeadline(next) == nil
}

// Write implements net.Conn. It waits for the write lock until the
// deadline last set, if any, and fails as a timeout past it.
func (c *meteredConn) Write(p []byte) (int, error) {
	limit := c.deadline()
	if !c.wmu.lockBy(limit) {
		return 0, os.ErrDeadlineExceeded
	}
	defer c.wmu.unlock()
	if c.batching && len(c.wbuf)+len(p) <= maxCoalesce {
		c.wbuf = append(c.wbuf, p...)
		return len(p), nil
	}
	if err := c.flushLocked(limit); err != nil {
		return 0, err
	}
	return c.write(p, limit)
}

// deadline is the write deadline last set (zero: none).
func (c *meteredConn) deadline() time.Time {
	if ns := c.limit.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// writeLock is a socket's write lock, a channel of one so that a wait for
// it can end at a deadline (a close frame's, or a goodbye's): the holder
// may be a write blocked on a client that does not read.
type writeLock chan struct{}

func newWriteLock() writeLock { return make(writeLock, 1) }

func (l writeLock) lock() { l <- struct{}{} }

func (l writeLock) unlock() { <-l }

// tryLock takes the lock if it is free.
func (l writeLock) tryLock() bool {
	select {
	case l <- struct{}{}:
		return true
	default:
		return false
	}
}

// lockBy takes the lock, waiting until deadline at most (zero: for as
// long as it takes).
func (l writeLock) lockBy(deadline time.Time) bool {
	if l.tryLock() {
		return true
	}
	if deadline.IsZero() {
		l.lock()
		return true
	}
	tm := time.NewTimer(time.Until(deadline))
	defer tm.Stop()
	select {
	case l <- struct{}{}:
		return true
	case <-tm.C:
		return false
	}
}

// write writes p; with stall set, it waits as long as the client makes
// progress (writeProgressing), capped by limit.
func (c *meteredConn) write(p []byte, limit time.Time) (int, error) {
	if c.stall <= 0 {
		return c.Conn.Write(p)
	}
	return writeProgressing(c.Conn, p, c.stall, limit)
}

// coalesce starts gathering writes (on) or writes what was gathered and
// stops (off), returning the write's error. The client's writer calls it
// outside gorilla's write lock; the batch is messages, which have no
// deadline of their own, and a control frame gathered with them has
// given up its deadline by joining them.
func (c *meteredConn) coalesce(on bool) error {
	c.wmu.lock()
	defer c.wmu.unlock()
	c.batching = on
	if on {
		return nil
	}
	return c.flushLocked(time.Time{})
}

func (c *meteredConn) flushLocked(limit time.Time) error {
	if len(c.wbuf) == 0 {
		return nil
	}
	_, err := c.write(c.wbuf, limit)
	if cap(c.wbuf) > maxCoalesce {
		c.wbuf = nil
	} else {
		c.wbuf = c.wbuf[:0]
	}
	return err
}

// SetWriteDeadline implements net.Conn; with stall set, t caps the
// deadline of every piece written (see write), which sets the socket's
// deadline itself before each piece: gorilla calls this before every
// frame, and a socket deadline set here too would cost a second timer
// update per frame for nothing. It never waits: a write under way may
// hold the write lock for as long as the client makes progress.
func (c *meteredConn) SetWriteDeadline(t time.Time) error {
	if c.stall > 0 {
		var ns int64
		if !t.IsZero() {
			ns = t.UnixNano()
		}
		c.limit.Store(ns)
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}

// Close implements net.Conn: what was gathered (a close frame, say) is
// written first, as far as the write deadline lets it, unless a write is
// under way: a writer blocked on a client that does not read must not
// hold up the close, which is what ends its write.
func (c *meteredConn) Close() error {
	if c.wmu.tryLock() {
		_ = c.flushLocked(c.deadline())
		c.batching = false
		c.wmu.unlock()
	}
	return c.Conn.Close()
}
