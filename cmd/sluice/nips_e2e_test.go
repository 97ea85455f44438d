//go:build !race

package main

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
)

// nipStandIn is a relay for sluice proxy that serves doc as its NIP-11
// document (none, 404, when doc is "") and answers every COUNT with a
// count and every NEG-OPEN with a NEG-MSG, whatever its document says;
// every frame it gets goes to got.
func nipStandIn(t *testing.T, doc string) (url string, got chan string) {
	t.Helper()
	got = make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if nip11.IsRequest(r) {
			if doc == "" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", nip11.ContentType)
			_, _ = w.Write([]byte(doc))
			return
		}
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			_, data, err := c.ReadMessage()
			if err != nil {
				return
			}
			got <- string(data)
			var reply string
			switch f := string(data); {
			case strings.HasPrefix(f, `["COUNT","c"`):
				reply = `["COUNT","c",{"count":7}]`
			case strings.HasPrefix(f, `["NEG-OPEN","n"`):
				reply = `["NEG-MSG","n","61"]`
			}
			if reply != "" && c.WriteMessage(websocket.TextMessage, []byte(reply)) != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http"), got
}

// TestE2EProxyNIPsThatWork: sluice proxy lists NIP-45 and NIP-77 in its
// NIP-11 document only when the upstream's document does, and forwards
// COUNT and NEG-OPEN only then; otherwise (a document without them, or
// none at all) the gate answers them "unsupported: …" and the relay gets
// neither. What the document says is what works through the proxy.
func TestE2EProxyNIPsThatWork(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		works     bool
	}{
		{"listed", `{"name":"stand-in","supported_nips":[1,11,45,77]}`, true},
		{"not listed", `{"name":"stand-in","supported_nips":[1,11]}`, false},
		{"no document", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			up, got := nipStandIn(t, tc.doc)
			px := startSluice(t, "proxy", "--upstream", up)
			// The upstream's document is read as the proxy starts,
			// without a request asking for it.
			if tc.doc != "" {
				px.waitLog(t, 1, `"msg":"upstream NIP-11 read"`)
			} else {
				px.waitLog(t, 1, `"msg":"upstream NIP-11 unavailable`)
			}
			doc := getNIP11(t, ctx, px.url())
			if listed := slices.Contains(doc.SupportedNIPs, 45) && slices.Contains(doc.SupportedNIPs, 77); listed != tc.works {
				t.Errorf("NIP-11 through the proxy lists %v, want 45 and 77 listed: %v", doc.SupportedNIPs, tc.works)
			}
			c := dialRaw(t, ctx, px.url())
			for _, f := range []struct{ frame, works, refused string }{
				{`["COUNT","c",{"kinds":[1]}]`, `["COUNT","c",{"count":7}]`, `["CLOSED","c","unsupported: this relay does not do COUNT (NIP-45)"]`},
				{`["NEG-OPEN","n",{"kinds":[1]},"61"]`, `["NEG-MSG","n","61"]`, `["NEG-ERR","n","unsupported: this relay does not do negentropy syncs (NIP-77)"]`},
			} {
				if err := c.c.WriteMessage(websocket.TextMessage, []byte(f.frame)); err != nil {
					t.Fatal(err)
				}
				c.c.SetReadDeadline(time.Now().Add(30 * time.Second))
				_, reply, err := c.c.ReadMessage()
				if err != nil {
					t.Fatal(err)
				}
				want := f.refused
				if tc.works {
					want = f.works
				}
				if string(reply) != want {
					t.Errorf("%s answered %s, want %s", f.frame, reply, want)
				}
			}
			// A REQ goes through whatever the document says; the relay
			// got it, and before it only what the proxy forwarded.
			if err := c.c.WriteMessage(websocket.TextMessage, []byte(`["REQ","s",{"kinds":[1]}]`)); err != nil {
				t.Fatal(err)
			}
			var frames []string
			for len(frames) == 0 || !strings.HasPrefix(frames[len(frames)-1], `["REQ"`) {
				select {
				case f := <-got:
					frames = append(frames, f)
				case <-time.After(30 * time.Second):
					t.Fatalf("the relay got %q, and no REQ", frames)
				}
			}
			if n := len(frames) - 1; tc.works && n != 2 || !tc.works && n != 0 {
				t.Errorf("the relay got %q before the REQ", frames[:n])
			}
		})
	}
}
