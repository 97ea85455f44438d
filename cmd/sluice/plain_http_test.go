package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fiatjaf/khatru"
	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/relay"
)

// bigBody is the size of the hostile bodies below: far past any bound, and
// produced as it is read, so a test holds none of it.
const bigBody = 64 << 20

// quietGate is a gate with default limits that logs nothing.
func quietGate(t *testing.T, opts relay.Options) *relay.Gate {
	t.Helper()
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	return g
}

// nip98NoU is an Authorization header with a signed NIP-98 event that has
// no "u" tag, which khatru's NIP-86 handler indexes anyway (a panic).
func nip98NoU(t *testing.T) string {
	t.Helper()
	ev := nostr.Event{Kind: 27235, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"method", "POST"}}}
	if err := ev.Sign(nostr.GeneratePrivateKey()); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ev)
	return "Nostr " + base64.StdEncoding.EncodeToString(b)
}

// sluice relay's front answers every plain POST 405 before anything reads
// its body, whatever its Upgrade header: khatru, behind the gate, is never
// called, so neither its NIP-86 handler's unbounded read of the body
// (before it checks the caller) nor its panic on a NIP-98 event without a
// "u" tag can be reached. A front that routed any request with an
// Upgrade header to the gate would have it passed to khatru as plain
// HTTP: khatru would read all 64 MiB, and panic on the NIP-98 event.
func TestRelayPlainPOSTNeverReachesKhatru(t *testing.T) {
	kr := khatru.NewRelay()
	kr.Log = log.New(io.Discard, "", 0)
	var reached, panicked atomic.Int64
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		defer func() {
			if recover() != nil {
				panicked.Add(1)
			}
		}()
		kr.ServeHTTP(w, r)
	})
	g := quietGate(t, relay.Options{})
	h := front(&nip11.Handler{Fallback: []byte(`{}`)}, g.Wrap(inner), relayPage)

	for _, c := range []struct {
		name     string
		declared bool // Content-Length set, else streamed
		hdr      []string
		size     int64
	}{
		{"Upgrade: anything, streamed", false, []string{"Upgrade", "anything"}, bigBody},
		{"Upgrade: anything, declared", true, []string{"Upgrade", "anything"}, bigBody},
		{"Connection: upgrade, Upgrade: websocket", false, []string{"Connection", "Upgrade", "Upgrade", "websocket"}, bigBody},
		{"NIP-98 without u", true, []string{"Upgrade", "x", "Authorization", nip98NoU(t)}, 40},
	} {
		body := nostrtest.NewCountingBody(c.size)
		r := httptest.NewRequest("POST", "/", body)
		r.ContentLength = -1
		if c.declared {
			r.ContentLength = c.size
		}
		r.Header.Set("Content-Type", "application/nostr+json+rpc")
		for i := 0; i+1 < len(c.hdr); i += 2 {
			r.Header.Set(c.hdr[i], c.hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusMethodNotAllowed || body.N() != 0 {
			t.Errorf("%s: %d, %d body bytes read; want 405 and none read", c.name, w.Code, body.N())
		}
	}
	if n, p := reached.Load(), panicked.Load(); n != 0 {
		t.Errorf("khatru was called %d times (%d panicked); want never", n, p)
	}
}

// Through sluice proxy a plain POST the operator allows (PlainMethods)
// reaches the upstream with at most the plain body limit of its body: a
// streamed 64 MiB body is cut there, and the client is answered 413. A
// pass-through without that bound would stream all of it to the upstream.
func TestProxyPlainBodyBounded(t *testing.T) {
	upstream, got := proxyUpstream(t)
	g := quietGate(t, relay.Options{PlainMethods: []string{"POST"}})
	gated, err := g.Proxy(upstream)
	if err != nil {
		t.Fatal(err)
	}
	h := proxyFront(&nip11.Handler{Fallback: []byte(`{}`)}, gated)
	body := nostrtest.NewCountingBody(bigBody)
	r := httptest.NewRequest("POST", "/", body)
	r.ContentLength = -1
	r.Header.Set("Content-Type", "application/nostr+json+rpc")
	r.Header.Set("Upgrade", "anything")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	s := <-got
	const bound = plainBodyDefault
	if w.Code != http.StatusRequestEntityTooLarge || s.n > bound || body.N() > bound+1 {
		t.Errorf("streamed %d MiB POST: %d; the upstream received %d bytes, %d were read from the client; want 413 and at most %d", bigBody>>20, w.Code, s.n, body.N(), bound)
	}
}

// pipeListener is a listener whose connections are net.Pipes: an HTTP
// server on it runs inside a synctest bubble, where its deadlines pass on
// the bubble's clock.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	return nil
}

func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80} }

// dial returns the client end of a new connection to the server.
func (l *pipeListener) dial() net.Conn {
	c, s := net.Pipe()
	l.conns <- s
	return c
}

