package relay

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// This file holds the tap's write side: the handler's writes (Write), the
// gate's replies between the relay's messages, and the client's socket
// written without waiting, with what it does not take at once queued up to
// Options.QueueBytes and written by a goroutine of its own while it holds
// anything (writeSock, flush).

// maxHold is the most of a relay message held back for one system call.
const maxHold = 64 << 10

// maxRepliesHeld is how much of the gate's replies may wait for the relay
// to finish a message before the client's reader waits too.
const maxRepliesHeld = 64 << 10

// Write implements net.Conn for the handler: its 101, then its frames.
func (t *tapConn) Write(p []byte) (int, error) {
	if t.ending.Load() {
		return 0, errTapClosed
	}
	t.wmu.lock()
	defer t.wmu.unlock()
	if t.dead.Load() {
		return 0, errTapClosed
	}
	if t.notWS.Load() {
		return t.writeAnswer(p)
	}
	n := len(p)
	p, err := t.track(p)
	if err != nil && t.notWS.Load() {
		// Writing the start of an answer that is not a 101 failed (the
		// client does not read it): a failed write, as writeAnswer's.
		return t.answered, err
	}
	if err != nil {
		t.c.g.log.Warn("closing client", "client", t.c.who, "err", err)
		t.c.once.Do(func() { t.shutLocked(true, websocket.CloseInternalServerErr, "") })
		return 0, err
	}
	if len(p) == 0 && (t.held == nil || !t.wt.boundary()) {
		// The 101, written or not whole yet (replies queued before it, by
		// a handler that read first, go once it is), or frames all held
		// back or dropped (what was held before them goes with the next
		// write that ends on a boundary).
		if t.wt.started() && t.wt.boundary() && t.held == nil && len(t.replies) > 0 && !t.flushReplies() {
			return 0, errTapClosed
		}
		return n, nil
	}
	if !t.wt.boundary() {
		if h := t.holdBuf(); len(*h)+len(p) <= maxHold {
			*h = append(*h, p...)
			return n, nil
		}
	}
	var bufs net.Buffers
	if t.held != nil {
		bufs = append(bufs, *t.held)
	}
	bufs = append(bufs, p)
	atBoundary := t.wt.boundary()
	if atBoundary && len(t.replies) > 0 {
		bufs = append(bufs, t.replies)
	}
	if err := t.writeSock(bufs); err != nil {
		t.writeFailed(err)
		return 0, err
	}
	t.sockMid = !t.wt.frameBoundary()
	t.dropHeld()
	if atBoundary && len(t.replies) > 0 {
		t.repliesSent()
	}
	return n, nil
}

// holdBufs lends the write side the buffer that holds a message back.
var holdBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

func (t *tapConn) holdBuf() *[]byte {
	if t.held == nil {
		t.held = holdBufs.Get().(*[]byte)
	}
	return t.held
}

func (t *tapConn) dropHeld() {
	if t.held == nil {
		return
	}
	if cap(*t.held) <= maxHold {
		*t.held = (*t.held)[:0]
		holdBufs.Put(t.held)
	}
	t.held = nil
}

// reply implements clientSide: a frame of the gate's own (a refusal) to
// the client, now when the relay's stream is between messages, else as
// soon as it is.
func (t *tapConn) reply(data []byte) bool {
	if t.ending.Load() {
		return false
	}
	t.wmu.lock()
	defer t.wmu.unlock()
	if t.dead.Load() || t.wt.closed() {
		return false
	}
	t.replies = appendServerFrame(t.replies, opText, data)
	t.nReplies.Store(int64(len(t.replies)))
	if !t.wt.started() || !t.wt.boundary() || t.held != nil {
		return true
	}
	return t.flushReplies()
}

// flushReplies writes the replies waiting, under the write lock, with the
// stream between messages, and reports whether the connection goes on.
func (t *tapConn) flushReplies() bool {
	err := t.writeSock(net.Buffers{t.replies})
	t.repliesSent()
	if err != nil {
		t.writeFailed(err)
		return false
	}
	return true
}

// repliesSent empties the replies waiting, now written, and wakes a
// client reader waiting for them to go (waitReplies).
func (t *tapConn) repliesSent() {
	t.replies = resetBuf(t.replies)
	t.nReplies.Store(0)
	select {
	case t.flushed <- struct{}{}:
	default:
	}
}

// waitReplies waits while more of the gate's replies wait for a message
// boundary than maxRepliesHeld; false once the connection is shut.
func (t *tapConn) waitReplies() bool {
	for {
		if t.dead.Load() {
			return false
		}
		if t.nReplies.Load() <= maxRepliesHeld {
			return true
		}
		select {
		case <-t.flushed:
		case <-t.c.closing:
			return false
		}
	}
}

// writeSock sends bufs to the client without waiting. What the socket
// takes at once is written at once (one system call per buffer, and no
// deadline); the rest is queued and written by a goroutine started for as
// long as the queue holds anything (flush), which waits as long as the
// client makes progress (writeProgressing). The relay's writer never
// waits for one client: a client whose backlog would pass the queue bound
// (Options.QueueBytes) is cut instead (errBacklog), however recently it
// read. On a connection without a file descriptor (TLS in front of the
// gate, say) everything goes through the queue.
func (t *tapConn) writeSock(bufs net.Buffers) error {
	t.omu.Lock()
	if t.flushing || t.rc == nil {
		err := t.enqueueLocked(bufs)
		t.omu.Unlock()
		return err
	}
	t.omu.Unlock()
	rest, err := t.tryWrite(bufs)
	if err != nil || len(rest) == 0 {
		return err
	}
	t.omu.Lock()
	defer t.omu.Unlock()
	return t.enqueueLocked(rest)
}

