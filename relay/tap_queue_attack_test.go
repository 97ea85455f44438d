package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sluice-relay/sluice/relay/policy"
)

// Attacks on the tap's write side (tapwrite.go): the queue towards the client
// (writeSock, flush), the gate's replies, and the connection's end.

// smallReadDialer dials with a client receive buffer of 64 KiB, so that
// the gate's socket fills while the client does not read.
var smallReadDialer = websocket.Dialer{
	HandshakeTimeout: 5 * time.Second,
	NetDial: func(network, addr string) (net.Conn, error) {
		c, err := net.Dial(network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(64 << 10)
		}
		return c, err
	},
}

// dialSmall dials url with smallReadDialer.
func dialSmall(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	c, _, err := smallReadDialer.Dial(url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// fillQueue writes numbered 64 KiB binary messages on ws until the tap's
// queue is in use, then extra more, and returns how many it wrote.
func fillQueue(ws *websocket.Conn, tc *tapConn, extra int) (int, error) {
	payload := make([]byte, 64<<10)
	n := 0
	for more := -1; more != 0; n++ {
		binary.BigEndian.PutUint32(payload, uint32(n))
		if err := ws.WriteMessage(websocket.BinaryMessage, payload); err != nil {
			return n, err
		}
		if more < 0 && tc.queued() {
			more = extra
		}
		if more > 0 {
			more--
		}
	}
	return n, nil
}

// queueFilled is what fillingHandler wrote: n messages, or err.
type queueFilled struct {
	n   int
	err error
}

// fillingHandler upgrades, fills the tap's queue (fillQueue, 4 more),
// says so on written, and reads until the connection ends.
func fillingHandler(written chan<- queueFilled) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			written <- queueFilled{err: err}
			return
		}
		n, err := fillQueue(ws, ws.NetConn().(*tapConn), 4)
		written <- queueFilled{n, err}
		for err == nil {
			_, _, err = ws.ReadMessage() // until the gate's close reaches the relay
		}
		_ = ws.Close()
	})
}

// waitFilled waits for fillingHandler's report and fails on its error.
func waitFilled(t *testing.T, written <-chan queueFilled) queueFilled {
	t.Helper()
	select {
	case res := <-written:
		if res.err != nil {
			t.Fatalf("setup: %d messages written, %v", res.n, res.err)
		}
		return res
	case <-time.After(30 * time.Second):
		t.Fatal("the relay's writes hung")
	}
	return queueFilled{}
}

// readQueued reads the n numbered messages fillQueue wrote, in order.
func readQueued(t *testing.T, c *websocket.Conn, n int) {
	t.Helper()
	for i := range n {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		typ, data, err := c.ReadMessage()
		if err != nil || typ != websocket.BinaryMessage || len(data) != 64<<10 || binary.BigEndian.Uint32(data) != uint32(i) {
			t.Fatalf("message %d of %d: %d bytes, %v: the relay's queued writes were lost", i, n, len(data), err)
		}
	}
}

// --- The handler's Close ---------------------------------------------------

// The handler's Close lets the queue be written (each write with the write
// timeout to make progress, as any queued write) before it closes the
// client's socket: a relay that says goodbye (a last NOTICE, a close
// frame) to a client that is a little behind, or answers a client's close
// while its stream to that client is queued, has its last words read, as
// behind Proxy and without the gate. A Close that closes the socket at
// once loses what Write accepted and the socket had not taken: the client
// misses the last messages and sees its connection reset.
func TestTapQueueAttackCloseWritesQueue(t *testing.T) {
	t.Run("client silent", func(t *testing.T) { closeWritesQueue(t, false) })
	t.Run("client requests unread", func(t *testing.T) { closeWritesQueue(t, true) })
}

// sendBufListener sets each accepted connection's socket send buffer to n
// bytes: small, so that what the gate writes toward a client that reads
// nothing stays in the gate's queue instead of the kernel's (which
// autotunes to megabytes); or large, as autotuning makes it for a client
// that was fast before it slowed.
type sendBufListener struct {
	net.Listener
	n int
}

func (l sendBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(l.n)
	}
	return c, err
}

// serveSendBuf is serve with sendBufListener's send buffers of n bytes.
func serveSendBuf(t testing.TB, h http.Handler, n int) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = sendBufListener{srv.Listener, n}
	srv.Start()
	t.Cleanup(srv.Close)
	return "ws://" + srv.Listener.Addr().String()
}

