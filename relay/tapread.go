package relay

import (
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// This file holds the tap's read side: on the handler's reading
// goroutine, the client's frames are read and checked (RFC 6455's server
// side), each whole message is decided (conn.decide), and what the handler
// reads is what the gate forwards, re-framed (Read, next).

var (
	// errClientProtocol is wrapped by a read that failed on a client
	// frame breaking RFC 6455 (the client has been told 1002).
	errClientProtocol = errors.New("relay: protocol error in a client frame")
	// errClientTooLarge: a client message over the read limit (told 1009).
	errClientTooLarge = errors.New("relay: client message over the read limit")
)

// tapHeadroom is the room kept before a message read from the client for
// the frame header the handler reads it under: 10 bytes of header and a
// masking key.
const tapHeadroom = 14

// maxHeldControl is how much of the control frames a client sends inside
// a fragmented message the gate holds for the handler (they go with the
// whole message) before it cuts the client as a control flood.
const maxHeldControl = 4 << 10

// tapReadBuffer is the buffer of a tapped client's reader: frame headers
// and small frames.
const tapReadBuffer = 1024

// Read implements net.Conn for the handler: the frames the gate forwards.
func (t *tapConn) Read(p []byte) (int, error) {
	for {
		if t.preN < len(t.pre) {
			n := copy(p, t.pre[t.preN:])
			t.preN += n
			return n, nil
		}
		if len(t.rq) > 0 {
			n := copy(p, t.rq)
			t.rq = t.rq[n:]
			if len(t.rq) == 0 {
				putFrameBuf(t.rqBuf)
				t.rqBuf = nil
			}
			return n, nil
		}
		if cl := t.upClose.Swap(nil); cl != nil {
			t.pre, t.preN = *cl, 0
			t.readErr = errTapClosed
			continue
		}
		if t.readErr != nil {
			return 0, t.readErr
		}
		if t.dead.Load() || t.notWS.Load() {
			t.readErr = errTapClosed
			continue
		}
		t.pre, t.preN = t.pre[:0], 0
		if cap(t.pre) > 4<<10 {
			t.pre = nil
		}
		if err := t.next(); err != nil {
			t.readErr = err
		}
	}
}

// next reads the client's next message (or control frame) and leaves in
// pre and rq what the handler is to read for it, possibly nothing.
func (t *tapConn) next() error {
	c := t.c
	if t.yield {
		// The handler has just been given CLOSEs of the gate's own
		// (sendClosed), each now on a goroutine of its own (khatru runs
		// every frame so): they run before the next frame is read, so
		// that a REQ the client sends next under a closed id is not
		// closed by them.
		t.yield = false
		runtime.Gosched()
	}
	waited, ok := t.waitBacklog()
	if ok {
		var w bool
		w, ok = c.owed.wait(c.closing, owedWait, c.subs.closesOwed)
		waited = waited || w
	}
	if !ok {
		return errTapClosed
	} else if waited {
		// The time the client took to catch up is not silence (the flush
		// cuts a client that reads nothing): the handler's read deadline
		// starts again from now.
		if span := time.Duration(t.rdSpan.Load()); span > 0 {
			_ = t.mc.SetReadDeadline(time.Now().Add(span))
		}
	}
	// With the next frame here already, its decision sends them
	// (closeClosed), keeping the id of a REQ that reuses one.
	if t.br.Buffered() == 0 && t.sendClosed() {
		return nil
	}
	var hdr [8]byte
	typ := 0
	var msg []byte // from frameBufs, tapHeadroom bytes of room first
	fail := func(err error) error {
		if msg != nil {
			putFrameBuf(msg)
		}
		return err
	}
	for {
		if typ == 0 {
			woke, err := t.awaitFrame()
			if err != nil {
				return fail(t.readFailed(err))
			}
			if woke {
				if t.sendClosed() {
					return nil
				}
				continue
			}
		}
		if _, err := io.ReadFull(t.br, hdr[:2]); err != nil {
			return fail(t.readFailed(err))
		}
		fin, op := hdr[0]&bitFin != 0, hdr[0]&0x0f
		if hdr[0]&bitsRSV != 0 {
			return fail(t.protocolError("reserved bits set"))
		}
		if hdr[1]&bitMask == 0 {
			return fail(t.protocolError("unmasked frame from a client"))
		}
		n := uint64(hdr[1] &^ bitMask)
		switch n {
		case 126:
			if _, err := io.ReadFull(t.br, hdr[:2]); err != nil {
				return fail(t.readFailed(err))
			}
			n = uint64(binary.BigEndian.Uint16(hdr[:2]))
		case 127:
			if _, err := io.ReadFull(t.br, hdr[:8]); err != nil {
				return fail(t.readFailed(err))
			}
			n = binary.BigEndian.Uint64(hdr[:8])
			if n>>63 != 0 {
				return fail(t.protocolError("frame length with its top bit set"))
			}
		}
		var key [4]byte
		if _, err := io.ReadFull(t.br, key[:]); err != nil {
			return fail(t.readFailed(err))
		}
		switch op {
		case opClose, opPing, opPong:
			if !fin {
				return fail(t.protocolError("fragmented control frame"))
			}
			if n > maxControlPayload {
				return fail(t.protocolError("control frame longer than 125 bytes"))
			}
			var payload [maxControlPayload]byte
			p := payload[:n]
			if _, err := io.ReadFull(t.br, p); err != nil {
				return fail(t.readFailed(err))
			}
			maskBytes(key, p)
			if op == opClose {
				return fail(t.clientClose(p))
			}
			// Passed on as they come; inside a fragmented message, after
			// the message's frames so far (which the handler has not been
			// given: they go with the whole message).
			t.pre = appendClientFrame(t.pre, op, p)
			if typ == 0 {
				return nil
			}
			if len(t.pre) > maxHeldControl {
				// Held for a message that does not end: no client needs
				// more than a few pings inside one message.
				c.meter.flooded.Store(true)
				return fail(t.readFailed(errControlFlood))
			}
			continue
		case opText, opBinary:
			if typ != 0 {
				return fail(t.protocolError("data frame inside a fragmented message"))
			}
			typ = int(op)
		case opContinuation:
			if typ == 0 {
				return fail(t.protocolError("continuation frame without a message"))
			}
		default:
			return fail(t.protocolError("unknown opcode"))
		}
		have := 0
		if msg != nil {
			have = len(msg) - tapHeadroom
		}
		if n > uint64(c.g.readLimit)-uint64(have) {
			t.closeClient(websocket.CloseMessageTooBig, "")
			return fail(errClientTooLarge)
		}
		if msg == nil {
			msg = getFrameBuf()[:tapHeadroom]
		}
		// The buffer grows with what arrives (at most doubling), never
		// with what a header declares; each read is credited as payload
		// as it returns (as readFrame does), so that the meter judges
		// the next read on what is not payload only.
		start := len(msg)
		for left := int(n); left > 0; {
			if len(msg) == cap(msg) {
				msg = slices.Grow(msg, min(left, max(cap(msg), frameBufSize)))
			}
			k, err := t.br.Read(msg[len(msg) : len(msg)+min(left, cap(msg)-len(msg))])
			msg = msg[:len(msg)+k]
			c.meter.credit(k)
			left -= k
			if err != nil {
				return fail(t.readFailed(err))
			}
		}
		maskBytes(key, msg[start:]) // each frame has a key of its own
		if fin {
			break
		}
	}
	c.meter.credit(messageAllowance)
	payload := msg[tapHeadroom:]
	fwd, ok, held := c.decideHeld(payload)
	if !ok {
		putFrameBuf(msg)
		return errTapClosed
	}
	if held {
		// A held frame paused the reading, not the client (see waited
		// above).
		if span := time.Duration(t.rdSpan.Load()); span > 0 {
			_ = t.mc.SetReadDeadline(time.Now().Add(span))
		}
	}
	if fwd == nil {
		putFrameBuf(msg)
		return nil
	}
	// While the client is behind on the gate's replies, its next request
	// waits.
	if !t.waitReplies() {
		putFrameBuf(msg)
		if !sameBuf(fwd, payload) {
			putFrameBuf(fwd)
		}
		return errTapClosed
	}
	if !sameBuf(fwd, payload) {
		// A CLOSE in place of a refused frame.
		t.pre = appendClientFrame(t.pre, opText, fwd)
		putFrameBuf(fwd)
		putFrameBuf(msg)
		return nil
	}
	var head [tapHeadroom]byte
	h := appendClientHeader(head[:0], opText, len(payload))
	copy(msg[tapHeadroom-len(h):], h)
	t.rq, t.rqBuf = msg[tapHeadroom-len(h):], msg
	return nil
}

// The CLOSEs the gate owes the relay (subTable.takeClosed: subscriptions
// it closed for the client, or the relay closed, whose listeners may
// still be there) go as soon as they are owed, not before the client's
// next frame: until the relay has them it goes on matching every event
// published against those listeners and writing each match out for the
// gate to drop — the work of a subscriber nobody reads, on the
// publisher's goroutine in khatru. The subscription table calls wake on
// each mark; a reader waiting for the client's next frame, for its
// backlog or for the relay's answers stops waiting and sends them
// (sendClosed). Waiting for the next frame is waiting for its first byte
// (awaitFrame), which wake interrupts by moving the socket's read
// deadline into the past, and which leaves nothing half-read.

// sendClosed puts in pre the CLOSEs the gate owes the relay, for the
// handler to read next, and reports whether there were any.
func (t *tapConn) sendClosed() bool {
	if !t.c.subs.closesOwed() {
		return false
	}
	t.c.closeClosed(nil)
	if len(t.pre) == 0 {
		return false
	}
	t.yield = true
	return true
}

// wake is the subscription table's onMark: it interrupts the client
// reader's wait, whichever it is, for it to send the CLOSE just owed.
func (t *tapConn) wake() {
	t.wakeMu.Lock()
	if t.atEdge && !t.woken && t.raw != nil {
		t.woken = true
		_ = t.raw.SetReadDeadline(time.Unix(1, 0))
	}
	t.wakeMu.Unlock()
	t.omu.Lock()
	t.ocond.Broadcast()
	t.omu.Unlock()
	t.c.owed.poke()
}

// awaitFrame waits until the first byte of the client's next frame has
// arrived and returns woke = false, or until a CLOSE is owed (woke =
// true, nothing read). err is the read's failure.
func (t *tapConn) awaitFrame() (woke bool, err error) {
	if t.br.Buffered() > 0 {
		return false, nil
	}
	t.wakeMu.Lock()
	t.atEdge = true
	t.wakeMu.Unlock()
	// Looked at after atEdge is set: a mark before it is seen here, one
	// after it wakes the read.
	owed := t.c.subs.closesOwed()
	if !owed {
		_, err = t.br.Peek(1)
	}
	woken := t.leaveEdge()
	switch {
	case err == nil:
		return owed, nil
	case woken && isTimeout(err):
		return true, nil
	}
	return false, err
}

// leaveEdge ends awaitFrame's wait and reports whether wake interrupted
// it; the socket's read deadline is then the one last set again
// (meteredConn.rdAt, the handler's or the gate's own).
func (t *tapConn) leaveEdge() (woken bool) {
	t.wakeMu.Lock()
	defer t.wakeMu.Unlock()
	t.atEdge = false
	if !t.woken {
		return false
	}
	t.woken = false
	var d time.Time
	if at := t.mc.rdAt.Load(); at != 0 {
		d = time.Unix(0, at)
	}
	_ = t.raw.SetReadDeadline(d)
	return true
}

// toRelay implements clientSide: frame, a text frame the gate sends the
// relay (a CLOSE), queued for the handler to read before the message being
// decided. The connection goes on.
func (t *tapConn) toRelay(frame []byte) bool {
	t.pre = appendClientFrame(t.pre, opText, frame)
	return true
}

// readFailed ends the connection after a failed read of the client's
// socket and returns the read's error: a control flood is cut with 1008;
// anything else is a client gone.
func (t *tapConn) readFailed(err error) error {
	c := t.c
	if c.meter.flooded.Load() {
		c.g.cutLog.info(c.g.log, "closing client", "client", c.who, "reason", "too many control frames")
		c.g.obs.ReportCut("control_flood")
		c.end(true, true, closeSlowClient, "sluice: too many control frames")
		return errControlFlood
	}
	c.end(false, true, closeGoingAway, "client connection lost")
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// protocolError tells the client 1002 and ends the connection.
func (t *tapConn) protocolError(what string) error {
	t.closeClient(websocket.CloseProtocolError, what)
	return errors.Join(errClientProtocol, errors.New(what))
}

// closeClient ends the connection with a close frame of code and text to
// the client.
func (t *tapConn) closeClient(code int, text string) { t.c.end(true, true, code, text) }

// clientClose handles the client's close frame, payload p: checked as
// gorilla checks it, then passed on to the handler (which answers the
// client) with a code that may be sent; after it the handler reads EOF.
func (t *tapConn) clientClose(p []byte) error {
	code, text := websocket.CloseNoStatusReceived, ""
	switch {
	case len(p) == 1:
		return t.protocolError("close frame of one byte")
	case len(p) >= 2:
		code, text = int(binary.BigEndian.Uint16(p)), string(p[2:])
		if !validReceivedCloseCode(code) {
			return t.protocolError("invalid close code")
		}
		if !utf8.ValidString(text) {
			return t.protocolError("invalid UTF-8 in a close frame")
		}
	}
	code, text = relayable(&websocket.CloseError{Code: code, Text: text})
	if code == closeBadGateway {
		// Registered (IANA), but gorilla and fasthttp fail a read on it
		// as a protocol error: to the relay the client has gone.
		code = closeGoingAway
	}
	t.pre = appendClientFrame(t.pre, opClose, websocket.FormatCloseMessage(code, text))
	return io.EOF
}
