package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// tapConn is how Wrap gates an in-process relay: the relay's own
// WebSocket code serves the client's socket, and the gate sits inside that
// socket. The handler is called with the client's request (the gate's
// headers, no extension offered) and a ResponseWriter whose Hijack hands it
// a tapConn over the client's connection:
//
//   - what the handler reads is never the client's bytes. The gate reads
//     the client's frames itself (RFC 6455's server side: masked frames,
//     fragments joined up to the read limit, control frames bounded by the
//     control meter), decides each message as the bridge does (conn.decide)
//     and hands the handler only what it forwards, re-framed: one final
//     text frame per message with a zero masking key, and before it the
//     CLOSE frames the gate owes the relay. Pings and pongs are passed on as
//     frames of the gate's own; a close is passed on with a code that may
//     be sent.
//   - what the handler writes goes to the client's socket as written, after
//     the gate has read it: the 101 (which must not take an extension), then
//     frames, each relay message whose frame it has to see (not EVENT)
//     gathered and watched (conn.watch) before its last byte goes out. A
//     fragmented message is held until it is whole and written with one
//     system call. The gate's own replies (refusals) go out between the
//     relay's messages, never inside one.
//   - what the client's socket takes at once is written at once (no
//     deadline, no wait); the rest is queued up to Options.QueueBytes and
//     written by a goroutine that runs only while the queue holds anything
//     (writeSock). Every queued write has the write timeout to make
//     progress: a client whose socket stays blocked past it is cut as a
//     slow reader. Past the bound the relay's writer waits.
//
// So a gated connection in relay mode costs the relay's WebSocket
// connection and no more goroutines: no second handshake, no second
// connection, no frame read twice by two WebSocket stacks. The bridge
// (conn.run, over gorilla) stays for Proxy, whose relay is a socket away.
//
// The relay's keepalive is its own (khatru pings every 30 s and drops a
// client silent for 60 s); the gate's ping interval applies to Proxy.
type tapConn struct {
	c   *conn
	raw net.Conn     // the client's socket
	mc  *meteredConn // raw, metered: the reader reads through it
	br  *bufio.Reader

	// The read side: the handler's reading goroutine only.
	pre     []byte // frames for the handler before rq (CLOSEs the gate owes)
	preN    int    // how much of pre has been read
	rq      []byte // the rest of the forwarded message's frame
	rqBuf   []byte // rq's buffer, returned to frameBufs once rq is read
	readErr error
	// rdSpan is how far ahead the handler last set its read deadline (0:
	// none), to set it again after waiting for the client (waitBacklog).
	rdSpan atomic.Int64
	// upClose is the close frame the handler reads once the gate has
	// ended the connection (shut), before its reads fail.
	upClose atomic.Pointer[[]byte]

	// The write side, under wmu (a channel so that a goodbye can give up
	// waiting for it).
	wmu     chan struct{}
	wt      frameTrack
	headBuf []byte // the handler's 101, until it is whole
	held    *[]byte
	outBuf  []byte // track's output when it is not p's prefix (tapOut)
	replies []byte // the gate's replies waiting for a message boundary
	// nReplies is len(replies), for the client's reader to look at
	// without the write lock (waitReplies).
	nReplies atomic.Int64
	flushed  chan struct{}
	limit    atomic.Int64 // the handler's write deadline (SetWriteDeadline), Unix ns; 0: none
	// sockMid: the bytes on the socket end inside a frame (so no frame of
	// the gate's may follow them).
	sockMid bool
	// rc writes to the client's socket without waiting (tryWrite); nil
	// for a connection without a file descriptor.
	rc      syscall.RawConn
	writeFD func(uintptr) bool // t.writeOn, made once
	wv      net.Buffers        // what writeFD is to write (tryWrite)
	werr    error

	// The queue of what the socket did not take at once (writeSock).
	omu      sync.Mutex
	ocond    sync.Cond // on omu: the queue shrank, or flushing ended
	over     []byte
	flying   int  // bytes of the queue the flush goroutine is writing
	flushing bool // a flush goroutine runs: every write is queued
	failed   bool // the flush's write failed: the queue will not be written
	// notWS: the handler answered with something other than a 101.
	notWS atomic.Bool
	// answered: of the Write that found the answer not a 101, how much
	// of its bytes the socket took (notSwitching).
	answered int

	dead     atomic.Bool  // shut: every read and write fails
	refs     atomic.Int32 // the handler's call and the connection
	closedBy atomic.Bool  // the handler has called Close
	cleanup  func()       // run when refs reaches 0
}

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

