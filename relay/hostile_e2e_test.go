//go:build !race

package relay

import (
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fiatjaf/khatru"
	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
)

// hostileFrame is one entry of testdata/hostile/frames.json.
type hostileFrame struct {
	Name     string `json:"name"`
	Why      string `json:"why"`
	Frame    string `json:"frame"`
	FrameHex string `json:"frame_hex"`
	Want     string `json:"want"`
}

// loadHostile reads the shared hostile corpus.
func loadHostile(t testing.TB) []hostileFrame {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "hostile", "frames.json"))
	if err != nil {
		t.Fatal(err)
	}
	var frames []hostileFrame
	if err := json.Unmarshal(b, &frames); err != nil {
		t.Fatal(err)
	}
	if len(frames) < 40 {
		t.Fatalf("the hostile corpus has %d frames; it lost some", len(frames))
	}
	for i := range frames {
		if frames[i].FrameHex != "" {
			raw, err := hex.DecodeString(frames[i].FrameHex)
			if err != nil {
				t.Fatalf("%s: %v", frames[i].Name, err)
			}
			frames[i].Frame = string(raw)
		}
	}
	return frames
}

// generous charges every type (so the charging path runs) without ever
// refusing for a limit.
func generous() *policy.Limits {
	var l policy.Limits
	for t := range l.Message {
		l.Message[t] = []ratelimit.Limit{ratelimit.PerPeriod(1e6, time.Second)}
	}
	return &l
}

// negKhatru is khatru as sluice relay runs it: negentropy on, and a
// NIP-42 challenge sent on every connection.
func negKhatru(t testing.TB) *khatru.Relay {
	kr := newKhatru(t)
	kr.Negentropy = true
	kr.OnConnect = append(kr.OnConnect, khatru.RequestAuth)
	return kr
}

// TestE2EHostileCorpus sends every frame of testdata/hostile to khatru
// (negentropy on) behind the gate, in relay mode and in proxy mode: each
// gets exactly its answer from the gate, none reaches the relay, and the
// relay still serves an honest client afterwards. khatru panics in a
// goroutine nothing recovers on some of these frames (the negentropy
// ones), which would end this test binary.
func TestE2EHostileCorpus(t *testing.T) {
	frames := loadHostile(t)
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			url := hostileTarget(t, mode, negKhatru(t), Options{Policy: policy.Config{Limits: generous()}})
			c := dialRaw(t, url)
			if got := readText(t, c); len(got) < 8 || got[:8] != `["AUTH",` {
				t.Fatalf("first frame %s, want khatru's challenge", got)
			}
			for _, f := range frames {
				if err := c.WriteMessage(websocket.TextMessage, []byte(f.Frame)); err != nil {
					t.Fatal(err)
				}
				if got := readText(t, c); got != f.Want {
					t.Errorf("%s (%s):\n got %s\nwant %s", f.Name, f.Why, got, f.Want)
				}
			}
			honest(t, url)
		})
	}
}

