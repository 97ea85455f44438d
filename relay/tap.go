package relay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
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
// (bridge, over gorilla) stays for Proxy, whose relay is a socket away.
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
	// yield: the handler was just given CLOSEs of the gate's own (see
	// next).
	yield bool

	// wakeMu guards atEdge (the reader waits for a frame's first byte,
	// awaitFrame) and woken (wake moved the socket's read deadline to
	// interrupt that wait).
	wakeMu        sync.Mutex
	atEdge, woken bool

	// The write side, under wmu (a channel so that a goodbye can give up
	// waiting for it).
	wmu     writeLock
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
	// ending: the gate's goodbye (shut) or the handler's Close has begun.
	// The handler's writes and the gate's replies fail from then on
	// without waiting for the write lock, which the goodbye holds while
	// the queue drains (up to a second; the handler's Close, up to the
	// write timeout): khatru writes each new event to its listeners one
	// after another, so one of them waiting on this connection's lock
	// would hold every publisher.
	ending  atomic.Bool
	cleanup func() // run when refs reaches 0
}

// errTapClosed is every read and write of a connection the gate or the
// handler has closed.
var errTapClosed = net.ErrClosed

// tapResponse is the ResponseWriter of a gated handler call in Wrap mode:
// a response written without hijacking (a refused upgrade) goes to the
// client as written; Hijack hands the handler the client's connection,
// tapped.
type tapResponse struct {
	http.ResponseWriter
	t        *tapConn // the tap Hijack hands over
	hijacked *tapConn // t, once hijacked
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
	if w.t.dead.Load() {
		// Ended already (Shutdown): the server keeps the connection,
		// answers the handler's refusal and closes it.
		w.Header().Set("Connection", "close")
		return nil, nil, errTapClosed
	}
	raw, brw, err := h.Hijack()
	if err != nil {
		return nil, nil, err
	}
	t := w.t
	t.wmu.lock()
	t.raw = raw
	t.mc.Conn = raw
	dead := t.dead.Load()
	t.wmu.unlock()
	if dead {
		// Ended before the handler took the socket (Shutdown): nothing
		// will close it but this.
		_ = raw.Close()
		return nil, nil, errTapClosed
	}
	t.rc = sockConn(raw)
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
		mc:      newMeteredConn(c.meter, stall),
		wmu:     newWriteLock(),
		flushed: make(chan struct{}, 1),
	}
	t.ocond.L = &t.omu
	c.subs.onMark = t.wake
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

// shut implements clientSide: it ends the tapped connection, once
// (conn.end): a close frame of code and text to the client when toClient
// (if the stream is between frames, and the lock comes and a queue being
// written is written within a second: the close frame may only follow it),
// then the socket closed, so that the handler's writes fail and, after a
// close frame when toUp (see relayClose), its reads: the relay lets the
// connection go as for a client gone.
func (t *tapConn) shut(toClient, toUp bool, code int, text string) {
	if toUp {
		cl := appendClientFrame(nil, opClose, relayClose(code, text))
		t.upClose.Store(&cl)
	}
	t.ending.Store(true)
	by := time.Now().Add(time.Second)
	if !t.wmu.lockBy(by) {
		t.finish()
		return
	}
	defer t.wmu.unlock()
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
	t.wakeMu.Lock() // not undone by a reader woken meanwhile (leaveEdge)
	_ = t.mc.SetReadDeadline(time.Now())
	t.wakeMu.Unlock()
	if cw, ok := t.raw.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		raw := t.raw
		time.AfterFunc(time.Second, func() { _ = raw.Close() })
		return
	}
	_ = t.raw.Close()
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
	// Writes from now on fail (ending) rather than wait for the drain.
	// The queue goes out as long as the client reads it, for a write
	// timeout at most: a client reading slowly must not hold the handler's
	// Close for as long as its backlog takes. Then, inside c.once, what
	// the gate held: c.once is taken without the lock held, since the
	// gate's goodbye (shut) waits for the lock inside it.
	t.ending.Store(true)
	behind := false
	if t.wmu.lockBy(time.Now().Add(time.Second)) {
		behind = t.queued()
		if behind {
			t.drainBy(time.Now().Add(t.mc.stall))
		}
		t.wmu.unlock()
	}
	t.c.once.Do(func() {
		if !t.wmu.lockBy(time.Now().Add(time.Second)) {
			t.finish()
			return
		}
		defer t.wmu.unlock()
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
	return t.mc.SetReadDeadline(d)
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
