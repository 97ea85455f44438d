package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sluice-relay/sluice/relay/policy"
)

// rawFrame is a masked client frame of opcode op with payload p and the
// FIN bit fin, written by hand: gorilla's client cannot send an empty
// continuation frame on its own.
func rawFrame(op byte, fin bool, p []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	if len(p) > 125 {
		panic("rawFrame: payload too long")
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	out := append([]byte{b0, 0x80 | byte(len(p))}, mask[:]...)
	for i, c := range p {
		out = append(out, c^mask[i%4])
	}
	return out
}

// floodLog counts the gate's "too many control frames" closes.
type floodLog struct{ n atomic.Int64 }

func (h *floodLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *floodLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" && a.Value.String() == "too many control frames" {
			h.n.Add(1)
		}
		return true
	})
	return nil
}
func (h *floodLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *floodLog) WithGroup(string) slog.Handler      { return h }

// wantPolicyClose reads from c until it is closed, and fails unless the
// close is 1008 with reason, or the connection was reset after the gate
// logged its flood close (a server that closes with the flood still
// unread in its socket makes the kernel reset the connection, and the
// close frame may be lost with it).
func wantPolicyClose(t *testing.T, c *websocket.Conn, reason string, log *floodLog, before int64) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) && ce.Code != websocket.CloseAbnormalClosure {
			if ce.Code != websocket.ClosePolicyViolation || ce.Text != reason {
				t.Fatalf("connection closed with %v, want close 1008 %q", err, reason)
			}
			return
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection not closed: %v", err)
		}
		if log.n.Load() <= before {
			t.Fatalf("connection ended with %v, and the gate logged no flood close", err)
		}
		return
	}
}

// A flood of pings, or of empty continuation frames that never finish a
// message, asks the gate and the relay for work and is never charged to a
// limit: past the control bound the gate closes the connection (1008).
// A gate without the bound answers pings for as long as the client sends
// them, and the flood below is never closed.
func TestGateControlFlood(t *testing.T) {
	rec := newRecorder()
	log := &floodLog{}
	url := serve(t, newGate(t, Options{Logger: slog.New(log)}).Wrap(rec))

	t.Run("pings", func(t *testing.T) {
		before := log.n.Load()
		c := dialRaw(t, url)
		c.SetPongHandler(func(string) error { return nil })
		go func() {
			for range 100_000 {
				if c.WriteControl(websocket.PingMessage, nil, time.Now().Add(10*time.Second)) != nil {
					return
				}
			}
		}()
		wantPolicyClose(t, c, "sluice: too many control frames", log, before)
	})
	t.Run("empty continuations", func(t *testing.T) {
		before := log.n.Load()
		c := dialRaw(t, url)
		nc := c.NetConn()
		go func() {
			if _, err := nc.Write(rawFrame(websocket.TextMessage, false, []byte(`["REQ",`))); err != nil {
				return
			}
			cont := rawFrame(0, false, nil)
			for range 100_000 {
				if _, err := nc.Write(cont); err != nil {
					return
				}
			}
		}()
		wantPolicyClose(t, c, "sluice: too many control frames", log, before)
	})
	t.Run("pongs", func(t *testing.T) {
		before := log.n.Load()
		c := dialRaw(t, url)
		go func() {
			for range 100_000 {
				if c.WriteControl(websocket.PongMessage, []byte("0123456789"), time.Now().Add(10*time.Second)) != nil {
					return
				}
			}
		}()
		wantPolicyClose(t, c, "sluice: too many control frames", log, before)
	})
}

// An honest client is not cut: a ping with every few messages, and
// messages split into several fragments, all reach the relay.
func TestGateControlHonest(t *testing.T) {
	rec := newRecorder()
	rec.eose = true     // answers every COUNT, as a relay does
	var l policy.Limits // nothing charged: only the control bound applies
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &l}}).Wrap(rec))
	c := dialRaw(t, url)
	nc := c.NetConn()
	const n = 300
	for i := range n {
		if i%5 == 0 {
			if err := c.WriteControl(websocket.PingMessage, []byte("keepalive"), time.Now().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		// ["COUNT","x",{}] in four fragments (a free frame the gate
		// forwards; a CLOSE of nothing open is not).
		parts := []string{`["COU`, `NT","`, `x",{`, `}]`}
		for j, p := range parts {
			op := byte(0)
			if j == 0 {
				op = websocket.TextMessage
			}
			if _, err := nc.Write(rawFrame(op, j == len(parts)-1, []byte(p))); err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
	}
	if got := rec.frames(n); len(got) != n {
		t.Fatalf("relay got %d of %d fragmented messages", len(got), n)
	}
	for _, f := range rec.frames(n) {
		if f != `["COUNT","x",{}]` {
			t.Fatalf("relay got %q", f)
		}
	}
}

// streamConn is a net.Conn whose reads return as much of its data as the
// caller asks for, as a socket does when the data has all arrived.
type streamConn struct {
	net.Conn
	data []byte
}

func (s *streamConn) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.data)
	s.data = s.data[n:]
	return n, nil
}