// TestE2EHostileStream sends a few thousand frames made by mutating the
// corpus (bytes flipped, cut, spliced, duplicated) with a fixed seed, as
// text and binary, to khatru behind the gate in both modes without
// waiting for answers: the relay survives and serves an honest client.
func TestE2EHostileStream(t *testing.T) {
	frames := loadHostile(t)
	sk := nostr.GeneratePrivateKey()
	real := nostrtest.Note(t, sk, "seed")
	realFrame, _ := nostr.EventEnvelope{Event: real}.MarshalJSON()
	seeds := [][]byte{realFrame, []byte(`["REQ","s",{"kinds":[1],"limit":5}]`), []byte(`["NEG-OPEN","n",{},"61"]`), []byte(`["NEG-MSG","n","61000002"]`), []byte(`["CLOSE","s"]`)}
	for _, f := range frames {
		seeds = append(seeds, []byte(f.Frame))
	}
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			url := hostileTarget(t, mode, negKhatru(t), Options{Policy: policy.Config{Limits: generous()}})
			c := dialRaw(t, url)
			synced := make(chan struct{})
			go func() { // drain the answers, and tell when a batch is through
				for {
					_, b, err := c.ReadMessage()
					if err != nil {
						close(synced)
						return
					}
					// The sync REQ is answered EOSE by khatru, or CLOSED
					// by the gate once the stream's REQs (each takes a
					// place, reused ids too) have filled the cap.
					if string(b) == "[\"EOSE\",\"sync\"]\n" || strings.HasPrefix(string(b), `["CLOSED","sync","blocked: too many open subscriptions`) {
						synced <- struct{}{}
					}
				}
			}()
			rng := rand.New(rand.NewPCG(10, 77))
			for i := range 3000 {
				if i%50 == 49 {
					// Wait for the batch's answers: the test is about
					// what reaches the relay, not about slow readers.
					_ = c.WriteMessage(websocket.TextMessage, []byte(`["REQ","sync",{"kinds":[65000],"limit":1}]`))
					select {
					case _, ok := <-synced:
						if !ok {
							t.Fatal("the gate closed the stream")
						}
					case <-time.After(10 * time.Second):
						t.Fatal("no EOSE for the sync REQ")
					}
				}
				b := mutate(rng, seeds)
				typ := websocket.TextMessage
				if rng.IntN(4) == 0 {
					typ = websocket.BinaryMessage
				}
				if err := c.WriteMessage(typ, b); err != nil {
					t.Fatalf("the gate closed the stream: %v", err)
				}
			}
			honest(t, url)
		})
	}
}

// mutate returns a copy of a random seed changed in one or more random
// ways.
func mutate(rng *rand.Rand, seeds [][]byte) []byte {
	b := append([]byte(nil), seeds[rng.IntN(len(seeds))]...)
	for range 1 + rng.IntN(3) {
		if len(b) == 0 {
			b = append(b, '[')
		}
		switch rng.IntN(6) {
		case 0: // flip a byte
			b[rng.IntN(len(b))] = byte(rng.IntN(256))
		case 1: // cut
			b = b[:rng.IntN(len(b))]
		case 2: // splice another seed's tail
			o := seeds[rng.IntN(len(seeds))]
			b = append(b[:rng.IntN(len(b))], o[rng.IntN(len(o)):]...)
		case 3: // duplicate a span
			i := rng.IntN(len(b))
			j := i + rng.IntN(len(b)-i)
			b = append(b[:j], append(append([]byte(nil), b[i:j]...), b[j:]...)...)
		case 4: // insert a structural byte
			i := rng.IntN(len(b))
			b = append(b[:i], append([]byte{`",{}[]:\ `[rng.IntN(9)]}, b[i:]...)...)
		case 5: // replace a hex payload with a long varint
			b = append(b[:rng.IntN(len(b))], `6100ffffffffffffffff7f00"]`...)
		}
	}
	return b
}

// hostileTarget serves kr behind a new gate in mode "relay" (Wrap) or
// "proxy" (Proxy to kr on its own port), and returns the gate's URL
// (its RelayURL too, unless opts names one: see serveSelf).
func hostileTarget(t *testing.T, mode string, kr http.Handler, opts Options) string {
	t.Helper()
	return serveSelf(t, opts, func(g *Gate) http.Handler {
		if mode == "relay" {
			return g.Wrap(kr)
		}
		h, err := g.Proxy(serve(t, kr))
		if err != nil {
			t.Fatal(err)
		}
		return h
	})
}

// honest checks that the relay behind url still stores and serves events.
func honest(t *testing.T, url string) {
	t.Helper()
	r := connect(t, url)
	ev := nostrtest.Note(t, nostr.GeneratePrivateKey(), "still here")
	if err := nostrtest.Publish(t, r, ev); err != nil {
		t.Fatalf("honest publish after the hostile frames: %v", err)
	}
	if got := query(t, r, nostr.Filter{IDs: []string{ev.ID}}); len(got) != 1 {
		t.Fatalf("honest query after the hostile frames: %v", got)
	}
}
