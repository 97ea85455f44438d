package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// serverFrame is a frame as a relay sends it: unmasked unless mask.
func serverFrame(fin bool, op byte, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= bitFin
	}
	b := []byte{b0}
	switch n := len(payload); {
	case n <= 125:
		b = append(b, byte(n))
	case n <= 0xffff:
		b = append(b, 126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, payload...)
}

// clientFrame is one frame the gate wrote, unmasked.
type clientFrame struct {
	fin    bool
	op     byte
	masked bool
	data   []byte
}

// readClientFrame reads one frame the gate wrote on r and unmasks it.
func readClientFrame(t *testing.T, r io.Reader) clientFrame {
	t.Helper()
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		t.Fatalf("reading the gate's frame: %v", err)
	}
	f := clientFrame{fin: h[0]&bitFin != 0, op: h[0] & 0x0f, masked: h[1]&bitMask != 0}
	n := uint64(h[1] &^ bitMask)
	var ext [8]byte
	switch n {
	case 126:
		io.ReadFull(r, ext[:2])
		n = uint64(binary.BigEndian.Uint16(ext[:2]))
	case 127:
		io.ReadFull(r, ext[:8])
		n = binary.BigEndian.Uint64(ext[:8])
	}
	var key [4]byte
	if f.masked {
		io.ReadFull(r, key[:])
	}
	f.data = make([]byte, n)
	if _, err := io.ReadFull(r, f.data); err != nil {
		t.Fatalf("reading the gate's frame: %v", err)
	}
	for i := range f.data {
		f.data[i] ^= key[i&3]
	}
	return f
}

// closeCode is the code of a close frame's payload (1005 for none).
func closeCode(p []byte) int {
	if len(p) < 2 {
		return websocket.CloseNoStatusReceived
	}
	return int(binary.BigEndian.Uint16(p))
}