func closeWritesQueue(t *testing.T, unread bool) {
	type result struct {
		n      int
		queued bool
		err    error
	}
	written := make(chan result, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			written <- result{err: err}
			return
		}
		tc := ws.NetConn().(*tapConn)
		n, err := fillQueue(ws, tc, 4)
		if err == nil {
			err = ws.WriteMessage(websocket.TextMessage, []byte(`["NOTICE","bye"]`))
		}
		if err == nil {
			err = ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(4000, "bye"))
		}
		written <- result{n, tc.queued(), err}
		_ = ws.Close()
	})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, WriteTimeout: 10 * time.Second})
	// A small send buffer: the kernel cannot take the queue off the gate
	// before the handler looks at it.
	c := dialSmall(t, serveSendBuf(t, g.Wrap(h), 16<<10))
	if unread {
		// Requests the relay never reads: closed with them unread, the
		// socket is reset, and what the kernel still holds for the client
		// is lost.
		for range 4 {
			_ = c.WriteMessage(websocket.TextMessage, []byte(`["COUNT","x",{}]`))
		}
	}
	var res result
	select {
	case res = <-written:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay's writes hung")
	}
	if res.err != nil || !res.queued {
		t.Fatalf("setup: %d messages written, queued %v, %v", res.n, res.queued, res.err)
	}
	readQueued(t, c, res.n)
	if got := readText(t, c); got != `["NOTICE","bye"]` {
		t.Fatalf("last message %q", got)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := c.ReadMessage(); !websocket.IsCloseError(err, 4000) {
		t.Fatalf("client got %v, want the relay's close 4000", err)
	}
}

// The Close that writes the queue (above) does not wait for ever on a
// client that has stopped reading: the queue's write timeout cuts it, and
// its flush ends the connection although the handler's Close waits for it.
func TestTapQueueAttackCloseCutsStoppedClient(t *testing.T) {
	closed := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			closed <- err
			return
		}
		if _, err := fillQueue(ws, ws.NetConn().(*tapConn), 4); err != nil {
			closed <- err
			return
		}
		closed <- ws.NetConn().Close()
	})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, WriteTimeout: time.Second})
	c := dialSmall(t, serve(t, g.Wrap(h)))
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close hung on a client that does not read")
	}
	_ = c.Close()
}

// The queue's bound counts the batch the flush goroutine is writing, not
// only what waits behind it: with a full batch in flight, a handler's
// write is refused at once (errBacklog: the client is cut), never waited
// for — the relay's writer does not wait for one client — and nothing of
// it is queued.
func TestTapQueueBoundCountsWhatIsBeingWritten(t *testing.T) {
	const bound = 256 << 10
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, QueueBytes: bound})
	c := &conn{g: g, closing: make(chan struct{}), meter: newControlMeter()}
	tc := newTap(c, time.Second)
	tc.omu.Lock()
	defer tc.omu.Unlock()
	tc.flushing = true
	tc.flying = bound         // a whole queue being written
	tc.over = make([]byte, 0) // nothing waiting behind it
	if err := tc.enqueueLocked(net.Buffers{make([]byte, 64<<10)}); !errors.Is(err, errBacklog) {
		t.Fatalf("a write past the bound with a full batch in flight: %v, want errBacklog", err)
	}
	if len(tc.over) != 0 {
		t.Fatalf("%d bytes queued past the bound", len(tc.over))
	}
	tc.flying = 0 // the batch is written (as flush does)
	if err := tc.enqueueLocked(net.Buffers{make([]byte, 64<<10)}); err != nil {
		t.Fatalf("a write once the batch is written: %v", err)
	}
}

// The gate's own goodbye (here its shutdown's 1001) to a client whose
// queue is being written follows that queue: the client reads every
// message the relay wrote and then the close frame with the gate's reason.
// A gate that closes the socket at once, without a close frame, leaves the
// client a dropped connection (1006) and no reason.
func TestTapGateCloseFollowsQueue(t *testing.T) {
	written := make(chan queueFilled, 1)
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, WriteTimeout: 10 * time.Second})
	c := dialSmall(t, serve(t, g.Wrap(fillingHandler(written))))
	res := waitFilled(t, written)
	shut := make(chan error, 1)
	go func() { shut <- g.Shutdown(context.Background()) }()
	readQueued(t, c, res.n)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _, err := c.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway || ce.Text != "sluice: shutting down" {
		t.Fatalf("after the queue the client got %v, want the gate's close 1001 \"sluice: shutting down\"", err)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
}

// A handler that takes the socket and answers with something other than a
// 101 writes under the write timeout, as frames are written: a client that
// sent the upgrade and never reads the answer does not hold the handler,
// as it would if those writes went to the socket with no deadline.
// The write that times out is the handler's failed write, whether it is
// the answer's first (which the gate reads for a 101) or a later one: not
// a handler fault, logged and closed 1011.
func TestTapAnswerNotSwitchingHasWriteTimeout(t *testing.T) {
	t.Run("many writes", func(t *testing.T) { answerNotSwitching(t, false) })
	t.Run("one write", func(t *testing.T) { answerNotSwitching(t, true) })
}

