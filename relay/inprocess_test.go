package relay

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/sluice-relay/sluice/relay/policy"
)

// The handler behind Wrap gets the request an http.Server would have
// given it for the upgrade the gate forwards (the gate builds it, with no
// second HTTP exchange): GET, the client's path, query and Host, the
// handshake's headers with a key whose answer the gate accepts, the
// gate's word on the client's address, and a context with the local
// address.
func TestWrapHandlerRequest(t *testing.T) {
	var mu sync.Mutex
	var got *http.Request
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Clone(r.Context())
		mu.Unlock()
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.WriteMessage(websocket.TextMessage, []byte(`["NOTICE","hello"]`))
		_, _, _ = c.ReadMessage()
	})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	url := serve(t, g.Wrap(h)) + "/path/x?q=1"
	c, _, err := websocket.DefaultDialer.Dial(url, http.Header{"X-Custom": {"v"}, "X-Forwarded-For": {"6.6.6.6"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The relay speaks first, through the gate.
	if _, msg, err := c.ReadMessage(); err != nil || string(msg) != `["NOTICE","hello"]` {
		t.Fatalf("first frame %q, %v", msg, err)
	}
	mu.Lock()
	r := got
	mu.Unlock()
	if r.Method != http.MethodGet || r.URL.Path != "/path/x" || r.URL.RawQuery != "q=1" || r.RequestURI != "/path/x?q=1" {
		t.Errorf("request %s %q (path %q, query %q)", r.Method, r.RequestURI, r.URL.Path, r.URL.RawQuery)
	}
	if want := strings.SplitN(strings.TrimPrefix(url, "ws://"), "/", 2)[0]; r.Host != want {
		t.Errorf("Host %q, want %q", r.Host, want)
	}
	for k, want := range map[string]string{
		"X-Custom":              "v",
		"X-Forwarded-For":       "127.0.0.1", // the gate's word, not the client's
		"X-Real-Ip":             "127.0.0.1",
		"Upgrade":               "websocket",
		"Sec-Websocket-Version": "13",
	} {
		if v := r.Header.Get(k); v != want {
			t.Errorf("%s = %q, want %q", k, v, want)
		}
	}
	if len(r.Header.Get("Sec-Websocket-Key")) != 24 {
		t.Errorf("Sec-WebSocket-Key %q", r.Header.Get("Sec-Websocket-Key"))
	}
	if r.RemoteAddr != "127.0.0.1:0" {
		t.Errorf("RemoteAddr %q, want the client's address", r.RemoteAddr)
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); !ok || a.String() == "" {
		t.Errorf("no local address in the request's context")
	}
}

// A handler that panics on an upgrade costs that upgrade (502), as an
// http.Server's would, and not the process; the next upgrade is served.
func TestWrapHandlerPanic(t *testing.T) {
	var calls sync.Mutex
	n := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Lock()
		n++
		first := n == 1
		calls.Unlock()
		if first {
			panic("relay bug")
		}
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err == nil {
			c.Close()
		}
	})
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}).Wrap(h))
	if _, resp, err := websocket.DefaultDialer.Dial(url, nil); err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("upgrade to a panicking relay: %v, %v; want 502", resp, err)
	}
	c, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatalf("the next upgrade: %v", err)
	}
	c.Close()
}

// A handler that never answers an upgrade holds its client as an
// http.Server's would, and Shutdown ends the call: the request's context
// is cancelled.
func TestWrapHandlerNeverAnswers(t *testing.T) {
	called, returned := make(chan struct{}), make(chan struct{})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	url := serve(t, g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(called)
		<-r.Context().Done()
		close(returned)
	})))
	go func() {
		d := websocket.Dialer{HandshakeTimeout: time.Minute}
		if c, _, err := d.Dial(url, nil); err == nil {
			c.Close()
		}
	}()
	<-called
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case <-returned:
	default:
		t.Fatal("Shutdown returned before the handler's call")
	}
}
