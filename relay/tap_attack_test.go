package relay

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
)

// Attacks on the tap (tap.go): what a client that has read the source can
// make the gate do in Wrap mode.

// rawUpgrade opens a TCP connection to the ws:// url, sends a WebSocket
// handshake (and extra, pipelined behind it), and returns the connection
// and a reader positioned after the response's headers, with the status
// line. It does not fail on a refused upgrade: the caller judges status.
func rawUpgrade(t testing.TB, url string, hdr string, extra []byte) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	host := strings.TrimPrefix(url, "ws://")
	host, path, _ := strings.Cut(host, "/")
	nc, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	req := "GET /" + path + " HTTP/1.1\r\nHost: " + host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" + hdr + "\r\n"
	if _, err := nc.Write(append([]byte(req), extra...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	return nc, br, ""
}

// readHead reads an HTTP response head from br (until the blank line) and
// returns it, or what came before the connection ended.
func readHead(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\r\n" {
			return b.String(), nil
		}
	}
}

// zeroKeyFrame is a client frame masked with the zero key: its payload is
// on the wire as it is. Any length.
func zeroKeyFrame(op byte, fin bool, p []byte) []byte {
	b := appendClientHeader(nil, op, len(p))
	if !fin {
		b[0] &^= bitFin
	}
	return append(b, p...)
}

// wireFrame is one frame read from the gate's side of the wire.
type wireFrame struct {
	op      byte
	fin     bool
	payload []byte
}

// parseServerFrames parses b, the bytes a client received after the 101,
// as server frames, and reports the first violation of RFC 6455 a client
// would fail the connection for: a masked frame, reserved bits, an
// unknown opcode, a fragmented or long control frame, a data frame inside
// a fragmented message, a continuation outside one. A truncated last
// frame is not a violation (the socket was closed).
func parseServerFrames(b []byte) ([]wireFrame, error) {
	var out []wireFrame
	inMsg := false
	for len(b) > 0 {
		if len(b) < 2 {
			return out, nil
		}
		fin, op := b[0]&0x80 != 0, b[0]&0x0f
		if b[0]&0x70 != 0 {
			return out, fmt.Errorf("frame %d: reserved bits", len(out))
		}
		if b[1]&0x80 != 0 {
			return out, fmt.Errorf("frame %d: masked", len(out))
		}
		n, h := uint64(b[1]&0x7f), 2
		switch n {
		case 126:
			if len(b) < 4 {
				return out, nil
			}
			n, h = uint64(binary.BigEndian.Uint16(b[2:])), 4
		case 127:
			if len(b) < 10 {
				return out, nil
			}
			n, h = binary.BigEndian.Uint64(b[2:]), 10
		}
		switch op {
		case opText, opBinary:
			if inMsg {
				return out, fmt.Errorf("frame %d: data frame (op %d) inside a fragmented message", len(out), op)
			}
			inMsg = !fin
		case opContinuation:
			if !inMsg {
				return out, fmt.Errorf("frame %d: continuation outside a message", len(out))
			}
			inMsg = !fin
		case opClose, opPing, opPong:
			if !fin || n > 125 {
				return out, fmt.Errorf("frame %d: bad control frame", len(out))
			}
		default:
			return out, fmt.Errorf("frame %d: opcode %d", len(out), op)
		}
		if uint64(len(b)-h) < n {
			return out, nil
		}
		out = append(out, wireFrame{op, fin, b[h : h+int(n)]})
		b = b[h+int(n):]
	}
	return out, nil
}

// --- The handler's write deadline ------------------------------------------

