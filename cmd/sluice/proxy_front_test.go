package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
	"github.com/sluice-relay/sluice/relay"
)

// proxyUpstream is an upstream for proxy-mode tests: NIP-11 answered,
// every other request's body read whole (as a NIP-86 handler does) and
// reported on got, answered 202.
type upstreamSeen struct {
	method, path, ctype, body, xff, upgrade string
	n                                       int64 // body bytes received
}

func proxyUpstream(t *testing.T) (url string, got chan upstreamSeen) {
	got = make(chan upstreamSeen, 16)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if nip11.IsRequest(r) {
			w.Header().Set("Content-Type", "application/nostr+json")
			_, _ = io.WriteString(w, `{"name":"upstream","limitation":{"max_message_length":4096}}`)
			return
		}
		var b bytes.Buffer
		n, _ := io.Copy(&b, io.LimitReader(r.Body, 1<<10))
		m, _ := io.Copy(io.Discard, r.Body)
		got <- upstreamSeen{r.Method, r.URL.Path, r.Header.Get("Content-Type"), b.String(), r.Header.Get("X-Forwarded-For"), r.Header.Get("Connection") + r.Header.Get("Upgrade"), n + m}
		w.Header().Set("Content-Type", "application/nostr+json+rpc")
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"result":true}`)
	}))
	t.Cleanup(up.Close)
	return "ws" + strings.TrimPrefix(up.URL, "http"), got
}

// proxyServer is sluice proxy's front over a gate with opts in front of
// upstream.
func proxyServer(t *testing.T, opts relay.Options, upstream string) *httptest.Server {
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	gated, err := g.Proxy(upstream)
	if err != nil {
		t.Fatal(err)
	}
	info := &nip11.Handler{
		Fetch:      func(ctx context.Context) ([]byte, error) { return nip11.Fetch(ctx, http.DefaultClient, upstream) },
		Limitation: nip11.Limitation{MaxMessageLength: 1000},
		Fallback:   []byte(`{}`),
	}
	srv := httptest.NewServer(proxyFront(info, gated))
	t.Cleanup(srv.Close)
	return srv
}

type plainReq struct{ method, path, ctype, body string }

func doPlain(t *testing.T, srv *httptest.Server, req plainReq, hdr ...string) (int, string) {
	t.Helper()
	r, _ := http.NewRequest(req.method, srv.URL+req.path, bytes.NewBufferString(req.body))
	if req.ctype != "" {
		r.Header.Set("Content-Type", req.ctype)
	}
	r.Header.Set("X-Forwarded-For", "6.6.6.6") // not believed: no trusted proxy
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(body)
}

// In proxy mode plain HTTP reaches the upstream on GET, HEAD and OPTIONS
// only by default: a POST (a NIP-86 management call, whose handler may
// read the whole body before checking the caller) or a DELETE is answered
// 405 by the gate and never sent on, whatever its Upgrade header says.
func TestProxyPlainHTTPMethods(t *testing.T) {
	upstream, got := proxyUpstream(t)
	srv := proxyServer(t, relay.Options{}, upstream)
	for _, c := range []struct {
		req plainReq
		hdr []string
	}{
		{plainReq{"POST", "/", "application/nostr+json+rpc", `{"method":"banpubkey","params":["x"]}`}, nil},
		{plainReq{"POST", "/", "application/nostr+json+rpc", `{}`}, []string{"Upgrade", "anything"}},
		{plainReq{"POST", "/", "application/nostr+json+rpc", `{}`}, []string{"Connection", "Upgrade", "Upgrade", "websocket"}},
		{plainReq{"DELETE", "/x", "text/plain", "gone"}, nil},
	} {
		if code, body := doPlain(t, srv, c.req, c.hdr...); code != http.StatusMethodNotAllowed {
			t.Errorf("%s %s %v: %d %q, want 405 from the gate", c.req.method, c.req.path, c.hdr, code, body)
		}
	}
	req := plainReq{"GET", "/admin/page", "", ""}
	if code, _ := doPlain(t, srv, req, "Upgrade", "websocket"); code != http.StatusAccepted {
		t.Errorf("GET /admin/page: %d, want the upstream's 202", code)
	}
	if s := <-got; s.method != "GET" || s.path != "/admin/page" || s.upgrade != "" {
		t.Errorf("upstream saw %+v first, want the GET without Connection or Upgrade (refused requests never reach it)", s)
	}
}

// With PlainMethods the operator lets NIP-86 (and any method) through to
// the upstream unchanged, with the gate's client-address headers, and
// bodies bounded; only NIP-11 is answered by sluice (the upstream's
// document with sluice's limits).
func TestProxyPassesHTTPThrough(t *testing.T) {
	upstream, got := proxyUpstream(t)
	srv := proxyServer(t, relay.Options{PlainMethods: []string{"POST", "DELETE"}}, upstream)
	for _, req := range []plainReq{
		{"POST", "/", "application/nostr+json+rpc", `{"method":"banpubkey","params":["x"]}`},
		{"GET", "/admin/page", "", ""},
		{"DELETE", "/x", "text/plain", "gone"},
	} {
		if code, body := doPlain(t, srv, req); code != http.StatusAccepted || body != `{"result":true}` {
			t.Errorf("%s %s: %d %q, want the upstream's answer", req.method, req.path, code, body)
		}
		s := <-got
		if s.method != req.method || s.path != req.path || s.ctype != req.ctype || s.body != req.body || s.xff != "127.0.0.1" {
			t.Errorf("upstream saw %+v, want %+v from 127.0.0.1", s, req)
		}
	}
	if code, _ := doPlain(t, srv, plainReq{"POST", "/", "application/nostr+json+rpc", strings.Repeat("x", plainBodyDefault+1)}); code != http.StatusRequestEntityTooLarge {
		t.Errorf("POST of a declared body past the bound: %d, want 413", code)
	}
	select {
	case s := <-got:
		t.Errorf("upstream saw %+v, want nothing of a body declared past the bound", s)
	default:
	}

	r, _ := http.NewRequest("GET", srv.URL+"/", nil)
	r.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"name":"upstream"`) || !strings.Contains(string(body), `"max_message_length":1000`) {
		t.Errorf("NIP-11 through the proxy: %s, want the upstream's document with sluice's limits merged", body)
	}
}
