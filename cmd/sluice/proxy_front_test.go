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

	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/nip11"
)

// In proxy mode every plain HTTP request reaches the upstream unchanged —
// a NIP-86 management call (POST, application/nostr+json+rpc, a body), other
// paths and methods — with the gate's client-address headers; only NIP-11
// is answered by sluice (the upstream's document with sluice's limits).
func TestProxyPassesHTTPThrough(t *testing.T) {
	type seen struct{ method, path, ctype, body, xff string }
	got := make(chan seen, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if nip11.IsRequest(r) {
			w.Header().Set("Content-Type", "application/nostr+json")
			_, _ = io.WriteString(w, `{"name":"upstream"}`)
			return
		}
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.Header.Get("Content-Type"), string(b), r.Header.Get("X-Forwarded-For")}
		w.Header().Set("Content-Type", "application/nostr+json+rpc")
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"result":true}`)
	}))
	defer up.Close()
	g, err := relay.New(relay.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	upstream := "ws" + strings.TrimPrefix(up.URL, "http")
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
	defer srv.Close()

	for _, req := range []struct{ method, path, ctype, body string }{
		{"POST", "/", "application/nostr+json+rpc", `{"method":"banpubkey","params":["x"]}`},
		{"GET", "/admin/page", "", ""},
		{"DELETE", "/x", "text/plain", "gone"},
	} {
		r, _ := http.NewRequest(req.method, srv.URL+req.path, bytes.NewBufferString(req.body))
		if req.ctype != "" {
			r.Header.Set("Content-Type", req.ctype)
		}
		r.Header.Set("X-Forwarded-For", "6.6.6.6") // not believed: no trusted proxy
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted || string(body) != `{"result":true}` || resp.Header.Get("Content-Type") != "application/nostr+json+rpc" {
			t.Errorf("%s %s: %d %q %q, want the upstream's answer", req.method, req.path, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		s := <-got
		if s.method != req.method || s.path != req.path || s.ctype != req.ctype || s.body != req.body || s.xff != "127.0.0.1" {
			t.Errorf("upstream saw %+v, want %+v from 127.0.0.1", s, req)
		}
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
