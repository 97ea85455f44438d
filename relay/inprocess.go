package relay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"sync"
	"time"
)

// inProcess serves an in-process handler (Wrap) over in-memory
// connections (memconn.go), without a second HTTP exchange: the gate
// builds the handler's request itself, from the client's (the headers the
// gate forwards and its word on the client's address), and calls the
// handler with a ResponseWriter whose Hijack returns the relay's end of a
// memPipe. The gate's end speaks WebSocket through a framer of the gate's
// own (memws.go): the gate reads the handler's answer itself, a 101 with
// the right Sec-WebSocket-Accept checked line by line (a refusal is read by
// net/http and passed on), and no client handshake is written at all. An
// http.Server on a pipe listener did this before, then a gorilla Dialer
// whose request was kept in memory; the handshake written and parsed back,
// and the response parsed by net/http, cost about a tenth of a short-lived
// client's CPU.
type inProcess struct {
	h   http.Handler
	log *slog.Logger
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
// an upgrade.
const inProcessHandshakeTimeout = 10 * time.Second

// maxHandshakeResponse bounds the head of the handler's answer to an
// upgrade that the gate reads: a 101 has three headers of its own.
const maxHandshakeResponse = 4 << 10

var (
	errInProcessClosed = errors.New("relay: in-process relay stopped")
	// errBadHandshake is wrapped by dial for a handler that answered an
	// upgrade with something other than a WebSocket 101.
	errBadHandshake = errors.New("relay: in-process relay refused the upgrade")
)

func newInProcess(h http.Handler, log *slog.Logger) *inProcess {
	p := &inProcess{h: h, log: log}
	p.base, p.cancelBase = context.WithCancel(context.WithValue(context.WithValue(context.Background(),
		http.ServerContextKey, &http.Server{Handler: h}),
		http.LocalAddrContextKey, net.Addr(inProcessAddr)))
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

// dial opens a WebSocket to the handler for client request r: the
// handler's request has r's path, query and Host, the forwarded headers h,
// a fresh Sec-WebSocket-Key, and addr (the client's address, "" when
// unknown) as RemoteAddr. A handler that answers with anything but a 101
// gets its response returned with an error wrapping errBadHandshake, as
// gorilla's Dialer returns one.
func (p *inProcess) dial(_ context.Context, r *http.Request, addr string, h http.Header) (upConn, *http.Response, error) {
	key := handshakeKey()
	h["Upgrade"] = []string{"websocket"}
	h["Connection"] = []string{"Upgrade"}
	h["Sec-Websocket-Version"] = []string{"13"}
	h["Sec-Websocket-Key"] = []string{key}
	u := &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	if u.Path == "" {
		u.Path = "/"
	}
	host := r.Host
	if host == "" {
		host = "in-process"
	}
	remote := net.Addr(inProcessAddr)
	remoteAddr := string(inProcessAddr)
	if addr != "" {
		remoteAddr = net.JoinHostPort(addr, "0")
		remote = pipeAddr(remoteAddr)
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
		RemoteAddr: remoteAddr,
		RequestURI: u.RequestURI(),
	}
	gate, relay := newMemPipe(inProcessAddr, remote)
	// A handler that never answers the upgrade fails it after this long;
	// the deadline is cleared once the 101 is read.
	_ = gate.SetDeadline(time.Now().Add(inProcessHandshakeTimeout))
	if !p.start(relay, req) {
		_ = relay.Close()
		_ = gate.Close()
		return nil, nil, errInProcessClosed
	}
	br := bufio.NewReaderSize(gate, memWSReadBuffer)
	resp, err := readUpgrade(br, key, req)
	if err != nil {
		_ = gate.Close()
		return nil, resp, err
	}
	_ = gate.SetDeadline(time.Time{})
	return newMemWS(gate, br), nil, nil
}

// handshakeKey returns a fresh Sec-WebSocket-Key: 16 random bytes in
// base64 (RFC 6455 4.1).
func handshakeKey() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return base64.StdEncoding.EncodeToString(b[:])
}

// acceptKey is the Sec-WebSocket-Accept that answers key (RFC 6455 4.2.2).
func acceptKey(key string) string {
	h := sha1.New()
	h.Write([]byte(key))
	h.Write([]byte("258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// readUpgrade reads the handler's answer to the upgrade with key from br.
// A 101 is read line by line, up to maxHandshakeResponse bytes, and must
// upgrade to websocket with the Sec-WebSocket-Accept that answers key and
// no extension (none was offered): what it leaves in br is the relay's
// first frames. Any other status is read by net/http and returned with an
// error wrapping errBadHandshake, for the gate to pass on.
func readUpgrade(br *bufio.Reader, key string, req *http.Request) (*http.Response, error) {
	const switching = "HTTP/1.1 101 "
	head, err := br.Peek(len(switching))
	if err != nil {
		return nil, fmt.Errorf("relay: reading the in-process upgrade: %w", err)
	}
	if string(head) != switching {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, fmt.Errorf("relay: reading the in-process upgrade: %w", err)
		}
		// The body is read now, as far as relayRefusal passes it on: the
		// connection is closed when dial returns.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBody))
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		return resp, fmt.Errorf("%w: status %d", errBadHandshake, resp.StatusCode)
	}
	read := 0
	var upgrade, connection, accept bool
	want := acceptKey(key)
	for first := true; ; first = false {
		line, err := br.ReadSlice('\n')
		long := false
		for errors.Is(err, bufio.ErrBufferFull) && read+len(line) <= maxHandshakeResponse {
			// A line longer than the buffer: none the gate checks is.
			read += len(line)
			long = true
			line, err = br.ReadSlice('\n')
		}
		if read += len(line); err != nil || read > maxHandshakeResponse {
			if err == nil || errors.Is(err, bufio.ErrBufferFull) {
				err = errors.New("response head too long")
			}
			return nil, fmt.Errorf("relay: reading the in-process upgrade: %w", err)
		}
		line = bytes.TrimRight(line, "\r\n")
		if long {
			continue
		}
		if first {
			continue // the status line, checked above
		}
		if len(line) == 0 {
			break
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return nil, fmt.Errorf("%w: malformed header line", errBadHandshake)
		}
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("Upgrade")):
			upgrade = bytes.EqualFold(v, []byte("websocket"))
		case bytes.EqualFold(k, []byte("Connection")):
			connection = tokenListHas(v, "upgrade")
		case bytes.EqualFold(k, []byte("Sec-WebSocket-Accept")):
			accept = string(v) == want
		case bytes.EqualFold(k, []byte("Sec-WebSocket-Extensions")):
			return nil, fmt.Errorf("%w: an extension the gate did not offer", errBadHandshake)
		}
	}
	if !upgrade || !connection || !accept {
		return nil, fmt.Errorf("%w: a 101 without the WebSocket answer to the gate's key", errBadHandshake)
	}
	return nil, nil
}

// tokenListHas reports whether the comma-separated header value v holds
// token (ASCII case ignored).
func tokenListHas(v []byte, token string) bool {
	for len(v) > 0 {
		var t []byte
		t, v, _ = bytes.Cut(v, []byte(","))
		if bytes.EqualFold(bytes.TrimSpace(t), []byte(token)) {
			return true
		}
	}
	return false
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