// A large frame's payload is read off the socket in pieces larger than
// the control bound (gorilla reads it straight into the frame buffer) and
// credited as payload only once each read has returned: the balance must
// be judged before the next read, or one honest 100 KB event (a contact
// list, a long-form article) is cut as a control flood.
func TestMeteredLargePayloadNotFlood(t *testing.T) {
	payload := bytes.Repeat([]byte("x"), 100_000)
	m := newControlMeter()
	mc := &meteredConn{Conn: &streamConn{data: payload}, m: m}
	buf, err := readFrame(mc, getFrameBuf(), m)
	if err != nil || len(buf) != len(payload) {
		t.Fatalf("readFrame: %d bytes, %v; want %d bytes, no error", len(buf), err, len(payload))
	}
	if m.flooded.Load() {
		t.Fatal("a 100 KB payload counted as a control flood")
	}
	// What is not payload still counts: 16 KiB and more of it read and
	// never credited, and the next read is refused.
	mc = &meteredConn{Conn: &streamConn{data: bytes.Repeat([]byte{0x89, 0x80, 0, 0, 0, 0}, 4000)}, m: newControlMeter()}
	var b [64]byte
	for {
		if _, err := mc.Read(b[:]); err != nil {
			if !errors.Is(err, errControlFlood) || !mc.m.flooded.Load() {
				t.Fatalf("unpaid control bytes: %v, want errControlFlood", err)
			}
			break
		}
	}
}

// End to end: canonical EVENTs of 30 KB reach the relay, and the client
// is not cut. Once the gate's pooled frame buffers have grown, such a
// frame's payload is read in one piece of 30 KB, over the control burst:
// a gate that charges that read to the meter before crediting it as
// payload cuts the client after a few of them.
func TestGateLargeEventNotCut(t *testing.T) {
	rec := newRecorder()
	rec.answerOK = func(hex32) bool { return true }
	// Each frame in one socket write, as go-nostr's client sends it
	// (gorilla's default buffer would write it in 4 KiB pieces).
	d := websocket.Dialer{WriteBufferSize: 1 << 20}
	c, _, err := d.Dial(serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}).Wrap(rec)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 10
	big := withID(`["EVENT",` + strings.Replace(goNostrEvent, `"hello`, `"`+strings.Repeat("x", 30_000)+`hello`, 1) + `]`)
	for i := range n {
		if err := c.WriteMessage(websocket.TextMessage, []byte(big)); err != nil {
			t.Fatal(err)
		}
		// One at a time, as a client waits for each OK.
		if got := rec.frames(i + 1); len(got) != i+1 {
			t.Fatalf("relay got %d of %d 30 KB EVENTs", len(got), n)
		}
	}
}

// A close frame written while the client's writer flushes its batch to a
// client that has stopped reading gives up at its own deadline. The flush
// holds the socket's write lock outside gorilla's, for as long as the
// write timeout (an hour here); a cut that waited for it would hold the
// goroutine that cuts, and behind it the relay's writes to that client
// and every publish they are part of (TestE2EStalledSubscriberHoldsNoPublisher
// hung so). With a write lock that only waits, the close write below
// waits the hour.
func TestMeteredCloseDoesNotWaitForFlush(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String()) // never reads
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	_ = peer.(*net.TCPConn).SetReadBuffer(4 << 10)
	sock, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_ = sock.(*net.TCPConn).SetWriteBuffer(4 << 10)
	mc := newMeteredConn(newControlMeter(), time.Hour)
	mc.Conn = sock

	flushed := make(chan error, 1)
	go func() {
		_ = mc.coalesce(true)
		// More than the kernel holds for a peer that reads nothing.
		for range 64 {
			if _, err := mc.Write(make([]byte, 32<<10)); err != nil {
				flushed <- err
				return
			}
		}
		flushed <- mc.coalesce(false)
	}()
	// Wait until the writer holds the write lock in a blocked write.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if un, ok := unsentBytes(sock); len(mc.wmu) == 1 && (!ok || un > 0) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer never blocked on the peer")
		}
	}
	closed := make(chan error, 1)
	go func() {
		_ = mc.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
		_, err := mc.Write([]byte{0x88, 0x02, 0x03, 0xf0}) // a close frame, 1008
		closed <- err
	}()
	select {
	case err := <-closed:
		if !isTimeout(err) {
			t.Fatalf("close frame written during a blocked flush: %v, want a timeout", err)
		}
	case <-time.After(30 * time.Second): // a bound for a hang, far below the hour
		t.Fatal("a close frame waited for the flush under way")
	}
	// Closing the socket ends the flush.
	_ = mc.Close()
	if err := <-flushed; err == nil {
		t.Fatal("the flush to a closed socket succeeded")
	}
}
