//go:build !race

package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// A CLOSE or NEG-CLOSE that names nothing open is answered by the gate and
// never forwarded, and its type is free; it must still cost its sender
// something, or a client has the gate read and drop such frames as fast as
// its socket takes them, counted as admitted. It is charged to the
// catch-all, refused from the local table once that is spent, and a client
// that keeps knocking is cut. (Without the charge, none of 20,000 was
// refused and the connection stayed open.)
func TestE2EUnmatchedClosesAreCharged(t *testing.T) {
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			var unmatched, limited atomic.Int64
			obs := &policy.Observer{Frame: func(_ string, ty wire.Type, o policy.Outcome) {
				switch {
				case o == policy.Unmatched:
					unmatched.Add(1)
				case o == policy.RateLimited && (ty == wire.TypeCLOSE || ty == wire.TypeNEGCLOSE):
					limited.Add(1)
				}
			}}
			rec := newRecorder()
			url := hostileTarget(t, mode, rec, Options{Observer: obs})
			c := dialRaw(t, url)
			go func() {
				for i := range 20_000 {
					f := `["CLOSE","nothing"]`
					switch i % 3 {
					case 1:
						f = `["NEG-CLOSE","nothing"]`
					case 2:
						f = `["CLOSE"]` // invalid: answered with a NOTICE
					}
					if c.WriteMessage(websocket.TextMessage, []byte(f)) != nil {
						return
					}
				}
			}()
			wantKnockCut(t, c)
			if unmatched.Load() == 0 || limited.Load() == 0 {
				t.Fatalf("unmatched %d, rate-limited %d: want both counted", unmatched.Load(), limited.Load())
			}
			rec.mu.Lock()
			got := append([]string(nil), rec.got...)
			rec.mu.Unlock()
			for _, f := range got {
				if strings.Contains(f, "CLOSE") {
					t.Fatalf("the relay got %s", f)
				}
			}
		})
	}
}

// wantKnockCut reads c until the gate closes it for knocking.
func wantKnockCut(t *testing.T, c *websocket.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation || !strings.HasPrefix(ce.Text, "sluice: too many refused frames") {
			t.Fatalf("connection ended with %v, want the knocking cut", err)
		}
		return
	}
}

// A COUNT runs the relay's query like a REQ, so while it runs it takes a
// place among the connection's subscriptions: without that, COUNTs of
// slow queries could be kept running at the relay in any number. The
// relay's answer frees the place.
func TestE2ECountTakesPlace(t *testing.T) {
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			kr := newKhatru(t)
			release := make(chan struct{})
			var counting atomic.Int64
			kr.CountEvents = append([]func(context.Context, nostr.Filter) (int64, error){
				func(ctx context.Context, f nostr.Filter) (int64, error) {
					if f.Search == "slow" {
						counting.Add(1)
						select {
						case <-release:
						case <-ctx.Done():
						}
					}
					return 0, nil
				}}, kr.CountEvents[1:]...)
			url := hostileTarget(t, mode, kr, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxSubscriptions: 2})
			c := dialRaw(t, url)
			for _, f := range []string{`["COUNT","a",{"search":"slow"}]`, `["COUNT","b",{"search":"slow"}]`} {
				if err := c.WriteMessage(websocket.TextMessage, []byte(f)); err != nil {
					t.Fatal(err)
				}
			}
			if got := send(t, c, []byte(`["COUNT","c",{"search":"slow"}]`)); !strings.HasPrefix(got, `["CLOSED","c","blocked: too many open subscriptions`) {
				t.Fatalf("a third COUNT with two running, cap 2: %s, want CLOSED blocked", got)
			}
			if got := send(t, c, []byte(`["REQ","d",{"kinds":[1]}]`)); !strings.HasPrefix(got, `["CLOSED","d","blocked:`) {
				t.Fatalf("a REQ with two COUNTs running, cap 2: %s, want CLOSED blocked", got)
			}
			if n := counting.Load(); n > 2 {
				t.Fatalf("the relay ran %d slow counts, want at most 2", n)
			}
			close(release)
			answered := 0
			for answered < 2 {
				if got := readText(t, c); strings.HasPrefix(got, `["COUNT",`) {
					answered++
				}
			}
			if got := send(t, c, []byte(`["COUNT","e",{"kinds":[1]}]`)); !strings.HasPrefix(got, `["COUNT","e",`) {
				t.Fatalf("a COUNT after the relay answered the others: %s, want its count", got)
			}
		})
	}
}