// Every frame the relay may send the gate reads as a relay's client must:
// messages whole, fragments joined, control frames answered; and every
// frame a relay must not send (RFC 6455 5.2, 5.4, 5.5, 7.4) fails the read
// with the close code the relay is told.
func TestMemWSRead(t *testing.T) {
	text := func(s string) []byte { return serverFrame(true, opText, []byte(s)) }
	closeFrame := func(code int, text string) []byte {
		return serverFrame(true, opClose, websocket.FormatCloseMessage(code, text))
	}
	masked := text("hi")
	masked[1] |= bitMask
	masked = append(masked[:2], append([]byte{0, 0, 0, 0}, masked[2:]...)...)
	huge := []byte{bitFin | opText, 127, 0x80, 0, 0, 0, 0, 0, 0, 1}
	cat := func(fs ...[]byte) []byte { return bytes.Join(fs, nil) }
	for _, tc := range []struct {
		name  string
		in    []byte
		typ   int    // the message read; 0: the read fails
		msg   string // the message, or the close text
		code  int    // the close code returned (a *websocket.CloseError); 0: none
		err   error  // the read's error, when not a close
		reply []byte // opcodes of the frames the gate writes back, in order
		told  int    // the code of the close the gate wrote, if any
		limit int    // the framer's message limit; 0: 100 bytes
	}{
		{name: "text", in: text(`["NOTICE","x"]`), typ: websocket.TextMessage, msg: `["NOTICE","x"]`},
		{name: "empty", in: text(""), typ: websocket.TextMessage, msg: ""},
		{name: "binary", in: serverFrame(true, opBinary, []byte{0, 1, 2}), typ: websocket.BinaryMessage, msg: "\x00\x01\x02"},
		{name: "16-bit length", in: text(strings.Repeat("a", 300)), typ: websocket.TextMessage, msg: strings.Repeat("a", 300), limit: maxRelayMessage},
		{name: "64-bit length", in: text(strings.Repeat("b", 70000)), typ: websocket.TextMessage, msg: strings.Repeat("b", 70000), limit: maxRelayMessage},
		{name: "fragments", in: cat(serverFrame(false, opText, []byte("ab")), serverFrame(false, opContinuation, nil), serverFrame(true, opContinuation, []byte("cd"))),
			typ: websocket.TextMessage, msg: "abcd"},
		{name: "ping between fragments", in: cat(serverFrame(false, opText, []byte("ab")), serverFrame(true, opPing, []byte("p1")), serverFrame(true, opContinuation, []byte("cd"))),
			typ: websocket.TextMessage, msg: "abcd", reply: []byte{opPong}},
		{name: "pong", in: cat(serverFrame(true, opPong, []byte("x")), text("y")), typ: websocket.TextMessage, msg: "y"},
		{name: "close", in: closeFrame(websocket.CloseNormalClosure, "bye"), code: 1000, msg: "bye", reply: []byte{opClose}, told: 1000},
		{name: "close 4000", in: closeFrame(4000, ""), code: 4000, reply: []byte{opClose}, told: 4000},
		{name: "close without a code", in: serverFrame(true, opClose, nil), code: websocket.CloseNoStatusReceived, reply: []byte{opClose}, told: websocket.CloseNoStatusReceived},
		{name: "masked", in: masked, err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "reserved bit", in: []byte{bitFin | 0x40 | opText, 0}, err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "opcode 3", in: serverFrame(true, 3, nil), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "opcode 0xb", in: serverFrame(true, 0xb, nil), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "continuation first", in: serverFrame(true, opContinuation, []byte("x")), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "text inside fragments", in: cat(serverFrame(false, opText, []byte("a")), text("b")), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "fragmented ping", in: serverFrame(false, opPing, nil), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "long ping", in: serverFrame(true, opPing, make([]byte, 126)), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "length top bit", in: huge, err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError, limit: maxRelayMessage},
		{name: "close of one byte", in: serverFrame(true, opClose, []byte{3}), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "close 1005 sent", in: serverFrame(true, opClose, []byte{0x03, 0xed}), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "close 999", in: serverFrame(true, opClose, []byte{0x03, 0xe7}), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "close 5000", in: closeFrame(5000, ""), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "close text not UTF-8", in: closeFrame(1000, "\xff"), err: errRelayProtocol, reply: []byte{opClose}, told: websocket.CloseProtocolError},
		{name: "over the limit", in: text(strings.Repeat("c", 101)), err: errRelayTooLarge, reply: []byte{opClose}, told: websocket.CloseMessageTooBig},
		{name: "over the limit by fragments", in: cat(serverFrame(false, opText, make([]byte, 60)), serverFrame(true, opContinuation, make([]byte, 41))),
			err: errRelayTooLarge, reply: []byte{opClose}, told: websocket.CloseMessageTooBig},
		{name: "at the limit by fragments", in: cat(serverFrame(false, opText, make([]byte, 60)), serverFrame(true, opContinuation, make([]byte, 40))),
			typ: websocket.TextMessage, msg: string(make([]byte, 100))},
		{name: "length claimed, never sent", in: []byte{bitFin | opText, 127, 0, 0, 0, 0, 0x7f, 0, 0, 0}, err: errRelayTooLarge, reply: []byte{opClose}, told: websocket.CloseMessageTooBig},
		{name: "cut in a header", in: []byte{bitFin | opText}, err: io.ErrUnexpectedEOF},
		{name: "cut in a payload", in: []byte{bitFin | opText, 5, 'a'}, err: io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gate, relay := newMemPipe(inProcessAddr, inProcessAddr)
			defer gate.Close()
			c := newMemWS(gate, bufio.NewReaderSize(gate, memWSReadBuffer))
			c.limit = 100
			if tc.limit != 0 {
				c.limit = tc.limit
			}
			go func() {
				_, _ = relay.Write(tc.in)
				if tc.err == io.ErrUnexpectedEOF {
					_ = relay.Close() // EOF after the frames
				}
			}()
			typ, msg, err := c.ReadMessage()
			var ce *websocket.CloseError
			switch {
			case tc.typ != 0:
				if err != nil || typ != tc.typ || string(msg) != tc.msg {
					t.Fatalf("read %d %.40q, %v; want %d %.40q", typ, msg, err, tc.typ, tc.msg)
				}
			case tc.code != 0:
				if !errors.As(err, &ce) || ce.Code != tc.code || ce.Text != tc.msg {
					t.Fatalf("read error %v, want a close %d %q", err, tc.code, tc.msg)
				}
			default:
				if !errors.Is(err, tc.err) {
					t.Fatalf("read error %v, want %v", err, tc.err)
				}
			}
			if err != nil {
				if _, _, again := c.ReadMessage(); again == nil {
					t.Errorf("a read after a failed one succeeded")
				}
			}
			// What the gate wrote back, masked as a client's frames must be.
			_ = gate.Close()
			var back []byte
			for _, op := range tc.reply {
				f := readClientFrame(t, relay)
				if !f.fin || !f.masked || f.op != op {
					t.Fatalf("the gate wrote %+v, want a final masked frame of opcode %d", f, op)
				}
				back = append(back, f.op)
				if f.op == opPong && string(f.data) != "p1" {
					t.Errorf("pong %q, want the ping's payload", f.data)
				}
				if f.op == opClose && closeCode(f.data) != tc.told {
					t.Errorf("the relay was told %d (%q), want %d", closeCode(f.data), f.data, tc.told)
				}
			}
			if n, _ := relay.Read(make([]byte, 1)); n != 0 {
				t.Errorf("the gate wrote more than %d frames back", len(tc.reply))
			}
		})
	}
}

