package relay

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluice-relay/sluice/internal/nostrtest"
)

// Wrap passes plain HTTP to the relay on GET, HEAD, OPTIONS and the
// methods Options.PlainMethods names, never as an upgrade (no Connection
// or Upgrade header), and with at most plainBodyLimit bytes of its body
// for the relay to read; any other method is answered 405 with nothing
// read. A relay that reads whatever it is sent (as khatru's NIP-86 handler
// does) would otherwise read the whole 64 MiB sent below.
func TestWrapPlainHTTPBounded(t *testing.T) {
	const limit = plainBodyLimit
	type seen struct {
		method, upgrade string
		read            int64
	}
	var got []seen
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got = append(got, seen{r.Method, r.Header.Get("Connection") + r.Header.Get("Upgrade"), n})
	})
	for _, c := range []struct {
		name     string
		methods  []string
		method   string
		declared bool
		want     int   // status
		read     int64 // the most bytes read of the body
		reached  bool
	}{
		{"POST by default", nil, "POST", false, http.StatusMethodNotAllowed, 0, false},
		{"PUT with POST allowed", []string{"POST"}, "PUT", false, http.StatusMethodNotAllowed, 0, false},
		{"POST allowed, declared", []string{"POST"}, "POST", true, http.StatusRequestEntityTooLarge, 0, false},
		{"POST allowed, streamed", []string{"POST"}, "POST", false, http.StatusOK, limit + 1, true},
		{"GET with a body", nil, "GET", false, http.StatusOK, limit + 1, true},
	} {
		got = nil
		h := newGate(t, Options{PlainMethods: c.methods}).Wrap(inner)
		body := nostrtest.NewCountingBody(64 << 20)
		r := httptest.NewRequest(c.method, "/", body)
		r.ContentLength = -1
		if c.declared {
			r.ContentLength = 64 << 20
		}
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "anything")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want || body.N() > c.read || (len(got) == 1) != c.reached {
			t.Errorf("%s: %d, %d bytes read, relay saw %+v; want %d, at most %d read, reached %v", c.name, w.Code, body.N(), got, c.want, c.read, c.reached)
		}
		if len(got) == 1 && (got[0].upgrade != "" || got[0].read > limit) {
			t.Errorf("%s: relay saw %+v, want no Connection or Upgrade header and at most %d bytes", c.name, got[0], limit)
		}
		if c.want == http.StatusMethodNotAllowed && w.Header().Get("Allow") == "" {
			t.Errorf("%s: 405 without an Allow header", c.name)
		}
	}
}