// maxHold is the most of a relay message held back for one system call.
const maxHold = 64 << 10

// maxWatched is the longest relay message (not an EVENT) the gate reads
// for the replies it acts on (OK, EOSE, CLOSED, NEG-ERR, AUTH): each of
// them is a line of JSON.
const maxWatched = 64 << 10

// maxRepliesHeld is how much of the gate's replies may wait for the relay
// to finish a message before the client's reader waits too.
const maxRepliesHeld = 64 << 10

// maxHandshakeResponse bounds the handler's answer to the upgrade.
const maxHandshakeResponse = 4 << 10

// Opcodes and header bits of RFC 6455 5.2.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xa

	bitFin  = 0x80
	bitsRSV = 0x70
	bitMask = 0x80

	maxControlPayload = 125
)

var (
	// errTapClosed is every read and write of a connection the gate or
	// the handler has closed.
	errTapClosed = net.ErrClosed
	// errClientProtocol is wrapped by a read that failed on a client
	// frame breaking RFC 6455 (the client has been told 1002).
	errClientProtocol = errors.New("relay: protocol error in a client frame")
	// errClientTooLarge: a client message over the read limit (told 1009).
	errClientTooLarge = errors.New("relay: client message over the read limit")
	// errHandlerFrames: the handler wrote something that is not a server's
	// WebSocket stream the gate can read (a masked or compressed frame, an
	// extension in its 101).
	errHandlerFrames = errors.New("relay: the in-process relay wrote frames the gate cannot read")
)

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
}

// frameBoundary reports whether the stream is between frames.
func (f *frameTrack) frameBoundary() bool { return f.hn == 0 && f.left == 0 }

// boundary reports whether the stream is between messages: where a data
// frame of the gate's may go.
func (f *frameTrack) boundary() bool { return f.frameBoundary() && !f.inMsg }

// tapResponse is the ResponseWriter of a gated handler call in Wrap mode:
// a response written without hijacking (a refused upgrade) goes to the
// client as written; Hijack hands the handler the client's connection,
// tapped.
type tapResponse struct {
	http.ResponseWriter
	c        *conn
	hijacked *tapConn
	// switching: the handler set status 101 before hijacking (coder's
	// websocket does): the head goes out at Hijack, through the tap, as
	// net/http would have written it.
	switching bool
}

// WriteHeader implements http.ResponseWriter.
func (w *tapResponse) WriteHeader(code int) {
	if code == http.StatusSwitchingProtocols && w.hijacked == nil {
		w.switching = true
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

// Hijack implements http.Hijacker.
func (w *tapResponse) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked != nil {
		return nil, nil, http.ErrHijacked
	}
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("relay: response does not implement http.Hijacker")
	}
	if w.c.tap.dead.Load() {
		// Ended already (Shutdown): the server keeps the connection,
		// answers the handler's refusal and closes it.
		w.Header().Set("Connection", "close")
		return nil, nil, errTapClosed
	}
	raw, brw, err := h.Hijack()
	if err != nil {
		return nil, nil, err
	}
	t := w.c.tap
	t.lock()
	t.raw = raw
	t.mc.Conn = raw
	dead := t.dead.Load()
	t.unlock()
	if dead {
		// Ended before the handler took the socket (Shutdown): nothing
		// will close it but this.
		_ = raw.Close()
		return nil, nil, errTapClosed
	}
	if sc, ok := raw.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			t.rc = rc
		}
	}
	if n := brw.Reader.Buffered(); n > 0 {
		// Frames sent before the 101 (a client that does not wait):
		// read first, then the socket.
		early, _ := brw.Reader.Peek(n)
		t.br = bufio.NewReader(io.MultiReader(bytes.NewReader(bytes.Clone(early)), t.mc))
	} else {
		// Smaller than net/http's 4 KiB: a payload longer than the buffer
		// is read past it, straight into its message.
		t.br = bufio.NewReaderSize(t.mc, tapReadBuffer)
	}
	w.hijacked = t
	if w.switching {
		var head bytes.Buffer
		head.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
		_ = w.ResponseWriter.Header().Write(&head)
		head.WriteString("\r\n")
		if _, err := t.Write(head.Bytes()); err != nil {
			_ = t.Close()
			return nil, nil, err
		}
	}
	return t, bufio.NewReadWriter(bufio.NewReaderSize(t, 16), bufio.NewWriterSize(t, 16)), nil
}

