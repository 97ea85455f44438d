package relay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// inProcess serves an in-process handler (Wrap) over in-memory
// connections (memconn.go), without a second HTTP exchange: the gate
// builds the handler's request itself, from the client's (the headers the
// gate forwards and its word on the client's address), and calls the
// handler with a ResponseWriter whose Hijack returns the relay's end of a
// memPipe. The gate's end is a gorilla client connection, made by a Dialer
// whose handshake request is kept in memory rather than sent and parsed:
// only its Sec-WebSocket-Key is read, and given to the handler's request,
// so that the 101 the handler writes is the answer the Dialer checks. An
// http.Server on a pipe listener did this before, and its second request
// (written, read, parsed, a goroutine and buffers of its own) cost about
// as much CPU as the client's own handshake.
type inProcess struct {
	h      http.Handler
	log    *slog.Logger
	dialer websocket.Dialer
	// base is the parent of every handler request's context, cancelled
	// by stop: a handler that waits for its request's end returns then.
	base       context.Context
	cancelBase context.CancelFunc

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // handler calls running
}

// inProcessAddr is the gate's address on an in-memory connection, and the
// client's when the gate does not know it.
const inProcessAddr = pipeAddr("sluice-in-process")

// inProcessHandshakeTimeout bounds the wait for the handler's answer to
// an upgrade, as the Dialer's HandshakeTimeout would.
const inProcessHandshakeTimeout = 10 * time.Second

// maxHandshakeRequest bounds the Dialer's request kept in memory; it sends
// no header of its own but the handshake's, some 200 bytes.
const maxHandshakeRequest = 4 << 10

var errInProcessClosed = errors.New("relay: in-process relay stopped")

func newInProcess(h http.Handler, log *slog.Logger) *inProcess {
	p := &inProcess{h: h, log: log}
	p.base, p.cancelBase = context.WithCancel(context.WithValue(context.WithValue(context.Background(),
		http.ServerContextKey, &http.Server{Handler: h}),
		http.LocalAddrContextKey, net.Addr(inProcessAddr)))
	// No HandshakeTimeout: netDial sets the connection's deadline itself,
	// which costs no context and timer of its own per dial.
	p.dialer = websocket.Dialer{
		NetDialContext:  p.netDial,
		WriteBufferPool: writeBuffers,
		ReadBufferSize:  upReadBuffer,
	}
	return p
}

// stop refuses new connections, cancels the context of the handler calls
// running and waits for them to return.
func (p *inProcess) stop() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancelBase()
	p.wg.Wait()
}

// inProcessCall carries one dial's handler request to netDial.
type inProcessCall struct{ req *http.Request }

type inProcessKey struct{}

// dial opens a WebSocket to the handler for client request r: the
// handler's request has r's path, query and Host, the forwarded headers h,
// and addr (the client's address, "" when unknown) as RemoteAddr.
func (p *inProcess) dial(ctx context.Context, r *http.Request, addr string, h http.Header) (*websocket.Conn, *http.Response, error) {
	h["Upgrade"] = []string{"websocket"}
	h["Connection"] = []string{"Upgrade"}
	h["Sec-Websocket-Version"] = []string{"13"}
	u := &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	if u.Path == "" {
		u.Path = "/"
	}
	host := r.Host
	if host == "" {
		host = "in-process"
	}
	remote := string(inProcessAddr)
	if addr != "" {
		remote = net.JoinHostPort(addr, "0")
	}
	req := &http.Request{
		Method:     http.MethodGet,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     h,
		Body:       http.NoBody,
		Host:       host,
		RemoteAddr: remote,
		RequestURI: u.RequestURI(),
	}
	ctx = context.WithValue(ctx, inProcessKey{}, &inProcessCall{req: req})
	return p.dialer.DialContext(ctx, "ws://in-process/", nil)
}

// netDial is the Dialer's: it returns the gate's end of a new memPipe,
// which serves the handler once the Dialer has written its request.
func (p *inProcess) netDial(ctx context.Context, _, _ string) (net.Conn, error) {
	call, ok := ctx.Value(inProcessKey{}).(*inProcessCall)
	if !ok {
		return nil, errors.New("relay: in-process dial without a request")
	}
	remote := net.Addr(inProcessAddr)
	if call.req.RemoteAddr != string(inProcessAddr) {
		remote = pipeAddr(call.req.RemoteAddr)
	}
	gate, relay := newMemPipe(inProcessAddr, remote)
	// The Dialer clears the deadline once the handshake is done: a
	// handler that never answers the upgrade fails it after this long.
	_ = gate.SetDeadline(time.Now().Add(inProcessHandshakeTimeout))
	return &handshakeConn{memEnd: gate, p: p, req: call.req, relay: relay}, nil
}

// handshakeConn is the gate's end of an in-process connection. Until the
// Dialer first reads (the 101), what it writes (its request) is kept, not
// sent; that first Read starts the handler on the relay's end with the
// request's key.
type handshakeConn struct {
	*memEnd
	p     *inProcess
	req   *http.Request // the handler's; nil once started
	relay *memEnd
	hs    []byte // the Dialer's request
}

