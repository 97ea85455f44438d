package relay

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	cws "github.com/coder/websocket"
	"github.com/gorilla/websocket"
	"github.com/sluice-relay/sluice/relay/policy"
)

// rawHandler is an in-process relay that writes its frames by hand on the
// connection the gate's tap gives it, as a relay's WebSocket code would in
// pieces of any size: script runs once the handler has upgraded, with the
// gorilla connection (for reads) and the raw connection (for writes).
func rawHandler(script func(ws *websocket.Conn, raw net.Conn)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := websocket.Upgrader{}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		script(c, c.NetConn())
	})
}

// serverFrame is an unmasked server frame of opcode op with payload p.
func serverFrame(op byte, fin bool, p []byte) []byte {
	f := appendServerFrame(nil, op, p)
	if !fin {
		f[0] &^= bitFin
	}
	return f
}

// acceptKey is the Sec-WebSocket-Accept that answers key (RFC 6455 4.2.2).
func acceptKey(key string) string {
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h[:])
}

// The gate's own replies go between the relay's messages, never inside
// one: a refusal made while the relay is halfway through a fragmented
// message, or through a frame it writes in two pieces, reaches the client
// after that message, and both arrive whole (a reply inside them would be
// a protocol error to the client, or corrupt the relay's frame).
func TestTapReplyNotInsideRelayMessage(t *testing.T) {
	for _, split := range []string{"fragments", "one frame in two writes"} {
		t.Run(split, func(t *testing.T) {
			h := rawHandler(func(ws *websocket.Conn, raw net.Conn) {
				f := serverFrame(opText, true, []byte(`["NOTICE","part2"]`))
				if split == "fragments" {
					_, _ = raw.Write(serverFrame(opText, false, []byte(`["NOTICE","`)))
					_, _ = raw.Write(serverFrame(opPing, true, []byte("p")))
				} else {
					_, _ = raw.Write(f[:7])
				}
				// The client's refused frame, then one the gate forwards:
				// reading the second says the first was decided.
				if _, _, err := ws.ReadMessage(); err != nil {
					return
				}
				if split == "fragments" {
					_, _ = raw.Write(serverFrame(opContinuation, true, []byte(`part2"]`)))
				} else {
					_, _ = raw.Write(f[7:])
				}
				_, _, _ = ws.ReadMessage()
			})
			g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
			c := dialRaw(t, serve(t, g.Wrap(h)))
			_ = c.WriteMessage(websocket.TextMessage, []byte(`not json`))
			_ = c.WriteMessage(websocket.TextMessage, []byte(`["COUNT","x",{}]`))
			var got []string
			for len(got) < 2 {
				got = append(got, readText(t, c))
			}
			if got[0] != `["NOTICE","part2"]` || !strings.HasPrefix(got[1], `["NOTICE","invalid:`) {
				t.Fatalf("client read %q, want the relay's message whole, then the gate's refusal", got)
			}
		})
	}
}

// The relay's answers are read however the relay writes them: a CLOSED
// in three fragments with a ping among them, written a byte at a time, is
// seen, and the gate closes the subscription at the relay (its CLOSE)
// before the client's next frame.
func TestTapWatchesRelayFramesInPieces(t *testing.T) {
	reads := make(chan string, 4)
	h := rawHandler(func(ws *websocket.Conn, raw net.Conn) {
		_, req, err := ws.ReadMessage()
		if err != nil {
			return
		}
		reads <- string(req)
		var out []byte
		out = append(out, serverFrame(opText, false, []byte(`["CLOSED",`))...)
		out = append(out, serverFrame(opPing, true, nil)...)
		out = append(out, serverFrame(opContinuation, false, []byte(`"x","error: `))...)
		out = append(out, serverFrame(opContinuation, true, []byte(`bye"]`))...)
		for i := range out {
			if _, err := raw.Write(out[i : i+1]); err != nil {
				return
			}
		}
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			reads <- string(b)
		}
	})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	c := dialRaw(t, serve(t, g.Wrap(h)))
	_ = c.WriteMessage(websocket.TextMessage, []byte(`["REQ","x",{}]`))
	if got := <-reads; got != `["REQ","x",{}]` {
		t.Fatalf("relay read %q", got)
	}
	if got := readText(t, c); got != `["CLOSED","x","error: bye"]` {
		t.Fatalf("client read %q", got)
	}
	_ = c.WriteMessage(websocket.TextMessage, []byte(`["COUNT","y",{}]`))
	for _, want := range []string{`["CLOSE","x"]`, `["COUNT","y",{}]`} {
		select {
		case got := <-reads:
			if got != want {
				t.Fatalf("relay read %q, want %q", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("relay did not read %q", want)
		}
	}
}

// A relay whose 101 takes an extension (which the gate did not offer:
// compressed frames it could not read) gets no client: the handshake
// never reaches it. The extension is one gorilla's client accepts
// unoffered, so only the gate's check fails the dial.
func TestTapRefusesExtension(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer raw.Close()
		_, _ = raw.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Accept: " + acceptKey(r.Header.Get("Sec-Websocket-Key")) + "\r\n" +
			"Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover\r\n\r\n"))
		_, _ = raw.Read(make([]byte, 1))
	})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	if c, _, err := d.Dial(serve(t, g.Wrap(h)), nil); err == nil {
		c.Close()
		t.Fatal("the client was upgraded to a relay speaking an extension")
	}
}