func answerNotSwitching(t *testing.T, oneWrite bool) {
	type result struct {
		wrote int
		err   error
	}
	done := make(chan result, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nc, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			done <- result{-1, err}
			return
		}
		defer nc.Close()
		head := []byte("HTTP/1.1 403 Forbidden\r\nConnection: close\r\n\r\n")
		if oneWrite {
			n, err := nc.Write(append(head, make([]byte, 64<<20)...))
			done <- result{n, err}
			return
		}
		n, err := nc.Write(head)
		chunk := make([]byte, 1<<20)
		for i := 0; i < 256 && err == nil; i++ {
			var k int
			k, err = nc.Write(chunk)
			n += k
		}
		done <- result{n, err}
	})
	var logs logBuffer
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, WriteTimeout: time.Second, Logger: logs.logger()})
	nc, _, _ := rawUpgrade(t, serve(t, g.Wrap(h)), "", nil)
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(64 << 10)
	}
	select {
	case res := <-done:
		if res.wrote < 0 {
			t.Fatalf("setup: %v", res.err)
		}
		if !errors.Is(res.err, os.ErrDeadlineExceeded) {
			t.Fatalf("the handler wrote %d bytes to a client that reads nothing, then %v; want its write timed out", res.wrote, res.err)
		}
		if res.wrote <= 0 || res.wrote >= 64<<20 {
			t.Errorf("the timed-out write reports %d bytes written, want what the socket took", res.wrote)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's answer to a client that does not read was still being written after 30 s (write timeout 1 s)")
	}
	if n := logs.count("closing client"); n != 0 {
		t.Errorf("%d \"closing client\" lines: the answer's timed-out write was taken for a handler fault", n)
	}
}

// The gate's goodbye waiting for a queue to a client that has stopped
// reading ends when the queue's write fails, not a second later, and the
// client is not also counted as cut for reading too slowly: the gate was
// ending the connection already.
func TestTapGoodbyeToStoppedClientIsNoSlowCut(t *testing.T) {
	var cuts atomic.Int64
	obs := &policy.Observer{Cut: func(r string) {
		if r == "slow_reader" {
			cuts.Add(1)
		}
	}}
	written := make(chan queueFilled, 1)
	// The queue's write fails 0.4-0.5 s into the goodbye's second.
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, WriteTimeout: 400 * time.Millisecond, Observer: obs})
	_ = dialSmall(t, serve(t, g.Wrap(fillingHandler(written)))) // never read
	waitFilled(t, written)
	if err := g.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := cuts.Load(); n != 0 {
		t.Fatalf("%d slow-reader cuts reported for a connection the gate's shutdown was ending", n)
	}
}

// A queue written out leaves the socket no write deadline: the relay's
// next write, however long after, goes out. The flush sets a deadline per
// write to see whether the client reads; a gate that leaves the last one
// behind fails the next direct write at once as a timeout and cuts a
// client that had read everything (a khatru ping half a minute after a
// large answer, say).
func TestTapWriteAfterQueueDrainedNotCut(t *testing.T) {
	const stall = 200 * time.Millisecond
	var cuts atomic.Int64
	obs := &policy.Observer{Cut: func(string) { cuts.Add(1) }}
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, WriteTimeout: stall, Observer: obs})
	written := make(chan queueFilled, 1)
	again := make(chan struct{})
	url := serve(t, g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			written <- queueFilled{err: err}
			return
		}
		n, err := fillQueue(ws, ws.NetConn().(*tapConn), 4)
		written <- queueFilled{n, err}
		<-again
		_ = ws.WriteMessage(websocket.TextMessage, []byte("after"))
		for err == nil {
			_, _, err = ws.ReadMessage()
		}
		_ = ws.Close()
	})))
	c := dialSmall(t, url)
	res := waitFilled(t, written)
	readQueued(t, c, res.n)
	// Real time past the flush's last deadline (3 stalls): the deadline is
	// the socket's own, which only the direct write on a descriptor
	// (sockwrite_unix.go) checks, so a pipe in a bubble cannot show it.
	time.Sleep(3 * stall)
	close(again)
	if got := readText(t, c); got != "after" {
		t.Fatalf("after the queue drained: %q", got)
	}
	if n := cuts.Load(); n != 0 {
		t.Fatalf("%d cuts of a client that read everything", n)
	}
}