// newTap returns the tap of c, whose socket Hijack fills in.
func newTap(c *conn, stall time.Duration) *tapConn {
	t := &tapConn{
		c:       c,
		mc:      &meteredConn{m: c.meter},
		wmu:     make(chan struct{}, 1),
		flushed: make(chan struct{}, 1),
	}
	t.mc.stall = stall
	t.ocond.L = &t.omu
	t.writeFD = t.writeOn
	t.wt.op = 0xff // before the 101
	t.refs.Store(2)
	return t
}

// handlerRequest builds the request the in-process handler is called
// with for client request r: r's path, query and Host, the forwarded
// headers h (see upstream.dial) with the client's own WebSocket key and
// version and no extension offered, addr (the client's address, "" when
// unknown) as RemoteAddr, and ctx.
func handlerRequest(ctx context.Context, r *http.Request, addr string, h http.Header) *http.Request {
	h["Upgrade"] = []string{"websocket"}
	h["Connection"] = []string{"Upgrade"}
	h["Sec-Websocket-Version"] = []string{"13"}
	h["Sec-Websocket-Key"] = []string{r.Header.Get("Sec-Websocket-Key")}
	u := &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	if u.Path == "" {
		u.Path = "/"
	}
	remoteAddr := r.RemoteAddr
	if addr != "" {
		remoteAddr = net.JoinHostPort(addr, "0")
	}
	req := &http.Request{
		Method:     http.MethodGet,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     h,
		Body:       http.NoBody,
		Host:       r.Host,
		RemoteAddr: remoteAddr,
		RequestURI: u.RequestURI(),
		TLS:        r.TLS,
	}
	return req.WithContext(ctx)
}

// unref drops one of the tap's two references (the handler's call, the
// connection); the last runs the cleanup.
func (t *tapConn) unref() {
	if t.refs.Add(-1) == 0 {
		t.cleanup()
	}
}

// --- the read side -------------------------------------------------------

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
	waited, ok := t.waitBacklog()
	if ok {
		var w bool
		w, ok = c.owed.wait(c.closing, owedWait)
		waited = waited || w
	}
	if !ok {
		return errTapClosed
	} else if waited {
		// The time the client took to catch up is not silence (the flush
		// cuts a client that reads nothing): the handler's read deadline
		// starts again from now.
		if span := time.Duration(t.rdSpan.Load()); span > 0 {
			_ = t.raw.SetReadDeadline(time.Now().Add(span))
		}
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
	fwd, ok := c.decide(payload)
	if !ok {
		putFrameBuf(msg)
		return errTapClosed
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

// toRelay queues frame, a text frame the gate sends the relay (a CLOSE),
// for the handler to read before the message being decided.
func (t *tapConn) toRelay(frame []byte) {
	t.pre = appendClientFrame(t.pre, opText, frame)
}

// appendClientHeader appends the header of a final client frame of opcode
// op and n bytes of payload, masked with the zero key (a masking that
// changes nothing: RFC 6455 requires the mask bit, not a random key, of
// the frames a server reads, and these frames go no further than this
// process).
func appendClientHeader(b []byte, op byte, n int) []byte {
	return append(appendFrameHeader(b, op, bitMask, n), 0, 0, 0, 0)
}

// appendFrameHeader appends the first bytes of a final frame's header:
// opcode op, the length n, with mask (bitMask or 0) in its mask bit.
func appendFrameHeader(b []byte, op, mask byte, n int) []byte {
	b = append(b, bitFin|op)
	switch {
	case n <= 125:
		return append(b, mask|byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, mask|126), uint16(n))
	}
	return binary.BigEndian.AppendUint64(append(b, mask|127), uint64(n))
}

// appendClientFrame appends a whole client frame of opcode op (see
// appendClientHeader).
func appendClientFrame(b []byte, op byte, payload []byte) []byte {
	return append(appendClientHeader(b, op, len(payload)), payload...)
}

// readFailed ends the connection after a failed read of the client's
// socket and returns the read's error: a control flood is cut with 1008;
// anything else is a client gone.
func (t *tapConn) readFailed(err error) error {
	c := t.c
	if c.meter.flooded.Load() {
		c.g.cutLog.info(c.g.log, "closing client", "client", c.who, "reason", "too many control frames")
		c.g.obs.ReportCut(policy.CutControlFlood)
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

// closeBadGateway is close code 1014, which a client may send and the
// handler's WebSocket stack does not read.
const closeBadGateway = 1014

// validReceivedCloseCode reports whether code may arrive in a close frame
// (RFC 6455 7.4), as gorilla judges it.
func validReceivedCloseCode(code int) bool {
	switch code {
	case 1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014:
		return true
	}
	return code >= 3000 && code <= 4999
}

// maskBytes unmasks (or masks) a frame's whole payload p in place with
// key (RFC 6455 5.3).
func maskBytes(key [4]byte, p []byte) {
	if key == [4]byte{} {
		return
	}
	var k [8]byte
	for i := range k {
		k[i] = key[i&3]
	}
	kw := binary.LittleEndian.Uint64(k[:])
	i := 0
	for ; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], binary.LittleEndian.Uint64(p[i:])^kw)
	}
	for ; i < len(p); i++ {
		p[i] ^= k[i&7]
	}
}