// A refusal the gate sends more than a second after the handler answered
// a ping is written, and the client is not cut. gorilla and fasthttp
// (khatru) answer a ping with WriteControl(pong, now+1s) and leave that
// deadline on the connection until their next data write; a gate that
// writes its own replies under the handler's last deadline fails the
// write at once and cuts the client as a slow reader, so any client that
// pings (go-nostr does, every 29 s) and is then refused something would
// be disconnected instead of answered.
func TestTapAttackReplyAfterPongNotCut(t *testing.T) {
	var cuts atomic.Int64
	obs := &policy.Observer{Cut: func(r string) {
		if r == "slow_reader" {
			cuts.Add(1)
		}
	}}
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, Observer: obs})
	c := dialRaw(t, serve(t, g.Wrap(newRecorder())))
	// Reads run on a goroutine of their own so that the pong is handled.
	msgs := make(chan string, 4)
	errc := make(chan error, 1)
	go func() {
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				errc <- err
				return
			}
			msgs <- string(b)
		}
	}()
	pong := make(chan struct{}, 1)
	c.SetPongHandler(func(string) error { pong <- struct{}{}; return nil })
	if err := c.WriteControl(websocket.PingMessage, []byte("hi"), time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-pong:
	case <-time.After(5 * time.Second):
		t.Fatal("no pong")
	}
	// Real time past the pong's 1 s deadline: it is the socket's own,
	// which the direct write (sockwrite_unix.go) checks, and a pipe has no
	// descriptor to write to directly.
	time.Sleep(1500 * time.Millisecond)
	// Not a Nostr message: the gate answers it itself.
	if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ"]`)); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		if !strings.Contains(m, "invalid") {
			t.Errorf("reply %q, want the gate's refusal", m)
		}
	case err := <-errc:
		t.Fatalf("connection ended instead of the refusal: %v (slow-reader cuts: %d)", err, cuts.Load())
	case <-time.After(5 * time.Second):
		t.Fatal("no reply")
	}
	if n := cuts.Load(); n != 0 {
		t.Errorf("%d slow-reader cuts, want 0", n)
	}
}

// --- Declared lengths ------------------------------------------------------

// tapHeap is the live heap after a collection.
func tapHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A frame header alone does not make the gate allocate the frame's
// declared length: a message's buffer grows with the bytes that arrive, as
// the bridge's (readFrame) and gorilla's do. A gate that sizes the buffer
// from the header would hold 512 KiB (the read limit) per 14-byte header
// for as long as the relay's read deadline allows (khatru: 60 s; a
// handler without one: for ever), 32 MiB for one address's 64
// connections, and fails the bound below.
func TestTapAttackDeclaredLengthNotPreallocated(t *testing.T) {
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	url := serve(t, g.Wrap(newRecorder()))
	const conns = 32
	cs := make([]*websocket.Conn, conns)
	for i := range cs {
		cs[i] = dialRaw(t, url)
	}
	// A text frame of the read limit, then one of half of it that is the
	// first fragment of a message: headers and masks, no payload.
	hdr := func(fin bool, n uint64) []byte {
		b := []byte{0x01, 0x80 | 127}
		if fin {
			b[0] |= 0x80
		}
		return append(binary.BigEndian.AppendUint64(b, n), 1, 2, 3, 4)
	}
	time.Sleep(100 * time.Millisecond) // the handshakes' allocations settle (real sockets, outside any bubble)
	before := tapHeap()
	for i, c := range cs {
		h := hdr(true, defaultReadLimit)
		if i%2 == 1 {
			h = hdr(false, defaultReadLimit/2)
		}
		if _, err := c.NetConn().Write(h); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // the gate reads the headers on the handlers' goroutines, over real sockets
	after := tapHeap()
	grown := int64(after) - int64(before)
	t.Logf("heap grew %d KiB for %d headers of %d bytes", grown>>10, conns, 14)
	if limit := int64(conns) * 32 << 10; grown > limit {
		t.Errorf("%d frame headers made the gate hold %d KiB (more than %d KiB): a message's buffer must grow with what arrives, not with what a header declares",
			conns, grown>>10, limit>>10)
	}
	runtime.KeepAlive(cs)
}

// --- Ended before the hijack ------------------------------------------------

// A connection the gate ends before the handler has hijacked it
// (Shutdown while the handler is still deciding, e.g. in a khatru
// RejectConnection hook) has its socket closed once the handler hijacks
// it. The end has run by then (conn.once is spent) with no socket to
// close; a gate that closes sockets only there leaves the client's TCP
// connection, and its own file descriptor, open for ever after Shutdown
// has returned, and the client's read below times out.
func TestTapAttackEndedBeforeHijackClosesSocket(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	returned := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(returned)
		close(entered)
		<-release
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, Logger: quietLogger()})
	url := serve(t, g.Wrap(h))
	nc, br, _ := rawUpgrade(t, url, "", nil)
	<-entered
	g.mu.Lock()
	var c *conn
	for k := range g.conns {
		c = k
	}
	g.mu.Unlock()
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- g.Shutdown(ctx)
	}()
	<-c.closing // the goodbye has run
	close(release)
	<-returned
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the client's socket is still open 3 s after Shutdown returned (read %q)", b)
	}
}