// testLimits are server limits small enough for a test's bubble.
var testLimits = serverLimits{readHeader: time.Second, read: 2 * time.Second, idle: 3 * time.Second, maxHeader: 4 << 10}

// serveInBubble serves h with limits on a pipe listener until the bubble's
// test function returns.
func serveInBubble(t *testing.T, limits serverLimits, h http.Handler) *pipeListener {
	l := newPipeListener()
	srv := limits.server(h, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l
}

// Every sluice server bounds the time a client takes to send its request:
// a header sent a byte at a time and never finished (slowloris) is cut
// by ReadHeaderTimeout, and a plain request whose body never finishes (a
// relay handler reading it, as NIP-86's does) by ReadTimeout. In the
// bubble an unbounded server deadlocks the test instead.
func TestServerLimitsCutSlowClients(t *testing.T) {
	read := func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }
	for name, partial := range map[string]string{
		"header": "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: a",
		"body":   "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nsome",
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := serveInBubble(t, defaultServerLimits, http.HandlerFunc(read))
				c := l.dial()
				defer c.Close()
				if _, err := io.WriteString(c, partial); err != nil {
					t.Fatal(err)
				}
				// Nothing more is sent: the server must close the
				// connection on its own (an answer, if any, then EOF).
				if _, err := io.Copy(io.Discard, c); err != nil {
					t.Fatalf("reading until the server closes: %v", err)
				}
			})
		})
	}
}

// A WebSocket through the gate outlives every server limit: net/http
// clears the connection's deadlines when the handler hijacks it, so a
// connection open far longer than ReadTimeout and IdleTimeout still
// carries messages both ways. The in-process relay here upgrades with a
// handshake timeout, as khatru's upgrader could be configured to.
func TestWebSocketOutlivesServerLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := websocket.Upgrader{HandshakeTimeout: time.Second}
		echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					mt, p, err := c.ReadMessage()
					if err != nil || c.WriteMessage(mt, p) != nil {
						return
					}
				}
			}()
		})
		g := quietGate(t, relay.Options{})
		l := serveInBubble(t, testLimits, front(&nip11.Handler{Fallback: []byte(`{}`)}, g.Wrap(echo), relayPage))
		d := websocket.Dialer{NetDialContext: func(context.Context, string, string) (net.Conn, error) { return l.dial(), nil }}
		ws, _, err := d.Dial("ws://127.0.0.1/", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		for i := range 3 {
			// Past every server limit since the handshake, and since
			// the last message.
			time.Sleep(testLimits.read + testLimits.idle + testLimits.readHeader)
			msg := []byte(`["REQ","s` + string(rune('0'+i)) + `",{}]`)
			if err := ws.WriteMessage(websocket.TextMessage, msg); err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
			_, p, err := ws.ReadMessage()
			if err != nil || string(p) != string(msg) {
				t.Fatalf("read %d: %q, %v; want the echo", i, p, err)
			}
		}
		ws.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = g.Shutdown(ctx)
	})
}

// TestMeasurePlainPOST measures, side by side, what one 512 MiB POST with
// an Upgrade header costs khatru unguarded and behind sluice relay's
// front: body bytes read and bytes allocated (docs/RELIABILITY.md, "Plain
// HTTP"). It allocates over 1 GiB, so it runs only when asked:
// SLUICE_MEASURE=1 go test -run TestMeasurePlainPOST -v ./cmd/sluice
func TestMeasurePlainPOST(t *testing.T) {
	if os.Getenv("SLUICE_MEASURE") == "" {
		t.Skip("set SLUICE_MEASURE=1 to measure")
	}
	kr := khatru.NewRelay()
	kr.Log = log.New(io.Discard, "", 0)
	g := quietGate(t, relay.Options{})
	for _, c := range []struct {
		name string
		h    http.Handler
	}{
		{"sluice relay's front", front(&nip11.Handler{Fallback: []byte(`{}`)}, g.Wrap(kr), relayPage)},
		{"khatru unguarded", kr},
	} {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		body := nostrtest.NewCountingBody(512 << 20)
		r := httptest.NewRequest("POST", "/", body)
		r.ContentLength = -1
		r.Header.Set("Content-Type", "application/nostr+json+rpc")
		r.Header.Set("Upgrade", "anything")
		w := httptest.NewRecorder()
		c.h.ServeHTTP(w, r)
		runtime.ReadMemStats(&m1)
		t.Logf("%s: HTTP %d, %d body bytes read, %d MiB allocated", c.name, w.Code, body.N(), (m1.TotalAlloc-m0.TotalAlloc)>>20)
	}
}

// plainBodyDefault is the gate's bound on a plain body, as the doc of
// relay.Options.PlainMethods states it.
const plainBodyDefault = 64 << 10