// The frames the gate writes are read by a real server side (gorilla's
// upgrader behind the in-process dial): masked, their lengths and masks
// right across the 125/126 and 64 KiB headers and across the framer's
// write chunks; pings are answered; a close reaches the relay with its
// code, and nothing is written after it.
func TestMemWSWrite(t *testing.T) {
	got := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			got <- err
			return
		}
		defer ws.Close()
		for {
			typ, msg, err := ws.ReadMessage()
			if err != nil {
				got <- err
				return
			}
			if err := ws.WriteMessage(typ, msg); err != nil {
				got <- err
				return
			}
		}
	})
	p := newInProcess(h, quietLogger())
	defer p.stop()
	up, _, err := p.dial(context.Background(), httptest.NewRequest(http.MethodGet, "/", nil), "192.0.2.1", http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close() // before p.stop: the handler returns when its peer goes
	// Not a timing assertion: a framer that garbles its frames would leave
	// both sides waiting for bytes that never come.
	_ = up.SetReadDeadline(time.Now().Add(time.Minute))
	_ = up.SetWriteDeadline(time.Now().Add(time.Minute))
	pongs := make(chan string, 1)
	up.SetPongHandler(func(s string) error { pongs <- s; return nil })
	for _, n := range []int{0, 1, 125, 126, 4000, memWSChunk - 14, memWSChunk, 65535, 65536, 3*memWSChunk + 7, 300_001} {
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(i*7 + n)
		}
		typ := websocket.TextMessage
		if n%2 == 1 {
			typ = websocket.BinaryMessage
		}
		if err := up.WriteMessage(typ, msg); err != nil {
			t.Fatalf("write %d bytes: %v", n, err)
		}
		gt, echo, err := up.ReadMessage()
		if err != nil || gt != typ || !bytes.Equal(echo, msg) {
			t.Fatalf("echo of %d bytes: type %d, %d bytes, equal %v, %v", n, gt, len(echo), bytes.Equal(echo, msg), err)
		}
	}
	if err := up.WriteControl(websocket.PingMessage, []byte("are you there"), time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := up.WriteMessage(websocket.TextMessage, []byte("after the ping")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := up.ReadMessage(); err != nil || string(msg) != "after the ping" {
		t.Fatalf("read %q, %v", msg, err)
	}
	if s := <-pongs; s != "are you there" {
		t.Errorf("pong %q", s)
	}
	if err := up.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, "sluice: client cut"), time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	var ce *websocket.CloseError
	if err := <-got; !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway || ce.Text != "sluice: client cut" {
		t.Errorf("the relay read %v, want the gate's close 1001", err)
	}
	if err := up.WriteMessage(websocket.TextMessage, []byte("late")); !errors.Is(err, websocket.ErrCloseSent) {
		t.Errorf("a write after the close: %v, want ErrCloseSent", err)
	}
	// The relay's answer to the close is read as its close.
	if _, _, err := up.ReadMessage(); !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
		t.Errorf("read after the close: %v, want the relay's close 1001", err)
	}
	_ = up.Close()
}

