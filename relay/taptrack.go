package relay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"

	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// This file holds the tracker of what the handler writes: its answer to
// the upgrade, then its frames, read as they pass on their way to the
// client (track), so that the gate sees the relay's replies it acts on
// (conn.watch), holds back and drops what a subscription closed for the
// client must not deliver (sifting), and knows where a frame of its own
// may go.

// errHandlerFrames: the handler wrote something that is not a server's
// WebSocket stream the gate can read (a masked or compressed frame, an
// extension in its 101).
var errHandlerFrames = errors.New("relay: the in-process relay wrote frames the gate cannot read")

// maxWatched is the longest relay message (not an EVENT) the gate reads
// for the replies it acts on (OK, EOSE, CLOSED, NEG-ERR, AUTH): each of
// them is a line of JSON.
const maxWatched = 64 << 10

// maxHandshakeResponse bounds the handler's answer to the upgrade.
const maxHandshakeResponse = 4 << 10

// frameTrack follows the frames the handler writes.
type frameTrack struct {
	hdr   [14]byte
	hn    int    // header bytes gathered
	left  uint64 // payload bytes of the current frame still to come
	op    byte   // the current frame's opcode
	fin   bool
	inMsg bool // a fragmented data message is open
	// watch: the current data message is gathered into msg for conn.watch
	// (text, not an EVENT, not over maxWatched).
	watch     bool
	decided   bool // whether watch was decided for the current message
	msg       []byte
	closeSeen bool // the handler's close frame has been written
	// sift: how the current data message goes to the client (siftNone,
	// siftJudging, siftDrop); pre holds what of it is held back while it
	// is judged, head the first judgeBytes of its payload.
	sift      int
	pre, head []byte
	// held is the payload bytes of the current message held back while it
	// is judged: counted to the read budget if it goes (readmeter.go).
	held uint64
	// size is the payload bytes of the current message's first frame (the
	// whole message, unless fragmented), and paid those of them counted
	// to the read budget already: at its header (conn.readTake) or when it
	// was judged (conn.readClosing).
	size, paid uint64
	// headDue: the current message is let through and its first payload
	// bytes are yet to be read by conn.readHead.
	headDue bool
}

// started reports whether the 101 has been read.
func (f *frameTrack) started() bool { return f.op != 0xff }

// frameBoundary reports whether the stream is between frames.
func (f *frameTrack) frameBoundary() bool { return f.hn == 0 && f.left == 0 }

// boundary reports whether the stream is between messages: where a data
// frame of the gate's may go.
func (f *frameTrack) boundary() bool { return f.frameBoundary() && !f.inMsg }

// closed reports whether the handler has sent its close frame: nothing
// of the gate's may follow it.
func (f *frameTrack) closed() bool { return f.closeSeen }

// begin starts the frame whose header of need bytes is in hdr.
func (f *frameTrack) begin(need int) error {
	f.hn = 0
	f.fin, f.op = f.hdr[0]&bitFin != 0, f.hdr[0]&0x0f
	switch need {
	case 2:
		f.left = uint64(f.hdr[1] & 0x7f)
	case 4:
		f.left = uint64(binary.BigEndian.Uint16(f.hdr[2:4]))
	default:
		f.left = binary.BigEndian.Uint64(f.hdr[2:10])
	}
	switch f.op {
	case opText, opBinary:
		if f.inMsg {
			return errHandlerFrames
		}
		f.inMsg = true
		f.watch, f.decided = f.op == opText, false
		f.msg = f.msg[:0]
	case opContinuation:
		if !f.inMsg {
			return errHandlerFrames
		}
	case opClose, opPing, opPong:
		if !f.fin || f.left > maxControlPayload {
			return errHandlerFrames
		}
	default:
		return errHandlerFrames
	}
	return nil
}

// gather adds b to the message being watched, deciding early that an
// EVENT is not.
func (f *frameTrack) gather(b []byte) {
	if f.op == opClose || f.op == opPing || f.op == opPong {
		return
	}
	if len(f.msg)+len(b) > maxWatched {
		f.watch = false
		f.msg = nil
		return
	}
	f.msg = append(f.msg, b...)
	if !f.decided && len(f.msg) >= len(`["EVENT",`) {
		f.decided = true
		if label, _ := scan.ReadRelay(f.msg); label == "EVENT" { // its label and comma are enough
			f.watch = false
		}
	}
}