// Write implements net.Conn.
func (c *handshakeConn) Write(b []byte) (int, error) {
	if c.req == nil {
		return c.memEnd.Write(b)
	}
	if len(c.hs)+len(b) > maxHandshakeRequest {
		return 0, errors.New("relay: in-process handshake request too large")
	}
	c.hs = append(c.hs, b...)
	return len(b), nil
}

// WriteByte implements io.ByteWriter, so that the Dialer's request is
// written here directly rather than through a bufio.Writer of its own.
func (c *handshakeConn) WriteByte(b byte) error {
	if c.req == nil {
		_, err := c.memEnd.Write([]byte{b})
		return err
	}
	if len(c.hs) >= maxHandshakeRequest {
		return errors.New("relay: in-process handshake request too large")
	}
	c.hs = append(c.hs, b)
	return nil
}

// Read implements net.Conn.
func (c *handshakeConn) Read(b []byte) (int, error) {
	if c.req != nil {
		req := c.req
		key, ok := handshakeKey(c.hs)
		c.req, c.hs = nil, nil
		if !ok {
			_ = c.relay.Close()
			return 0, errors.New("relay: in-process handshake without a key")
		}
		req.Header["Sec-Websocket-Key"] = []string{key}
		if !c.p.start(c.relay, req) {
			_ = c.relay.Close()
			return 0, errInProcessClosed
		}
	}
	return c.memEnd.Read(b)
}

// handshakeKey returns the Sec-WebSocket-Key of an HTTP request head.
func handshakeKey(head []byte) (string, bool) {
	for {
		line, rest, ok := bytes.Cut(head, []byte("\r\n"))
		if !ok || len(line) == 0 {
			return "", false
		}
		head = rest
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && strings.EqualFold(string(k), "Sec-WebSocket-Key") {
			if v = bytes.TrimSpace(v); len(v) > 0 {
				return string(v), true
			}
			return "", false
		}
	}
}

// start calls the handler with req on conn, on a goroutine of its own as
// an http.Server would (a handler may serve the connection before it
// returns), unless the relay has stopped.
func (p *inProcess) start(conn *memEnd, req *http.Request) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	go p.serve(conn, req)
	return true
}

// serve runs one handler call. A handler that does not hijack has its
// response written on conn, as an http.Server would write it; a panic is
// logged and closes conn, as an http.Server does.
func (p *inProcess) serve(conn *memEnd, req *http.Request) {
	defer p.wg.Done()
	ctx, cancel := context.WithCancel(p.base)
	defer cancel()
	w := &pipeResponse{conn: conn}
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				buf := make([]byte, 16<<10)
				buf = buf[:runtime.Stack(buf, false)]
				p.log.Error("in-process relay panicked", "panic", v, "stack", string(buf))
			}
			if !w.hijacked {
				_ = conn.Close()
			}
			return
		}
		if !w.hijacked {
			w.finish()
		}
	}()
	p.h.ServeHTTP(w, req.WithContext(ctx))
}

// pipeResponse is the ResponseWriter of an in-process handler call: Hijack
// hands over the relay's end of the connection; any other response (a
// refused upgrade) is written on it when the handler returns.
type pipeResponse struct {
	conn     *memEnd
	header   http.Header
	status   int
	body     []byte // the first maxRefusalBody bytes
	hijacked bool
}

// maxRefusalBody is the most of a refusal's body kept: relayRefusal passes
// no more on to the client.
const maxRefusalBody = 4 << 10

// Header implements http.ResponseWriter.
func (w *pipeResponse) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header)
	}
	return w.header
}

// WriteHeader implements http.ResponseWriter.
func (w *pipeResponse) WriteHeader(code int) {
	if w.hijacked || w.status != 0 || code < 200 {
		return
	}
	w.status = code
}

// Write implements http.ResponseWriter.
func (w *pipeResponse) Write(b []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	w.WriteHeader(http.StatusOK)
	if room := maxRefusalBody - len(w.body); room > 0 {
		w.body = append(w.body, b[:min(len(b), room)]...)
	}
	return len(b), nil
}

// Hijack implements http.Hijacker. The buffered reader holds nothing (the
// handler's request came whole, with no bytes after it) and both buffers
// are small: an upgrader that would reuse them allocates its own.
func (w *pipeResponse) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if w.status != 0 {
		return nil, nil, errors.New("relay: hijack after the response was written")
	}
	w.hijacked = true
	return w.conn, bufio.NewReadWriter(bufio.NewReaderSize(w.conn, 16), bufio.NewWriterSize(w.conn, 16)), nil
}

// finish writes the response of a handler that did not hijack and closes
// the connection.
func (w *pipeResponse) finish() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	resp := &http.Response{
		StatusCode:    w.status,
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.header,
		ContentLength: int64(len(w.body)),
	}
	if len(w.body) > 0 {
		resp.Body = io.NopCloser(bytes.NewReader(w.body))
	}
	_ = resp.Write(w.conn)
	_ = w.conn.Close()
}

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }
