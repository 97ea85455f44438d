package relay

import (
	"encoding/binary"
	"sync"

	"github.com/gorilla/websocket"
)

// This file holds RFC 6455 as the gate writes and reads it by hand (the
// tap, both ways) or through gorilla (the bridge): opcodes and header
// bits, frame headers, masking, which close codes may arrive and which may
// be sent on, and the pool of buffers a client's message is read into.

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

// Close codes the gate sends on its own account.
const (
	closeSlowClient = websocket.ClosePolicyViolation // 1008: queue full
	closeGoingAway  = websocket.CloseGoingAway       // 1001: shutdown, upstream lost
)

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

// appendClientHeader appends the header of a final client frame of opcode
// op and n bytes of payload, masked with the zero key (a masking that
// changes nothing: RFC 6455 requires the mask bit, not a random key, of
// the frames a server reads, and these frames go no further than this
// process).
func appendClientHeader(b []byte, op byte, n int) []byte {
	return append(appendFrameHeader(b, op, bitMask, n), 0, 0, 0, 0)
}

// appendClientFrame appends a whole client frame of opcode op (see
// appendClientHeader).
func appendClientFrame(b []byte, op byte, payload []byte) []byte {
	return append(appendClientHeader(b, op, len(payload)), payload...)
}

// appendServerFrame appends a final, unmasked frame.
func appendServerFrame(b []byte, op byte, payload []byte) []byte {
	return append(appendFrameHeader(b, op, 0, len(payload)), payload...)
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

// validReceivedCloseCode reports whether code may arrive in a close frame
// (RFC 6455 7.4), as gorilla judges it.
func validReceivedCloseCode(code int) bool {
	switch code {
	case 1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014:
		return true
	}
	return code >= 3000 && code <= 4999
}

// closeBadGateway is close code 1014, which a client may send and the
// handler's WebSocket stack does not read.
const closeBadGateway = 1014

// relayable maps a received close onto one that may be sent: 1005 and
// 1006 are reserved for "no status" and must not appear on the wire.
func relayable(ce *websocket.CloseError) (int, string) {
	switch ce.Code {
	case websocket.CloseNoStatusReceived, websocket.CloseAbnormalClosure, websocket.CloseTLSHandshake:
		return websocket.CloseNormalClosure, ""
	}
	return ce.Code, ce.Text
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

// maxKeptFrameBuf is the largest read buffer kept for another frame: one
// large frame must not pin its buffer, whether it was forwarded or refused.
const maxKeptFrameBuf = 64 << 10

// frameBufs lends the client readers their frame buffers for the length of
// one frame: a connection waiting for its next frame holds none.
var frameBufs sync.Pool

func getFrameBuf() []byte {
	if b, ok := frameBufs.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, frameBufSize)
}

// frameBufSize is the size of a new frame buffer.
const frameBufSize = 4096

func putFrameBuf(b []byte) {
	if cap(b) == 0 || cap(b) > maxKeptFrameBuf {
		return
	}
	b = b[:0]
	frameBufs.Put(&b)
}

// resetBuf empties b for reuse, letting go of a large one.
func resetBuf(b []byte) []byte {
	if cap(b) > 4<<10 {
		return nil
	}
	return b[:0]
}