// track reads p, the next bytes the handler writes: the 101 first, then
// frames, watching the relay messages the gate acts on. It returns what is
// left to write: p's frames, less the relay messages the client must not
// get (sift), and with a message the gate is still deciding on, or a
// frame header not whole yet, held back for a later call (in t.wt).
func (t *tapConn) track(p []byte) ([]byte, error) {
	if !t.wt.started() {
		if err := t.trackHead(&p); err != nil || len(p) == 0 {
			return nil, err
		}
	}
	o := tapOut{p: p, buf: t.outBuf[:0]}
	f := &t.wt
	hdrAt := -1 // where in p the header being read began; -1: before p
	for i := 0; i < len(p); {
		if f.left == 0 && f.hn == 0 || f.hn > 0 {
			// A header, or the rest of one.
			if f.hn == 0 {
				hdrAt = i
			}
			f.hdr[f.hn] = p[i]
			f.hn++
			i++
			need := 2
			if f.hn >= 2 {
				switch f.hdr[1] & 0x7f {
				case 126:
					need = 4
				case 127:
					need = 10
				}
				if f.hdr[1]&bitMask != 0 || f.hdr[0]&bitsRSV != 0 {
					return nil, errHandlerFrames
				}
			}
			if f.hn < need {
				continue
			}
			if err := f.begin(need); err != nil {
				return nil, err
			}
			if f.op == opText || f.op == opBinary {
				f.size, f.paid = f.left, 0
			}
			if (f.op == opText || f.op == opBinary) && f.sift == siftNone && (t.c.subs.nGone.Load() > 0 || !t.readTake()) {
				f.sift = siftJudging
				if hdrAt >= 0 {
					// Decided at once when what of the message is in p
					// says enough: nothing held back, nothing copied.
					n := int(min(uint64(len(p)-i), f.left))
					if lit := addressed(p[i : i+n]); lit != nil {
						f.sift = t.verdict(&o, lit)
					} else if f.fin && uint64(n) == f.left || n >= judgeBytes {
						f.sift = siftNone
					}
				}
			}
			if f.op != opClose && f.op != opPing && f.op != opPong {
				// Sent: counted to the read budget (readmeter.go); a
				// message held back is counted when it is let through.
				switch f.sift {
				case siftNone:
					t.c.readCount(int(f.left - f.paid))
					f.paid = 0
					if f.op != opContinuation {
						f.headDue = true
					}
				case siftJudging:
					f.held += f.left
				}
			}
			switch {
			case hdrAt < 0:
				t.route(&o, f.hdr[:need], -1, false)
			case f.sift == siftNone && !o.copied && hdrAt == o.same:
				o.same = i // the common case, inline
			default:
				t.route(&o, p[hdrAt:i], hdrAt, false)
			}
			hdrAt = -1
			if f.left == 0 {
				t.frameDone(&o)
			}
			continue
		}
		n := int(min(uint64(len(p)-i), f.left))
		if f.watch {
			f.gather(p[i : i+n])
		}
		if f.headDue && n > 0 {
			f.headDue = false
			t.c.readHead(p[i : i+n])
		}
		if f.sift == siftNone && !o.copied && i == o.same {
			o.same = i + n // the common case, inline
		} else {
			t.route(&o, p[i:i+n], i, true)
		}
		i += n
		f.left -= uint64(n)
		if f.left == 0 {
			t.frameDone(&o)
		}
	}
	if o.copied && cap(o.buf) <= maxHold {
		t.outBuf = o.buf[:0] // for the next call: what is returned is written or copied first
	}
	return o.bytes(), nil
}

// Sifting (see subTable): a data message the relay starts while the
// connection remembers subscription ids closed for the client is held
// back whole from its first byte until the gate has read enough of it to
// know whether it is an EVENT or EOSE under one of them (conn.delivers);
// then it is let through, or dropped to its last frame. Control frames
// inside a fragmented message go as they come. Nothing of a message is
// written before it is decided, so a dropped one leaves no part of itself
// on the client's stream.
const (
	siftNone    = iota // the message goes as it comes
	siftJudging        // held back (frameTrack.pre) until decided
	siftDrop           // decided: none of it goes
)

// judgeBytes is how much of a message's payload the gate reads at most
// to decide on it: its label and subscription id, even escaped and padded
// (a relay writes them in its first hundred bytes); one it cannot place
// by then is let through.
const judgeBytes = 1 << 10

// tapOut builds what track returns: p itself, or the part of it up to
// the first byte held back or dropped, while nothing else is to go;
// otherwise a copy of what goes, in buf.
type tapOut struct {
	p      []byte
	same   int // while !copied, the output is p[:same]
	copied bool
	buf    []byte
}

// emit adds b to the output; at is where b starts in p (-1: not in p).
func (o *tapOut) emit(b []byte, at int) {
	if !o.copied && at == o.same {
		o.same += len(b)
		return
	}
	if !o.copied {
		o.copied = true
		o.buf = append(o.buf, o.p[:o.same]...)
	}
	o.buf = append(o.buf, b...)
}

func (o *tapOut) bytes() []byte {
	if o.copied {
		return o.buf
	}
	return o.p[:o.same]
}