// --- Nothing before the 101 -----------------------------------------------

// The gate writes no frame of its own (goodbye, reply) before the
// handler's 101: a connection ended after the hijack and before the
// handler's answer gets no WebSocket frame as its HTTP response. A gate
// that checks only that the relay is between frames sends a bare close
// frame there. Here the handler hijacks and panics (the gate recovers and
// ends the connection with 1011); Shutdown in the same window, or a
// refusal to a handler that reads before it answers, meet the same check.
func TestTapAttackNoFrameBeforeHandshake(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := w.(http.Hijacker).Hijack(); err != nil {
			return
		}
		panic("relay bug after hijack")
	})
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}).Wrap(h))
	nc, br, _ := rawUpgrade(t, url, "", nil)
	_ = nc.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, _ := io.ReadAll(br)
	if len(b) > 0 && !strings.HasPrefix(string(b), "HTTP/1.1 ") {
		t.Fatalf("the client's HTTP response is % x: WebSocket frames before (without) a 101", b)
	}
}

// --- Replies and fragmented messages -------------------------------------

// A refusal queued while the relay is inside a fragmented message waits
// for the message's end; when the gate ends the connection before that end
// (a protocol error, a knock or flood cut, Shutdown), the client's stream
// stays valid RFC 6455 and ends in the close frame. A gate that writes the
// queued replies, data frames, in front of its close frame puts them
// inside the fragmented message already on the client's socket: the client
// fails the connection on them ("data frame inside a fragmented message")
// and misses the close. khatru sends every message over 1 KiB fragmented
// (its write buffer is 1 KiB); one over 64 KiB reaches the socket before
// its end.
func TestTapAttackShutRepliesNotInsideFragmentedMessage(t *testing.T) {
	started := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		if _, _, err := c.ReadMessage(); err != nil {
			return
		}
		go func() { // the gate reads the client as the handler reads
			for {
				if _, _, err := c.ReadMessage(); err != nil {
					return
				}
			}
		}()
		// A first fragment of 100 KiB, and a pause before the last one.
		mw, err := c.NextWriter(websocket.TextMessage)
		if err != nil {
			return
		}
		_, _ = mw.Write([]byte(`["NOTICE","` + strings.Repeat("x", 100<<10)))
		close(started)
		<-r.Context().Done()
		_, _ = mw.Write([]byte(`"]`))
		_ = mw.Close()
	})
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}).Wrap(h))
	nc, br, _ := rawUpgrade(t, url, "", nil)
	if head, err := readHead(br); err != nil || !strings.HasPrefix(head, "HTTP/1.1 101 ") {
		t.Fatalf("handshake: %q %v", head, err)
	}
	if _, err := nc.Write(zeroKeyFrame(opText, true, []byte(`["REQ","go",{}]`))); err != nil {
		t.Fatal(err)
	}
	<-started
	// A frame the gate refuses (its reply waits for the message's end),
	// then an unmasked frame: a protocol error, which ends the connection.
	out := zeroKeyFrame(opText, true, []byte(`["REQ"]`))
	out = append(out, 0x81, 0x01, 'x')
	if _, err := nc.Write(out); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(br)
	frames, err := parseServerFrames(b)
	if err != nil {
		t.Fatalf("the client's stream breaks RFC 6455: %v (after %d frames)", err, len(frames))
	}
	if len(frames) == 0 || frames[len(frames)-1].op != opClose {
		t.Errorf("no close frame at the end of %d frames", len(frames))
	}
}

// --- Fuzzing ---------------------------------------------------------------

// fuzzRelay is the handler behind the fuzzed gate: it records, per
// connection (its X-Fuzz-Id header), every message it reads and the error
// its reads end with.
type fuzzRelay struct {
	mu    sync.Mutex
	conns map[string]*fuzzConn
}

type fuzzConn struct {
	msgs  [][]byte
	types []int
	err   error
	done  chan struct{}
}

func (f *fuzzRelay) conn(id string) *fuzzConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc := f.conns[id]
	if fc == nil {
		fc = &fuzzConn{done: make(chan struct{})}
		f.conns[id] = fc
	}
	return fc
}

