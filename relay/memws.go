package relay

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// memWS is the gate's end of a WebSocket to an in-process relay (Wrap),
// spoken over a memPipe by the gate itself rather than by a gorilla client
// connection: the relay is a handler in this process, so the client side of
// RFC 6455 is all the gate needs, and most of what a general client does per
// connection (its handshake request written and parsed back, a response
// parsed by net/http, a connection object with buffers of its own) was a
// good part of what a short-lived client cost. What it keeps of the
// protocol is what the relay's side requires and what the gate relies on:
//
//   - every frame it writes is masked, with a fresh key (the relay's server
//     side refuses unmasked frames), and a message goes as one final frame;
//   - a relay frame that is masked, sets a reserved bit, has an unknown
//     opcode, is a fragmented or oversized (125 bytes) control frame, or
//     breaks the order of a fragmented message is a protocol error: the
//     relay is told 1002 and the read fails;
//   - a relay message is read whole, fragments joined, up to
//     maxRelayMessage bytes: a longer one is refused before it is read (the
//     relay is told 1009) and the read fails, so no length a frame claims
//     makes the gate allocate more than that;
//   - pings are answered with pongs, pongs go to the pong handler, and a
//     close frame is answered with a close of the same code (none for a
//     close without one) and returned as a *websocket.CloseError, codes and
//     text checked as gorilla checks them;
//   - once a close frame has been sent, every write fails with
//     websocket.ErrCloseSent.
//
// It has the methods of *websocket.Conn that the gate uses (upConn). One
// goroutine reads; writes may come from any goroutine, one frame at a time.
type memWS struct {
	conn net.Conn
	br   *bufio.Reader
	pong func(string) error // the pong handler; nil: none
	// limit is the longest message read: maxRelayMessage (a field so that
	// tests can lower it).
	limit int

	readErr error // once a read has failed, every read fails so

	// wmu is the write lock, a channel so that a control frame can give up
	// waiting for it at its deadline, as gorilla's WriteControl does.
	wmu       chan struct{}
	closeSent bool // guarded by wmu
	// deadline is that of message writes (SetWriteDeadline), in Unix
	// nanoseconds; 0: none.
	deadline atomic.Int64
}

// maxRelayMessage bounds a message the gate reads from an in-process relay.
// Relay messages are the relay's answers: events it accepted within its own
// read limit (khatru's is 512,000 bytes, sluice's DefaultReadLimit 512 KiB),
// notices, negentropy messages. The bound only keeps a frame header from
// naming any length it likes.
const maxRelayMessage = 16 << 20

// memWSReadBuffer is the reader's buffer: frame headers and small frames;
// a larger payload is read past it, straight into its message.
const memWSReadBuffer = 512

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

// errRelayProtocol is wrapped by a read that failed on a relay frame
// breaking RFC 6455; errRelayTooLarge by one over maxRelayMessage.
var (
	errRelayProtocol = errors.New("relay: protocol error in a relay frame")
	errRelayTooLarge = errors.New("relay: relay message too large")
)

// newMemWS returns the framer over conn, reading through br (which may
// hold bytes the relay wrote after its handshake).
func newMemWS(conn net.Conn, br *bufio.Reader) *memWS {
	return &memWS{conn: conn, br: br, limit: maxRelayMessage, wmu: make(chan struct{}, 1)}
}

// SetPongHandler sets the function called with each pong's payload, on
// the reading goroutine.
func (c *memWS) SetPongHandler(h func(appData string) error) { c.pong = h }

// SetReadDeadline implements upConn.
func (c *memWS) SetReadDeadline(t time.Time) error { return c.conn.SetReadDeadline(t) }

// SetWriteDeadline sets the deadline of message writes (WriteMessage).
func (c *memWS) SetWriteDeadline(t time.Time) error {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	c.deadline.Store(ns)
	return nil
}

// Close closes the connection without a close frame (see WriteControl).
func (c *memWS) Close() error { return c.conn.Close() }

// ReadMessage returns the next data message, text or binary, in a slice of
// its own, answering the control frames before it.
func (c *memWS) ReadMessage() (int, []byte, error) {
	if c.readErr != nil {
		return 0, nil, c.readErr
	}
	typ, msg, err := c.readMessage()
	if err != nil {
		c.readErr = err
		return 0, nil, err
	}
	return typ, msg, nil
}