// --- the write side ------------------------------------------------------

func (t *tapConn) lock()   { t.wmu <- struct{}{} }
func (t *tapConn) unlock() { <-t.wmu }

// lockBy takes the write lock, waiting until deadline at most.
func (t *tapConn) lockBy(deadline time.Time) bool {
	select {
	case t.wmu <- struct{}{}:
		return true
	default:
	}
	tm := time.NewTimer(time.Until(deadline))
	defer tm.Stop()
	select {
	case t.wmu <- struct{}{}:
		return true
	case <-tm.C:
		return false
	}
}

// Write implements net.Conn for the handler: its 101, then its frames.
func (t *tapConn) Write(p []byte) (int, error) {
	t.lock()
	defer t.unlock()
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

// writeOn is tryWrite's write on the socket's descriptor: t.wv, as far as
// the socket takes it without waiting, the rest left in t.wv. A method
// value made once per connection (newTap), so that a write allocates no
// closure.
func (t *tapConn) writeOn(fd uintptr) bool {
	for len(t.wv) > 0 {
		b := t.wv[0]
		if len(b) == 0 {
			t.wv = t.wv[1:]
			continue
		}
		n, e := syscall.Write(int(fd), b)
		if e == syscall.EINTR {
			continue
		}
		if e != nil {
			if e != syscall.EAGAIN {
				t.werr = e
			}
			return true
		}
		t.wv[0] = b[n:]
		if n < len(b) {
			return true // the socket is full
		}
		t.wv = t.wv[1:]
	}
	return true
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
	for len(t.over)+t.flying > backlogLow && !t.dead.Load() {
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

// writeFailed ends the connection after a failed write to the client (no
// close frame: the socket is blocked or broken): cut as a slow reader when
// the write timed out, gone otherwise.
func (t *tapConn) writeFailed(err error) {
	c := t.c
	c.once.Do(func() {
		// Only when the failure ends the connection: one the gate is
		// already ending (its goodbye waiting for the queue) is not cut.
		switch {
		case errors.Is(err, errBacklog):
			c.g.cutLog.info(c.g.log, "closing slow client", "client", c.who, "reason", "backlog over the queue bound")
			c.g.obs.ReportCut(policy.CutSlowReader)
		case isTimeout(err):
			c.g.cutLog.info(c.g.log, "closing slow client", "client", c.who, "reason", "reads nothing")
			c.g.obs.ReportCut(policy.CutSlowReader)
		}
		t.shutLocked(false, 0, "")
	})
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
			if (f.op == opText || f.op == opBinary) && f.sift == siftNone && t.c.subs.nGone.Load() > 0 {
				f.sift = siftJudging
				if hdrAt >= 0 {
					// Decided at once when what of the message is in p
					// says enough: nothing held back, nothing copied.
					n := int(min(uint64(len(p)-i), f.left))
					if lit, ok := wire.ParseAddressed(p[i : i+n]); ok {
						f.sift = t.verdict(lit)
					} else if f.fin && uint64(n) == f.left || n >= judgeBytes {
						f.sift = siftNone
					}
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
		if lit, ok := wire.ParseAddressed(f.head); ok {
			t.judge(o, t.verdict(lit))
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
	}
	f.pre, f.head = resetBuf(f.pre), resetBuf(f.head)
}

// verdict is how a message under the subscription id literal lit goes:
// siftNone or siftDrop (conn.deliversUnder).
func (t *tapConn) verdict(lit []byte) int {
	if t.c.deliversUnder(lit) {
		return siftNone
	}
	return siftDrop
}

// resetBuf empties b for reuse, letting go of a large one.
func resetBuf(b []byte) []byte {
	if cap(b) > 4<<10 {
		return nil
	}
	return b[:0]
}

// started reports whether the 101 has been read.
func (f *frameTrack) started() bool { return f.op != 0xff }

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
		if wire.IsEvent(f.msg) { // its label and comma are enough
			f.watch = false
		}
	}
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

// reply sends the client a frame of the gate's own (a refusal): now when
// the relay's stream is between messages, else as soon as it is.
func (t *tapConn) reply(data []byte) bool {
	t.lock()
	defer t.unlock()
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

// closed reports whether the handler has sent its close frame: nothing
// of the gate's may follow it.
func (f *frameTrack) closed() bool { return f.closeSeen }

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

// appendServerFrame appends a final, unmasked frame.
func appendServerFrame(b []byte, op byte, payload []byte) []byte {
	return append(appendFrameHeader(b, op, 0, len(payload)), payload...)
}

// --- ending --------------------------------------------------------------

// shut ends the tapped connection, once (conn.end): a close frame of code
// and text to the client when toClient (if the stream is between frames,
// and the lock comes and a queue being written is written within a second:
// the close frame may only follow it), then the socket closed, so that the
// handler's writes fail and, after a close frame when toUp (see
// relayClose), its reads.
func (t *tapConn) shut(toClient, toUp bool, code int, text string) {
	if toUp {
		cl := appendClientFrame(nil, opClose, relayClose(code, text))
		t.upClose.Store(&cl)
	}
	by := time.Now().Add(time.Second)
	if !t.lockBy(by) {
		t.finish()
		return
	}
	defer t.unlock()
	if toClient && code != 0 {
		t.drainBy(by)
	}
	t.shutLocked(toClient, code, text)
}

func (t *tapConn) shutLocked(toClient bool, code int, text string) {
	if toClient && code != 0 && t.wt.started() && !t.wt.closed() && !t.sockMid && t.raw != nil && !t.notWS.Load() && len(t.headBuf) == 0 && !t.queued() {
		// What is held (part of a message) is dropped: a close frame may
		// not go inside a frame, but may inside a fragmented message,
		// where the replies waiting for its end (data frames) may not.
		var out []byte
		if t.wt.boundary() {
			out = t.replies
		}
		t.dropHeld()
		out = appendServerFrame(out, opClose, websocket.FormatCloseMessage(code, text))
		_ = t.raw.SetWriteDeadline(time.Now().Add(time.Second))
		_, err := t.raw.Write(out)
		t.replies = nil
		if err == nil {
			t.linger()
			return
		}
	}
	t.finish()
}

// linger is finish after the last bytes to a client (the gate's close
// frame, or what the handler wrote before its Close): the socket is shut
// for writing and closed a second later, so that what the client is still
// sending (a flood, or requests the relay will not read) does not make the
// close an RST, which can cost the client those last bytes and what the
// kernel still holds before them. Reads fail at once.
func (t *tapConn) linger() {
	t.markShut()
	_ = t.raw.SetReadDeadline(time.Now())
	if cw, ok := t.raw.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		raw := t.raw
		time.AfterFunc(time.Second, func() { _ = raw.Close() })
		return
	}
	_ = t.raw.Close()
}

// drainBy waits, with the write lock held, until the queue is written (or
// its flush has failed, or the connection is shut), until deadline at the
// latest: with the write lock held,
// the queue only shrinks, and a client that reads takes it within the
// second shut gives it (what a client that does not read holds is cut
// with the socket, as before).
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

// relayClose is the close payload the relay is told when the gate ends a
// client's connection with code and text: its own cut (1008) and the
// client's protocol errors read to the relay as a client gone (1001: a
// 1008 or 1002 would read as the client's own error there, and khatru
// logs every one), anything else as it is.
func relayClose(code int, text string) []byte {
	switch code {
	case closeSlowClient:
		return websocket.FormatCloseMessage(closeGoingAway, "sluice: client cut")
	case websocket.CloseProtocolError, websocket.CloseMessageTooBig:
		return websocket.FormatCloseMessage(closeGoingAway, "client connection lost")
	}
	return websocket.FormatCloseMessage(code, text)
}

// markShut marks the connection shut (once, inside conn.end's once):
// every read and write fails from now on, and the connection's context ends.
func (t *tapConn) markShut() {
	t.dead.Store(true)
	close(t.c.closing)
	t.c.cancel()
	// Wakes a client reader waiting for the backlog (waitBacklog).
	t.omu.Lock()
	t.ocond.Broadcast()
	t.omu.Unlock()
}

// finish marks the connection shut and closes the socket.
func (t *tapConn) finish() {
	t.markShut()
	if t.raw != nil {
		_ = t.raw.Close()
	}
}

// Close implements net.Conn for the handler: what it wrote is written
// (the queue as any queued write: for as long as the client's socket takes
// it, each piece within the write timeout; what the gate held, as far as a
// second allows), then the socket closed: a second after it was shut for
// writing (linger) when the client was behind.
func (t *tapConn) Close() error {
	// The lock within a second (a handler's writer may wait for room in
	// the queue meanwhile), and then the queue written, outside c.once:
	// a flush that fails ends the connection through it.
	locked := t.lockBy(time.Now().Add(time.Second))
	// The queue goes out as long as the client reads it, for a write
	// timeout at most: a client reading slowly must not hold the handler's
	// Close for as long as its backlog takes.
	behind := locked && t.queued()
	if behind {
		t.drainBy(time.Now().Add(t.mc.stall))
	}
	t.c.once.Do(func() {
		if !locked {
			t.finish()
			return
		}
		var err error
		if t.dead.Load() || t.queued() {
			err = errTapClosed
		} else if t.held != nil {
			_ = t.raw.SetWriteDeadline(time.Now().Add(time.Second))
			_, err = t.raw.Write(*t.held)
		}
		t.dropHeld()
		if err != nil {
			t.finish()
			return
		}
		if behind {
			// The client was behind: the kernel still holds a socket
			// buffer of what the handler wrote, which closing at once
			// with requests of the client's unread (a reset) would lose.
			t.linger()
			return
		}
		t.finish()
	})
	if locked {
		t.unlock()
	}
	if t.closedBy.CompareAndSwap(false, true) {
		t.unref()
	}
	return nil
}

// LocalAddr implements net.Conn.
func (t *tapConn) LocalAddr() net.Addr { return t.raw.LocalAddr() }

// RemoteAddr implements net.Conn.
func (t *tapConn) RemoteAddr() net.Addr { return t.raw.RemoteAddr() }

// SetDeadline implements net.Conn.
func (t *tapConn) SetDeadline(d time.Time) error {
	_ = t.SetWriteDeadline(d)
	return t.SetReadDeadline(d)
}

// SetReadDeadline implements net.Conn: the client's socket's, until the
// connection is shut.
func (t *tapConn) SetReadDeadline(d time.Time) error {
	if t.dead.Load() {
		return nil
	}
	var span time.Duration
	if !d.IsZero() {
		span = time.Until(d)
	}
	t.rdSpan.Store(int64(span))
	return t.raw.SetReadDeadline(d)
}

// SetWriteDeadline implements net.Conn: it caps the deadline of the
// socket's writes (see renew), which the gate sets itself.
func (t *tapConn) SetWriteDeadline(d time.Time) error {
	var ns int64
	if !d.IsZero() {
		ns = d.UnixNano()
	}
	t.limit.Store(ns)
	return nil
}