// errBacklog is a write that would take a client's backlog past the queue
// bound: the client is cut.
var errBacklog = errors.New("relay: client backlog over the queue bound")

// tryWrite writes what of bufs the socket takes without waiting and
// returns the rest.
func (t *tapConn) tryWrite(bufs net.Buffers) (net.Buffers, error) {
	t.wv, t.werr = bufs, nil
	err := t.rc.Write(t.writeFD)
	bufs, t.wv = t.wv, nil
	if err == nil {
		err = t.werr
	}
	return bufs, err
}

// enqueueLocked adds bufs to the queue, unless that would take the
// backlog (queued and being written) past the bound: errBacklog, nothing
// queued. A piece larger than the bound fits an empty backlog (the relay
// decides how large its messages are). omu is held.
func (t *tapConn) enqueueLocked(bufs net.Buffers) error {
	if t.dead.Load() {
		return errTapClosed
	}
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if have := len(t.over) + t.flying; have > 0 && have+total > t.c.g.queueBytes {
		return errBacklog
	}
	for _, b := range bufs {
		t.over = append(t.over, b...)
	}
	if !t.flushing {
		t.flushing = true
		go t.flush()
	}
	return nil
}

// backlog returns the bytes waiting for the client: queued and being
// written.
func (t *tapConn) backlog() int {
	t.omu.Lock()
	defer t.omu.Unlock()
	return len(t.over) + t.flying
}

// waitBacklog waits, before the client's next message is read, while the
// client is behind (more than backlogLow waits for it): its requests wait
// in its own socket, and the relay, whose answers would only add to the
// backlog, is not handed more work. It reports whether it waited, and
// false in ok once the connection is shut. The flush cuts a client that
// reads nothing, which ends the wait.
func (t *tapConn) waitBacklog() (waited, ok bool) {
	t.omu.Lock()
	defer t.omu.Unlock()
	for len(t.over)+t.flying > backlogLow && !t.dead.Load() && !t.c.subs.closesOwed() {
		waited = true
		t.ocond.Wait()
	}
	return waited, !t.dead.Load()
}

// flush writes the queue until it is empty, then returns; a client that
// takes nothing of a write for the write timeout is cut as a slow reader.
func (t *tapConn) flush() {
	var spare []byte
	for {
		t.omu.Lock()
		if len(t.over) == 0 || t.dead.Load() {
			// The direct writes that follow check the socket's deadline
			// before they try: the last one set here must not outlive
			// the flush.
			_ = t.raw.SetWriteDeadline(time.Time{})
			t.flushing = false
			t.over = nil
			t.ocond.Broadcast()
			t.omu.Unlock()
			return
		}
		out := t.over
		t.over = spare[:0]
		t.flying = len(out)
		t.omu.Unlock()
		_, err := writeProgressing(t.raw, out, t.mc.stall, time.Time{})
		t.omu.Lock()
		t.flying = 0
		if err != nil {
			t.failed = true // what waits for the queue need not (drainBy)
		}
		if cap(out) <= maxCoalesce {
			spare = out
		} else {
			spare = nil
		}
		t.ocond.Broadcast()
		t.omu.Unlock()
		if err != nil {
			t.writeFailed(err) // shut: the loop ends at its top
		}
	}
}

// drainBy waits, with the write lock held, until the queue is written (or
// its flush has failed, or the connection is shut), until deadline at the
// latest: with the write lock held the queue only shrinks, and a client
// that reads takes it within the second shut gives it (what a client that
// does not read holds is cut with the socket).
func (t *tapConn) drainBy(deadline time.Time) {
	t.omu.Lock()
	defer t.omu.Unlock()
	if !t.flushing {
		return
	}
	late := false
	tm := time.AfterFunc(time.Until(deadline), func() {
		t.omu.Lock()
		late = true
		t.ocond.Broadcast()
		t.omu.Unlock()
	})
	defer tm.Stop()
	for t.flushing && !t.dead.Load() && !late && !t.failed {
		t.ocond.Wait()
	}
}

// queued reports whether the socket has a queue being written (then
// nothing may be written to it but through the queue).
func (t *tapConn) queued() bool {
	t.omu.Lock()
	defer t.omu.Unlock()
	return t.flushing
}

// writeFailed ends the connection after a failed write to the client (no
// close frame: the socket is blocked or broken): cut as a slow reader when
// the write timed out, gone otherwise.
func (t *tapConn) writeFailed(err error) {
	c := t.c
	if t.ending.Load() {
		// Being ended already: the goodbye may be waiting for the write
		// lock this caller holds, inside c.once, which would hold this
		// caller (and the lock) until the goodbye gave up on it.
		return
	}
	c.once.Do(func() {
		// Only when the failure ends the connection: one the gate is
		// already ending (its goodbye waiting for the queue) is not cut.
		switch {
		case errors.Is(err, errBacklog):
			c.g.cutLog.info(c.g.log, "closing slow client", "client", c.who, "reason", "backlog over the queue bound")
			c.g.obs.ReportCut("slow_reader")
		case isTimeout(err):
			c.g.cutLog.info(c.g.log, "closing slow client", "client", c.who, "reason", "reads nothing")
			c.g.obs.ReportCut("slow_reader")
		}
		t.shutLocked(false, 0, "")
	})
}

// writeAnswer writes b, part of a handler's answer that is not a 101, as
// the frames are written: each piece with the write timeout to make
// progress, capped by the handler's deadline, so that a client that does
// not read the answer cannot hold the handler for ever.
func (t *tapConn) writeAnswer(b []byte) (int, error) {
	var limit time.Time
	if ns := t.limit.Load(); ns != 0 {
		limit = time.Unix(0, ns)
	}
	return writeProgressing(t.raw, b, t.mc.stall, limit)
}