// authorsREQ returns a REQ under id of one filter of n made-up authors.
func authorsREQ(id string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `["REQ",%q,{"authors":[`, id)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"%064x"`, i+1)
	}
	b.WriteString(`],"limit":1}]`)
	return b.String()
}

// The relay keeps every open filter and matches each new event against
// all of them, so what one address keeps open is bounded in bytes across
// its connections (Options.MaxFilterBytes), not only in subscriptions per
// connection: 64 connections × 50 REQs of 64 KiB each are gigabytes at khatru.
// A REQ that would pass the bound is refused; closing a subscription, or a
// connection, gives its bytes back.
func TestE2EFilterBytesPerAddress(t *testing.T) {
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			one := len(authorsREQ("s0", 150)) // ~10 KiB
			url := hostileTarget(t, mode, newKhatru(t), Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxFilterBytes: 2*one + one/2})
			a, b := dialRaw(t, url), dialRaw(t, url)
			if got := strings.TrimSpace(send(t, a, []byte(authorsREQ("s0", 150)))); got != `["EOSE","s0"]` {
				t.Fatalf("first REQ: %s", got)
			}
			if got := strings.TrimSpace(send(t, b, []byte(authorsREQ("s1", 150)))); got != `["EOSE","s1"]` {
				t.Fatalf("second REQ, on another connection: %s", got)
			}
			if got := send(t, b, []byte(authorsREQ("s2", 150))); !strings.HasPrefix(got, `["CLOSED","s2","blocked: the subscriptions open from your address hold too many filter bytes`) {
				t.Fatalf("third REQ past the address's bound: %s, want CLOSED blocked", got)
			}
			// Small REQs still fit in what is left.
			if got := strings.TrimSpace(send(t, b, []byte(`["REQ","small",{"kinds":[1]}]`))); got != `["EOSE","small"]` {
				t.Fatalf("a small REQ under the bound: %s", got)
			}
			if err := a.WriteMessage(websocket.TextMessage, []byte(`["CLOSE","s0"]`)); err != nil {
				t.Fatal(err)
			}
			// The CLOSE is handled before a's next frame is read, so once
			// a's answer to that frame arrives the bytes are back.
			if got := send(t, a, []byte(`["CLOSE"]`)); !strings.HasPrefix(got, `["NOTICE","invalid:`) {
				t.Fatalf("barrier: %s", got)
			}
			if got := strings.TrimSpace(send(t, b, []byte(authorsREQ("s2", 150)))); got != `["EOSE","s2"]` {
				t.Fatalf("a REQ after another connection closed one: %s", got)
			}
			if got := send(t, b, []byte(authorsREQ("s3", 150))); !strings.HasPrefix(got, `["CLOSED","s3","blocked:`) {
				t.Fatalf("over the bound again: %s", got)
			}
			_ = b.Close()
			c := dialRaw(t, url)
			for i := range 2 {
				id := fmt.Sprintf("t%d", i)
				// The gate frees b's bytes once it has seen b go: retry
				// until then (bounded by readText's deadline).
				for {
					got := strings.TrimSpace(send(t, c, []byte(authorsREQ(id, 150))))
					if got == `["EOSE","`+id+`"]` {
						break
					}
					if !strings.HasPrefix(got, `["CLOSED","`+id+`","blocked:`) {
						t.Fatalf("REQ %s after b closed: %s", id, got)
					}
				}
			}
		})
	}
}