func (c *memWS) readMessage() (int, []byte, error) {
	typ := 0 // the message's opcode once its first frame is read
	var msg []byte
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(c.br, hdr[:2]); err != nil {
			return 0, nil, eofUnexpected(err)
		}
		fin, op := hdr[0]&bitFin != 0, hdr[0]&0x0f
		if hdr[0]&bitsRSV != 0 {
			return 0, nil, c.protocolError("reserved bits set")
		}
		if hdr[1]&bitMask != 0 {
			return 0, nil, c.protocolError("masked frame from the server")
		}
		n := uint64(hdr[1] &^ bitMask)
		switch n {
		case 126:
			if _, err := io.ReadFull(c.br, hdr[:2]); err != nil {
				return 0, nil, eofUnexpected(err)
			}
			n = uint64(binary.BigEndian.Uint16(hdr[:2]))
		case 127:
			if _, err := io.ReadFull(c.br, hdr[:8]); err != nil {
				return 0, nil, eofUnexpected(err)
			}
			n = binary.BigEndian.Uint64(hdr[:8])
			if n>>63 != 0 {
				return 0, nil, c.protocolError("frame length with its top bit set")
			}
		}
		switch op {
		case opClose, opPing, opPong:
			if !fin {
				return 0, nil, c.protocolError("fragmented control frame")
			}
			if n > maxControlPayload {
				return 0, nil, c.protocolError("control frame longer than 125 bytes")
			}
			var payload [maxControlPayload]byte
			p := payload[:n]
			if _, err := io.ReadFull(c.br, p); err != nil {
				return 0, nil, eofUnexpected(err)
			}
			if err := c.control(op, p); err != nil {
				return 0, nil, err
			}
			continue
		case opText, opBinary:
			if typ != 0 {
				return 0, nil, c.protocolError("data frame inside a fragmented message")
			}
			typ = int(op)
		case opContinuation:
			if typ == 0 {
				return 0, nil, c.protocolError("continuation frame without a message")
			}
		default:
			return 0, nil, c.protocolError("unknown opcode")
		}
		if n > uint64(c.limit-len(msg)) {
			c.closeWith(websocket.CloseMessageTooBig, "")
			return 0, nil, errRelayTooLarge
		}
		if msg == nil && fin {
			msg = make([]byte, n) // the common case: one frame, one allocation
		} else {
			msg = append(msg, make([]byte, n)...)
		}
		if _, err := io.ReadFull(c.br, msg[len(msg)-int(n):]); err != nil {
			return 0, nil, eofUnexpected(err)
		}
		if fin {
			return typ, msg, nil
		}
	}
}

// control handles a control frame read inside ReadMessage.
func (c *memWS) control(op byte, p []byte) error {
	switch op {
	case opPing:
		// As gorilla's default ping handler: a pong that cannot be sent is
		// no reason to fail the read; the next write or read says why.
		_ = c.WriteControl(websocket.PongMessage, p, time.Now().Add(time.Second))
		return nil
	case opPong:
		if c.pong != nil {
			return c.pong(string(p))
		}
		return nil
	}
	code, text := websocket.CloseNoStatusReceived, ""
	switch {
	case len(p) == 1:
		return c.protocolError("close frame of one byte")
	case len(p) >= 2:
		code, text = int(binary.BigEndian.Uint16(p)), string(p[2:])
		if !validReceivedCloseCode(code) {
			return c.protocolError("invalid close code")
		}
		if !utf8.ValidString(text) {
			return c.protocolError("invalid UTF-8 in a close frame")
		}
	}
	// Answer with the same code, as gorilla's default close handler does
	// (an empty close for a close without a code).
	_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(time.Second))
	return &websocket.CloseError{Code: code, Text: text}
}

// validReceivedCloseCode reports whether code may arrive in a close frame
// (RFC 6455 7.4), as gorilla judges it.
func validReceivedCloseCode(code int) bool {
	switch code {
	case 1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014:
		return true
	}
	return code >= 3000 && code <= 4999
}

// protocolError tells the relay 1002 and returns the read's error.
func (c *memWS) protocolError(what string) error {
	c.closeWith(websocket.CloseProtocolError, what)
	return errors.Join(errRelayProtocol, errors.New(what))
}

func (c *memWS) closeWith(code int, text string) {
	_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
}