// The gate reads the handler's answer to an upgrade itself: a 101 must
// answer the gate's key, upgrade to websocket and negotiate no extension;
// any other answer is returned whole (the gate passes a refusal on) with
// errBadHandshake.
func TestReadUpgrade(t *testing.T) {
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	accept := "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" // RFC 6455 1.3's example
	if acceptKey(key) != accept {
		t.Fatalf("acceptKey(%q) = %q, want %q", key, acceptKey(key), accept)
	}
	ok := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n"
	for _, tc := range []struct {
		name, head string
		status     int  // a refusal's status; 0: none
		ok         bool // upgraded
	}{
		{name: "101", head: ok + "\r\n", ok: true},
		{name: "case and lists", head: "HTTP/1.1 101 x\r\nupgrade: WebSocket\r\nconnection: keep-alive, upgrade\r\nsec-websocket-accept:" + accept + "\r\n\r\n", ok: true},
		{name: "a long header line", head: ok + "X-Long: " + strings.Repeat("x", 2000) + "\r\n\r\n", ok: true},
		{name: "wrong accept", head: strings.Replace(ok, accept, "AAAA"+accept[4:], 1) + "\r\n"},
		{name: "no upgrade", head: "HTTP/1.1 101 x\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n\r\n"},
		{name: "no connection", head: "HTTP/1.1 101 x\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: " + accept + "\r\n\r\n"},
		{name: "extension", head: ok + "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n"},
		{name: "head too long", head: ok + strings.Repeat("X-A: b\r\n", maxHandshakeResponse/8+1) + "\r\n"},
		{name: "malformed line", head: ok + "nonsense\r\n\r\n"},
		{name: "cut", head: ok},
		{name: "refused", head: "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nslow", status: 429},
	} {
		t.Run(tc.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tc.head+"\x81\x00"), memWSReadBuffer)
			resp, err := readUpgrade(br, key, httptest.NewRequest(http.MethodGet, "/", nil))
			switch {
			case tc.ok:
				if err != nil || resp != nil {
					t.Fatalf("readUpgrade: %v, %v; want the upgrade", resp, err)
				}
				if rest, _ := io.ReadAll(br); string(rest) != "\x81\x00" {
					t.Errorf("left %q after the head, want the first frame", rest)
				}
			case tc.status != 0:
				if !errors.Is(err, errBadHandshake) || resp == nil || resp.StatusCode != tc.status || resp.Header.Get("Retry-After") != "7" {
					t.Fatalf("readUpgrade: %v, %v; want the %d", resp, err, tc.status)
				}
				if body, _ := io.ReadAll(resp.Body); string(body) != "slow" {
					t.Errorf("body %q", body)
				}
			default:
				if err == nil || resp != nil {
					t.Fatalf("readUpgrade: %v, %v; want an error", resp, err)
				}
			}
		})
	}
}

// Masking with a key at any offset is its own inverse and matches the
// byte-by-byte definition (RFC 6455 5.3).
func TestMaskBytes(t *testing.T) {
	key := [4]byte{0x12, 0x34, 0x56, 0x78}
	src := make([]byte, 37)
	for i := range src {
		src[i] = byte(i * 31)
	}
	for pos := range 5 {
		dst := make([]byte, len(src))
		maskBytes(key, pos, dst, src)
		for i := range src {
			if dst[i] != src[i]^key[(pos+i)&3] {
				t.Fatalf("pos %d: byte %d = %#x, want %#x", pos, i, dst[i], src[i]^key[(pos+i)&3])
			}
		}
	}
}