func (f *fuzzRelay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fc := f.conn(r.Header.Get("X-Fuzz-Id"))
	defer close(fc.done)
	c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		fc.err = err
		return
	}
	defer c.Close()
	for {
		typ, b, err := c.ReadMessage()
		if err != nil {
			fc.err = err
			return
		}
		fc.msgs = append(fc.msgs, b)
		fc.types = append(fc.types, typ)
		// Something to write back now and then, so that the gate's
		// replies meet the relay's frames.
		if len(fc.msgs)%2 == 0 {
			_ = c.WriteMessage(websocket.TextMessage, []byte(`["NOTICE","seen"]`))
		}
	}
}

// FuzzTapClientStream feeds arbitrary bytes to the gate as a client's
// stream after a successful upgrade (pipelined behind the handshake, or
// after the 101) and checks that the gate neither panics nor hangs, that
// the relay reads only messages the gate forwards (canonical text:
// scan.Scan finds nothing wrong) and ends with a close frame, and that
// what the client receives is a valid stream of server frames.
func FuzzTapClientStream(f *testing.F) {
	frame := func(op byte, fin bool, p string) []byte { return zeroKeyFrame(op, fin, []byte(p)) }
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	req := frame(opText, true, `["REQ","a",{}]`)
	ev := frame(opText, true, `["EVENT",`+goNostrEvent+`]`) // 126: a 16-bit length
	long127 := append([]byte{0x81, 0x80 | 127, 0, 0, 0, 0, 0, 0, 0, 14, 0, 0, 0, 0}, `["REQ","b",{}]`...)
	closeF := frame(opClose, true, "\x03\xe8bye")
	for _, s := range [][]byte{
		req,
		ev,
		long127,
		rawFrame(opText, true, []byte(`["REQ","m",{}]`)), // a real mask
		cat(frame(opText, false, `["REQ",`), frame(opPing, true, "p"), frame(opContinuation, false, ""), frame(opContinuation, true, `"f",{}]`)),
		cat(frame(opText, false, `["REQ",`), closeF, req),
		cat(frame(opContinuation, true, `["REQ","c",{}]`)),
		cat(req, closeF, req, ev),
		cat(frame(opBinary, true, `["CLOSE","a"]`), frame(opPong, true, "x"), frame(opText, true, `["REQ"]`)),
		cat(req, []byte{0x81, 0x0e}, []byte(`["REQ","u",{}]`)),         // unmasked
		cat([]byte{0x81, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}), // top bit
		cat([]byte{0x81, 0xff, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}),    // over the read limit
		cat(frame(opPing, false, "x")),                                 // fragmented ping
		cat(frame(opClose, true, "\x03")),                              // one-byte close
		cat(frame(opClose, true, "\x03\xed")),                          // 1005
		cat(frame(opText, true, `["EVENT",{}]`), frame(opText, true, `["AUTH",{}]`), req, req),
		cat(frame(opText, false, ""), frame(opContinuation, false, ""), frame(opContinuation, true, `["REQ","z",{}]`)),
	} {
		f.Add(s, false)
		f.Add(s, true)
	}

	rec := &fuzzRelay{conns: map[string]*fuzzConn{}}
	g, err := New(Options{Policy: policy.Config{Limits: &policy.Limits{}}, ReadLimit: 8 << 10, MaxConnections: -1, Logger: quietLogger(), WriteTimeout: 2 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	url := serve(f, g.Wrap(rec))
	var seq atomic.Int64
	f.Fuzz(func(t *testing.T, stream []byte, pipelined bool) {
		id := fmt.Sprint(seq.Add(1))
		// A hang past every deadline below crashes the worker with every
		// goroutine's stack, for the report.
		watchdog := time.AfterFunc(30*time.Second, func() {
			debug.SetTraceback("all")
			panic("FuzzTapClientStream: input " + id + " hung")
		})
		defer watchdog.Stop()
		var extra []byte
		if pipelined {
			extra = stream
		}
		nc, br, _ := rawUpgrade(t, url, "X-Fuzz-Id: "+id+"\r\n", extra)
		deadline := time.Now().Add(10 * time.Second)
		_ = nc.SetDeadline(deadline)
		head, err := readHead(br)
		if err != nil || !strings.HasPrefix(head, "HTTP/1.1 101 ") {
			t.Fatalf("handshake: %q %v", head, err)
		}
		if !pipelined {
			if _, err := nc.Write(stream); err != nil {
				t.Fatal(err)
			}
		}
		// The client has said all it will: the gate reads EOF after it.
		_ = nc.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(br)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the gate did not end the connection within 10 s (%d bytes read)", len(got))
		}
		fc := rec.conn(id)
		select {
		case <-fc.done:
		case <-time.After(time.Until(deadline)):
			t.Fatal("the handler's call did not return within 10 s")
		}
		for i, m := range fc.msgs {
			if fc.types[i] != websocket.TextMessage {
				t.Errorf("relay read message %d as type %d, want text", i, fc.types[i])
			}
			if _, reason := scan.Scan(m, nil); reason != "" {
				t.Errorf("relay read %q, which the gate does not forward (%s)", m, reason)
			}
		}
		var ce *websocket.CloseError
		if !errors.As(fc.err, &ce) && !errors.Is(fc.err, net.ErrClosed) {
			t.Errorf("relay's reads ended with %v, want a close frame", fc.err)
		}
		if frames, err := parseServerFrames(got); err != nil {
			t.Errorf("client's stream: %v (after %d frames)", err, len(frames))
		}
		rec.mu.Lock()
		delete(rec.conns, id)
		rec.mu.Unlock()
	})
}

// A message's payload read off the socket in pieces is credited back to
// the control meter as each read returns, so a frame whose first piece is
// over the control burst (16 KiB) is not a control flood: an honest EVENT
// of a few tens of KB that the network delivers in pieces (a long-form
// article, a contact list) reaches the relay. A gate that credits the
// payload only once the whole frame is read finds the meter in debt at
// the second read and cuts the client. In a synctest bubble over a pipe:
// the first piece is read whole, and the gate waits for the rest, before
// the rest is sent; no time passes, so nothing is repaid meanwhile.
func TestTapAttackLargeFrameInPiecesNotFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		log := &floodLog{}
		pn, _ := servePipe(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, Logger: slog.New(log)}).Wrap(rec))
		nc, err := pn.dial(context.Background(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		req := "GET / HTTP/1.1\r\nHost: 127.0.0.1:7777\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
		if _, err := nc.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(nc)
		if head, err := readHead(br); err != nil || !strings.HasPrefix(head, "HTTP/1.1 101 ") {
			t.Fatalf("handshake: %q %v", head, err)
		}
		big := withID(`["EVENT",` + strings.Replace(goNostrEvent, `"hello`, `"`+strings.Repeat("x", 100_000)+`hello`, 1) + `]`)
		f := zeroKeyFrame(opText, true, []byte(big))
		// As a network delivers it: 40 KB, then the rest once the gate has
		// read those and waits for more.
		if _, err := nc.Write(f[:40_000]); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if _, err := nc.Write(f[40_000:]); err != nil {
			t.Fatal(err)
		}
		if got := rec.frames(1); len(got) != 1 || got[0] != big {
			t.Fatalf("relay got %d frames (flood cuts logged: %d), want the 100 KB EVENT", len(got), log.n.Load())
		}
	})
}

// --- Close codes the handler reads -----------------------------------------

// A client's close with code 1014 (Bad Gateway), which RFC 6455 allows
// but gorilla and fasthttp (khatru) fail a read on, reaches the handler as
// a close it can read. A gate that passes 1014 on as it came makes the
// handler's read fail with a protocol error ("bad close code 1014")
// instead of the client's close, and no close code is recorded.
func TestTapAttackClientCloseCodeRelayReads(t *testing.T) {
	rec := newRecorder()
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}).Wrap(rec))
	nc, br, _ := rawUpgrade(t, url, "", nil)
	if head, err := readHead(br); err != nil || !strings.HasPrefix(head, "HTTP/1.1 101 ") {
		t.Fatalf("handshake: %q %v", head, err)
	}
	if _, err := nc.Write(zeroKeyFrame(opClose, true, websocket.FormatCloseMessage(1014, "upstream down"))); err != nil {
		t.Fatal(err)
	}
	if code := rec.closed(); code == 0 {
		t.Fatal("the relay read no close frame: it failed on the one the gate passed on")
	}
}