// eofUnexpected turns an EOF in the middle of a frame, or before one, into
// io.ErrUnexpectedEOF: the relay went without a close frame.
func eofUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// WriteMessage writes data as one final, masked frame of type typ (text or
// binary), within the write deadline.
func (c *memWS) WriteMessage(typ int, data []byte) error {
	if typ != websocket.TextMessage && typ != websocket.BinaryMessage {
		return errors.New("relay: not a data message type")
	}
	c.wmu <- struct{}{}
	defer func() { <-c.wmu }()
	var deadline time.Time
	if ns := c.deadline.Load(); ns != 0 {
		deadline = time.Unix(0, ns)
	}
	return c.writeFrame(byte(typ), data, deadline)
}

// WriteControl writes a control frame (close, ping, pong) of at most 125
// bytes, waiting for the write lock and the pipe no longer than deadline.
// After a close frame, every write fails with websocket.ErrCloseSent.
func (c *memWS) WriteControl(typ int, data []byte, deadline time.Time) error {
	if typ != websocket.CloseMessage && typ != websocket.PingMessage && typ != websocket.PongMessage {
		return errors.New("relay: not a control message type")
	}
	if len(data) > maxControlPayload {
		return errors.New("relay: control frame too long")
	}
	if !c.lock(deadline) {
		return errWriteTimeout
	}
	defer func() { <-c.wmu }()
	return c.writeFrame(byte(typ), data, deadline)
}

// errWriteTimeout is a control frame's wait for the write lock past its
// deadline.
var errWriteTimeout = timeoutError{}

type timeoutError struct{}

func (timeoutError) Error() string   { return "relay: write timed out" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// lock takes the write lock, waiting until deadline at most (zero: for
// as long as it takes). A timer is made only when the lock is held.
func (c *memWS) lock(deadline time.Time) bool {
	select {
	case c.wmu <- struct{}{}:
		return true
	default:
	}
	if deadline.IsZero() {
		c.wmu <- struct{}{}
		return true
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case c.wmu <- struct{}{}:
		return true
	case <-t.C:
		return false
	}
}

// memWSChunk is the most of a frame masked and written at once.
const memWSChunk = 4 << 10

var memWSBufs = sync.Pool{New: func() any { b := make([]byte, memWSChunk); return &b }}

// writeFrame writes one final frame of opcode op with payload data, masked
// with a fresh key, in pieces of memWSChunk. wmu is held.
func (c *memWS) writeFrame(op byte, data []byte, deadline time.Time) error {
	if c.closeSent {
		return websocket.ErrCloseSent
	}
	if op == opClose {
		c.closeSent = true
	}
	if err := c.conn.SetWriteDeadline(deadline); err != nil {
		return err
	}
	bp := memWSBufs.Get().(*[]byte)
	defer memWSBufs.Put(bp)
	buf := *bp
	var key [4]byte
	binary.LittleEndian.PutUint32(key[:], rand.Uint32())
	h := appendFrameHeader(buf[:0], op, len(data), key)
	pos := 0
	for first := true; first || pos < len(data); first = false {
		out := buf[:0]
		if first {
			out = h
		}
		n := min(len(data)-pos, cap(out)-len(out))
		out = out[:len(out)+n]
		maskBytes(key, pos, out[len(out)-n:], data[pos:pos+n])
		pos += n
		if _, err := c.conn.Write(out); err != nil {
			return err
		}
	}
	return nil
}

// appendFrameHeader appends the header of a final, masked client frame of
// opcode op and n bytes of payload, with its masking key.
func appendFrameHeader(b []byte, op byte, n int, key [4]byte) []byte {
	b = append(b, bitFin|op)
	switch {
	case n <= 125:
		b = append(b, bitMask|byte(n))
	case n <= 0xffff:
		b = append(b, bitMask|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, bitMask|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, key[:]...)
}

// maskBytes writes src masked with key into dst (as long as src), pos being
// src's offset in the payload (RFC 6455 5.3).
func maskBytes(key [4]byte, pos int, dst, src []byte) {
	// Rotate the key so that dst[0] takes key[0].
	var k [8]byte
	for i := range k {
		k[i] = key[(pos+i)&3]
	}
	kw := binary.LittleEndian.Uint64(k[:])
	i := 0
	for ; i+8 <= len(src); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], binary.LittleEndian.Uint64(src[i:])^kw)
	}
	for ; i < len(src); i++ {
		dst[i] = src[i] ^ k[i&7]
	}
}