// route sends b, the bytes of the current frame's header or (payload)
// of its payload, where the current message's sifting says: out, held
// back, or nowhere. Control frames always go out. at is where b starts in
// p (-1: not in p).
func (t *tapConn) route(o *tapOut, b []byte, at int, payload bool) {
	f := &t.wt
	if f.op == opClose || f.op == opPing || f.op == opPong {
		o.emit(b, at)
		return
	}
	switch f.sift {
	case siftNone:
		o.emit(b, at)
	case siftJudging:
		f.pre = append(f.pre, b...)
		if !payload {
			return
		}
		f.head = append(f.head, b[:min(len(b), judgeBytes-len(f.head))]...)
		if lit := addressed(f.head); lit != nil {
			t.judge(o, t.verdict(o, lit))
		} else if len(f.head) >= judgeBytes {
			t.judge(o, siftNone)
		}
	}
}

// judge ends the sifting of the current message with how it goes, sift:
// the held-back bytes go out, or the message is dropped.
func (t *tapConn) judge(o *tapOut, sift int) {
	f := &t.wt
	if f.sift = sift; sift == siftNone {
		o.emit(f.pre, -1)
		t.c.readCount(int(f.held - f.paid))
		t.c.readHead(f.head)
	}
	f.held, f.paid = 0, 0
	f.pre, f.head = resetBuf(f.pre), resetBuf(f.head)
}

// verdict is how a message under the subscription id literal lit goes:
// siftNone or siftDrop (conn.deliversUnder); a message dropped because
// the client's read budget is spent is replaced, in o, by the CLOSED that
// ends its subscription (conn.readClosing).
func (t *tapConn) verdict(o *tapOut, lit []byte) int {
	f := &t.wt
	if !t.c.deliversUnder(lit) {
		t.c.readUntake(int(f.paid))
		f.paid = 0
		return siftDrop
	}
	closed, refused := t.c.readClosing(lit, int(f.size-f.paid))
	if refused {
		t.c.readUntake(int(f.paid))
		f.paid = 0
		if closed != nil {
			o.emit(appendServerFrame(nil, opText, closed), -1)
		}
		return siftDrop
	}
	f.paid = f.size
	return siftNone
}

// readTake counts the current message's first frame to the read budget
// as it starts (conn.readTake), and reports whether it did.
func (t *tapConn) readTake() bool {
	f := &t.wt
	if !t.c.readTake(int(f.left)) {
		return false
	}
	f.paid = f.left
	return true
}

// frameDone ends the current frame: a data message's final frame hands a
// watched message to conn.watch (before its last byte reaches the
// client); a close frame means the gate sends nothing after it.
func (t *tapConn) frameDone(o *tapOut) {
	f := &t.wt
	switch f.op {
	case opClose:
		f.closeSeen = true
		return
	case opPing, opPong:
		return
	}
	if !f.fin {
		return
	}
	f.inMsg = false
	if f.sift == siftJudging {
		// The whole message is read and names no subscription.
		t.judge(o, siftNone)
	}
	f.sift = siftNone
	if f.watch {
		t.c.watch(f.msg)
	}
	f.watch = false
	f.msg = resetBuf(f.msg)
}

// trackHead reads the handler's answer to the upgrade from *p, gathering
// it until whole, and leaves in *p what follows it. A 101 must not take an
// extension (none was offered); anything else is passed on as it is and
// the connection is no WebSocket to the gate.
func (t *tapConn) trackHead(p *[]byte) error {
	const switching = "HTTP/1.1 101 "
	b := *p
	if len(t.headBuf) > 0 {
		b = append(t.headBuf, b...)
	}
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) > maxHandshakeResponse {
			return errHandlerFrames
		}
		if len(b) >= len(switching) && string(b[:len(switching)]) != switching {
			return t.notSwitching(b, p)
		}
		t.headBuf = append(t.headBuf[:0], b...)
		*p = nil
		return nil
	}
	head := b[:end+4]
	if !bytes.HasPrefix(head, []byte(switching)) {
		return t.notSwitching(b, p)
	}
	for _, line := range bytes.Split(head, []byte("\r\n")) {
		k, _, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(k), []byte("Sec-WebSocket-Extensions")) {
			return errHandlerFrames
		}
	}
	t.wt.op = 0
	if err := t.writeSock(net.Buffers{head}); err != nil {
		return err
	}
	t.headBuf = nil
	*p = b[end+4:]
	return nil
}

// notSwitching passes on b, the start of an answer to the upgrade that is
// not a 101: from now on the handler's bytes go to the client as they are,
// and it reads nothing of the client's.
func (t *tapConn) notSwitching(b []byte, p *[]byte) error {
	t.notWS.Store(true)
	t.headBuf = nil
	held := len(b) - len(*p) // gathered from earlier writes, reported written then
	*p = nil
	k, err := t.writeAnswer(b)
	t.answered = max(k-held, 0)
	return err
}
