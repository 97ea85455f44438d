package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// upstream is where a gated connection goes: a relay at a URL, bridged
// to (Proxy), or an in-process handler that serves the client's socket
// through the gate's tap (Wrap, tap.go).
type upstream struct {
	dialer *websocket.Dialer
	// target returns the WebSocket URL to dial for client request r.
	target func(r *http.Request) string
	// local, when set, is the in-process handler.
	local http.Handler
}

// upConn is the gate's side of a WebSocket to the relay at a URL: a
// gorilla client connection. Its methods are gorilla's, with gorilla's
// meaning: one reader, one writer of messages, control frames from any
// goroutine.
type upConn interface {
	ReadMessage() (messageType int, p []byte, err error)
	WriteMessage(messageType int, data []byte) error
	WriteControl(messageType int, data []byte, deadline time.Time) error
	SetReadDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
	SetPongHandler(h func(appData string) error)
	Close() error
}

// dial opens the upstream WebSocket for client request r, whose client
// address is addr. The relay learns addr from X-Forwarded-For and
// X-Real-IP, which replace whatever the client sent.
func (u *upstream) dial(ctx context.Context, r *http.Request, addr string, trustedPeer bool) (upConn, *http.Response, error) {
	h := forwardedHeader(r, addr, trustedPeer)
	c, resp, err := u.dialer.DialContext(ctx, u.target(r), h)
	if err != nil {
		return nil, resp, err // not a nil *websocket.Conn in an upConn
	}
	return c, resp, nil
}

// forwardedHeader returns the headers of client request r that the relay
// is given: all but the hop-by-hop and WebSocket handshake ones, with the
// gate's word on the client's address (setForwarded).
func forwardedHeader(r *http.Request, addr string, trustedPeer bool) http.Header {
	h := make(http.Header, len(r.Header)+6)
	for k, vs := range r.Header {
		if hopHeader(k) {
			continue
		}
		h[k] = vs
	}
	setForwarded(h, r, addr, trustedPeer)
	return h
}

// writeBuffers lends gorilla a write buffer for the length of one message
// write, on both sides: an idle connection holds none (8 KiB less each).
var writeBuffers = &sync.Pool{}

// upReadBuffer is the read buffer of a relay connection: relay frames are
// read whole into their own slices, so a small buffer costs a few more
// reads of a large frame and saves memory on every idle connection.
const upReadBuffer = 1024

// hopHeader reports the client headers not copied to the upstream
// handshake: hop-by-hop headers and the WebSocket handshake (the gate
// makes its own, without compression, so frames pass byte for byte).
func hopHeader(k string) bool {
	switch k {
	case "Connection", "Upgrade", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding",
		"Proxy-Connection", "Proxy-Authorization", "Host", "Content-Length":
		return true
	}
	return strings.HasPrefix(k, "Sec-Websocket-")
}

// clientIPHeaders are the headers some relay or framework believes as the
// client's address (rely reads True-Client-IP first). A client must not
// choose them: setForwarded removes every one before setting its own.
var clientIPHeaders = []string{
	"Forwarded", "X-Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
	"X-Real-Ip", "True-Client-Ip", "Cf-Connecting-Ip", "Cf-Connecting-Ipv6", "X-Client-Ip",
	"Fastly-Client-Ip", "X-Cluster-Client-Ip", "X-Original-Forwarded-For", "Client-Ip",
}

// setForwarded replaces every client-address header of h (which may be
// r.Header itself) with the gate's word: X-Forwarded-For and X-Real-IP set
// to addr (when known), X-Forwarded-Host and X-Forwarded-Proto to the host
// and scheme the client used. Those two come from the request itself, or,
// when the TCP peer is a trusted proxy that terminated TLS in front of the
// gate, from that proxy's own X-Forwarded-Host and X-Forwarded-Proto: a
// relay that checks NIP-42's relay URL against them (khatru does) must
// see wss://, not the http:// of the last hop.
func setForwarded(h http.Header, r *http.Request, addr string, trustedPeer bool) {
	proto, host := requestOrigin(r, trustedPeer)
	for _, k := range clientIPHeaders {
		delete(h, k)
	}
	if addr != "" {
		h.Set("X-Forwarded-For", addr)
		h.Set("X-Real-IP", addr)
	}
	h.Set("X-Forwarded-Host", host)
	h.Set("X-Forwarded-Proto", proto)
}

// requestOrigin returns the scheme ("http" or "https") and host the client
// used: r's own, or a trusted proxy's X-Forwarded-Proto and
// X-Forwarded-Host.
func requestOrigin(r *http.Request, trustedPeer bool) (proto, host string) {
	proto, host = "http", r.Host
	if r.TLS != nil {
		proto = "https"
	}
	if trustedPeer {
		if v := r.Header.Get("X-Forwarded-Proto"); v == "http" || v == "https" {
			proto = v
		}
		if v := r.Header.Get("X-Forwarded-Host"); v != "" {
			host = v
		}
	}
	return proto, host
}

// newURLUpstream validates a ws:// or wss:// URL.
func newURLUpstream(raw string) (*upstream, *url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %q: %v", errUpstream, raw, err)
	}
	if u.Scheme != "ws" && u.Scheme != "wss" {
		return nil, nil, fmt.Errorf("%w: %q: scheme must be ws or wss", errUpstream, raw)
	}
	if u.Host == "" {
		return nil, nil, fmt.Errorf("%w: %q: no host", errUpstream, raw)
	}
	base := *u
	up := &upstream{
		dialer: &websocket.Dialer{
			Proxy:            http.ProxyFromEnvironment,
			HandshakeTimeout: 10 * time.Second,
			WriteBufferPool:  writeBuffers,
			ReadBufferSize:   upReadBuffer,
		},
		target: func(r *http.Request) string {
			t := base
			t.Path = singleJoin(base.Path, r.URL.Path)
			t.RawPath = ""
			t.RawQuery = r.URL.RawQuery
			return t.String()
		},
	}
	return up, u, nil
}

// httpProxy forwards plain HTTP requests (NIP-11, pages) to the relay
// behind a ws:// or wss:// URL, over http:// or https://, with the
// client-address headers set by the gate as on WebSocket upgrades.
func (g *Gate) httpProxy(u *url.URL) http.Handler {
	target := *u
	if target.Scheme == "wss" {
		target.Scheme = "https"
	} else {
		target.Scheme = "http"
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&target)
			_, addr, _, _ := g.client(pr.In)
			setForwarded(pr.Out.Header, pr.In, addr, g.fromTrustedProxy(pr.In))
		},
		// Streamed responses (server-sent events, long polls) reach the
		// client as the relay writes them.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// A body past the plain body limit (servePlain) stops at it:
			// the relay got no more, and the client is told why.
			if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
				http.Error(w, "sluice: request body too large", http.StatusRequestEntityTooLarge)
				return
			}
			if errors.Is(err, context.Canceled) {
				return // the client left
			}
			g.log.Debug("relay unreachable for a plain HTTP request", "path", r.URL.Path, "err", err)
			http.Error(w, "sluice: relay unreachable", http.StatusBadGateway)
		},
	}
}

func singleJoin(a, b string) string {
	switch {
	case b == "" || b == "/":
		if a == "" {
			return "/"
		}
		return a
	case strings.HasSuffix(a, "/") && strings.HasPrefix(b, "/"):
		return a + b[1:]
	case !strings.HasSuffix(a, "/") && !strings.HasPrefix(b, "/"):
		return a + "/" + b
	}
	return a + b
}