// What a client sends that breaks RFC 6455 is answered with 1002 (1009 for
// a message over the read limit, however it is fragmented) and reaches the
// relay as a client gone (1001), never as a frame.
func TestTapClientProtocolErrors(t *testing.T) {
	long := func(n uint64) []byte { // a masked text frame header claiming n bytes
		b := []byte{0x81, 0x80 | 127}
		b = binary.BigEndian.AppendUint64(b, n)
		return append(b, 1, 2, 3, 4)
	}
	unmasked := []byte{0x81, 2, '[', ']'}
	half := bytes.Repeat([]byte("a"), 100)
	for _, tc := range []struct {
		name string
		send []byte
		code int
	}{
		{"unmasked", unmasked, websocket.CloseProtocolError},
		{"reserved bit", append([]byte{0xc1}, rawFrame(opText, true, []byte("[]"))[1:]...), websocket.CloseProtocolError},
		{"length top bit", long(1 << 63), websocket.CloseProtocolError},
		{"length past the limit", long(1 << 40), websocket.CloseMessageTooBig},
		{"fragments past the limit", append(rawFrame(opText, false, half), rawFrame(opContinuation, true, half)...), websocket.CloseMessageTooBig},
		{"continuation first", rawFrame(opContinuation, true, []byte("[]")), websocket.CloseProtocolError},
		{"text inside a message", append(rawFrame(opText, false, []byte("[")), rawFrame(opText, true, []byte("]"))...), websocket.CloseProtocolError},
		{"fragmented ping", rawFrame(opPing, false, nil), websocket.CloseProtocolError},
		{"unknown opcode", rawFrame(0x3, true, []byte("[]")), websocket.CloseProtocolError},
		{"close of one byte", rawFrame(opClose, true, []byte{3}), websocket.CloseProtocolError},
		{"close code 1005", rawFrame(opClose, true, []byte{0x03, 0xed}), websocket.CloseProtocolError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, ReadLimit: 150})
			c := dialRaw(t, serve(t, g.Wrap(rec)))
			if _, err := c.NetConn().Write(tc.send); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _, err := c.ReadMessage()
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != tc.code {
				t.Fatalf("client got %v, want close %d", err, tc.code)
			}
			if code := rec.closed(); code != websocket.CloseGoingAway {
				t.Errorf("relay saw close %d, want 1001", code)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.got) != 0 {
				t.Errorf("relay read %q", rec.got)
			}
		})
	}
}

// A client's close reaches the relay with its code (one that may be sent:
// none becomes 1000), and the relay's answer reaches the client.
func TestTapPassesClientClose(t *testing.T) {
	for _, tc := range []struct {
		payload []byte
		want    int
	}{
		{websocket.FormatCloseMessage(4001, "done"), 4001},
		{nil, websocket.CloseNormalClosure},
	} {
		rec := newRecorder()
		g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
		c := dialRaw(t, serve(t, g.Wrap(rec)))
		if _, err := c.NetConn().Write(rawFrame(opClose, true, tc.payload)); err != nil {
			t.Fatal(err)
		}
		if code := rec.closed(); code != tc.want {
			t.Errorf("close %v: relay saw %d, want %d", tc.payload, code, tc.want)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := c.ReadMessage(); !websocket.IsCloseError(err, tc.want) {
			t.Errorf("close %v: client got %v, want the relay's close %d", tc.payload, err, tc.want)
		}
	}
}

// A relay whose WebSocket code sets status 101 before it hijacks (coder's
// websocket, which go-nostr uses) has its handshake written through the
// tap as net/http would have written it, and works behind the gate.
func TestTapSwitchingBeforeHijack(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := cws.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		_, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		_ = c.Write(ctx, cws.MessageText, []byte(`["NOTICE","got `+string(b[2:7])+`"]`))
		_, _, _ = c.Read(ctx)
	})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	c := dialRaw(t, serve(t, g.Wrap(h)))
	_ = c.WriteMessage(websocket.TextMessage, []byte(`["COUNT","x",{}]`))
	if got := readText(t, c); got != `["NOTICE","got COUNT"]` {
		t.Fatalf("client read %q", got)
	}
}

// What a client's socket does not take at once is queued, up to the queue
// bound, so a client that pauses reading holds up the relay's writes to
// it (khatru's broadcasts among them) only once its queue is full: here
// the relay writes 6 MiB to a client that reads nothing until the relay
// is done, with a 16 MiB queue and a write timeout of a minute (without the
// queue, the relay's writes would wait in the kernel's buffers until the
// client read). All of it arrives, in order.
func TestTapQueuesForPausedClient(t *testing.T) {
	const frames, size = 96, 64 << 10
	done := make(chan struct{})
	h := rawHandler(func(ws *websocket.Conn, raw net.Conn) {
		payload := make([]byte, size)
		for i := range frames {
			binary.BigEndian.PutUint32(payload, uint32(i))
			if err := ws.WriteMessage(websocket.BinaryMessage, payload); err != nil {
				return
			}
		}
		close(done)
		_, _, _ = ws.ReadMessage()
	})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, QueueBytes: 16 << 20, WriteTimeout: time.Minute})
	d := websocket.Dialer{NetDial: func(network, addr string) (net.Conn, error) {
		c, err := net.Dial(network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(64 << 10) // the kernel keeps little for it
		}
		return c, err
	}}
	c, _, err := d.Dial(serve(t, g.Wrap(h)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay's writes waited for a client that had not read yet")
	}
	for i := range frames {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		typ, data, err := c.ReadMessage()
		if err != nil || typ != websocket.BinaryMessage || len(data) != size || binary.BigEndian.Uint32(data) != uint32(i) {
			t.Fatalf("frame %d: %d bytes, %v", i, len(data), err)
		}
	}
}

// Pings inside a fragmented message that never ends are held for the
// relay (they go with the message) only up to a bound: then the client
// is cut as a control flood, before the control meter's own budget.
func TestTapPingsInsideMessageBounded(t *testing.T) {
	rec := newRecorder()
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	c := dialRaw(t, serve(t, g.Wrap(rec)))
	out := rawFrame(opText, false, []byte(`["COUNT","x",`))
	for range 40 { // 40 × 131 bytes: past 4 KiB, well within the meter's 16 KiB
		out = append(out, rawFrame(opPing, true, bytes.Repeat([]byte("p"), 125))...)
	}
	if _, err := c.NetConn().Write(out); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err := c.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation || ce.Text != "sluice: too many control frames" {
		t.Fatalf("client got %v, want 1008 too many control frames", err)
	}
}

// BenchmarkTapTrack is what the gate does with a relay's stream of EVENTs
// in relay mode before they go to the client (tapConn.track): 64 of them
// of ~400 bytes in one write. "open" is a connection that never closed a
// subscription; "closed-other" one that closed one whose EVENTs are not
// among them (each message is decided from its start: sifting); "dropped"
// one whose EVENTs are all under the id it closed.
//
//	go test ./relay/ -run '^$' -bench TapTrack -count 6
func BenchmarkTapTrack(b *testing.B) {
	var stream []byte
	for i := range 64 {
		ev := fmt.Sprintf(`["EVENT","feed",{"id":"%064d","pubkey":"%064d","created_at":1700000000,"kind":1,"tags":[],"content":"%s","sig":"%0128d"}]`, i, i, strings.Repeat("x", 40), i)
		stream = append(stream, serverFrame(opText, true, []byte(ev))...)
	}
	for _, mode := range []string{"open", "closed-other", "dropped"} {
		b.Run(mode, func(b *testing.B) {
			t := newTap(&conn{}, 0)
			t.wt.op = 0 // past the 101
			switch mode {
			case "closed-other":
				t.c.subs.open([]byte("old"), 10, 0, time.Time{})
				t.c.subs.answered([]byte("old"))
				t.c.subs.remove([]byte("old"))
			case "dropped":
				t.c.subs.open([]byte("feed"), 10, 0, time.Time{})
				t.c.subs.answered([]byte("feed"))
				t.c.subs.remove([]byte("feed"))
			}
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := t.track(stream); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
