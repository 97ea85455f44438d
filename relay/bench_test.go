//go:build !race

package relay

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// The publish benchmarks send signed EVENTs to khatru (in-memory store)
// over a raw gorilla connection and wait for each OK, directly and through
// the gate. Every frame through the gate is charged to a real EVENT limit
// (too large to refuse) and checked against the actor quota, so the
// numbers include the limiter and the quota, not just the bridge.
//
//	go test ./relay/ -run '^$' -bench 'Publish' -benchtime 2000x -count 1

// benchLimits charge every frame without refusing any.
func benchLimits() *policy.Limits {
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1e12, time.Second), ratelimit.PerPeriod(1e12, time.Minute)}
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(1e12, time.Second)}
	return &l
}

// benchTargets returns the URLs to benchmark: khatru direct, through a gate
// on the memory store, and through a gate on Redis, one round trip per
// decision and batched (skipped without redis-server unless
// REQUIRE_REDIS=1).
func benchTargets(b *testing.B) []struct {
	name string
	url  func(b *testing.B) string
} {
	quota := func(b *testing.B) *ratelimit.Quota {
		q, err := ratelimit.NewQuota(bigQuota, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		return q
	}
	return []struct {
		name string
		url  func(b *testing.B) string
	}{
		{"direct", func(b *testing.B) string { return serve(b, newKhatru(b)) }},
		{"gate-memory", func(b *testing.B) string {
			g := newGate(b, Options{Policy: policy.Config{Limits: benchLimits(), Quota: quota(b).WithClock(nil)}})
			return serve(b, g.Wrap(newKhatru(b)))
		}},
		{"gate-redis", func(b *testing.B) string {
			srv := redistest.Start(b)
			g := newGate(b, Options{Limiter: redisLimiter(b, srv.URL(), nil), Policy: policy.Config{Limits: benchLimits(), Quota: quota(b).WithClock(nil)}})
			return serve(b, g.Wrap(newKhatru(b)))
		}},
		{"gate-redis-batched", func(b *testing.B) string { // as sluice runs it
			srv := redistest.Start(b)
			g := newGate(b, Options{Limiter: redisLimiterBatch(b, srv.URL(), nil, 32), Policy: policy.Config{Limits: benchLimits(), Quota: quota(b).WithClock(nil)}})
			return serve(b, g.Wrap(newKhatru(b)))
		}},
	}
}

// signedFrames returns n EVENT frames and their OK prefixes.
func signedFrames(b *testing.B, n int) (frames [][]byte, oks []string) {
	sk := nostr.GeneratePrivateKey()
	for i := range n {
		ev := nostrtest.Note(b, sk, fmt.Sprintf("bench %d", i))
		f, _ := nostr.EventEnvelope{Event: ev}.MarshalJSON()
		frames = append(frames, f)
		oks = append(oks, `["OK","`+ev.ID+`",true`)
	}
	return frames, oks
}

// roundTrip publishes one frame on c and waits for its OK. It returns
// false when the gate answered "error: rate limiter unavailable" (a store
// call past its deadline on an overloaded machine, failing closed as it
// should); any other refusal fails the benchmark.
func roundTrip(b *testing.B, c *websocket.Conn, frame []byte, ok string) bool {
	if err := c.WriteMessage(websocket.TextMessage, frame); err != nil {
		b.Fatal(err)
	}
	for {
		_, reply, err := c.ReadMessage()
		if err != nil {
			b.Fatal(err)
		}
		if len(reply) >= len(ok) && string(reply[:len(ok)]) == ok {
			return true
		}
		if len(reply) > 5 && string(reply[:5]) == `["OK"` {
			if strings.Contains(string(reply), scan.ReasonUnavailable) {
				return false
			}
			b.Fatalf("refused: %s", reply)
		}
	}
}

// BenchmarkPublish is one client publishing and waiting for each OK:
// ns/op is the round trip, frames/s its inverse.
func BenchmarkPublish(b *testing.B) {
	for _, tg := range benchTargets(b) {
		b.Run(tg.name, func(b *testing.B) {
			url := tg.url(b)
			frames, oks := signedFrames(b, b.N)
			c := dialRaw(b, url)
			b.ReportAllocs()
			b.ResetTimer()
			var unavailable int
			for i := range b.N {
				if !roundTrip(b, c, frames[i], oks[i]) {
					unavailable++
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
			b.ReportMetric(float64(unavailable), "unavailable")
		})
	}
}

// BenchmarkPublishParallel is GOMAXPROCS×4 clients, each on its own
// connection, publishing and waiting for each OK: frames/s is the
// throughput of the whole path.
func BenchmarkPublishParallel(b *testing.B) {
	for _, tg := range benchTargets(b) {
		b.Run(tg.name, func(b *testing.B) {
			url := tg.url(b)
			frames, oks := signedFrames(b, b.N)
			var next, unavailable atomic.Int64
			b.SetParallelism(4)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				c := dialRaw(b, url)
				for pb.Next() {
					i := next.Add(1) - 1
					if !roundTrip(b, c, frames[i], oks[i]) {
						unavailable.Add(1)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
			b.ReportMetric(float64(unavailable.Load()), "unavailable")
		})
	}
}

// BenchmarkRoundTrip measures what the gate adds to one EVENT round trip
// when the relay does no work: an upstream that answers every EVENT with
// OK true at once (no signature check, no storage). ns/op is the round
// trip; the difference between direct and the gate is the gate's cost.
func BenchmarkRoundTrip(b *testing.B) {
	ok := func() *recorder {
		rec := newRecorder()
		rec.answerOK = func(hex32) bool { return true }
		rec.discard = true
		return rec
	}
	q, _ := ratelimit.NewQuota(bigQuota, time.Minute)
	for _, tg := range []struct {
		name string
		url  func(b *testing.B) string
	}{
		{"direct", func(b *testing.B) string { return serve(b, ok()) }},
		{"gate-memory-wrap", func(b *testing.B) string {
			return serve(b, newGate(b, Options{Policy: policy.Config{Limits: benchLimits(), Quota: q.WithClock(nil)}}).Wrap(ok()))
		}},
		{"gate-memory-proxy", func(b *testing.B) string {
			h, err := newGate(b, Options{Policy: policy.Config{Limits: benchLimits(), Quota: q.WithClock(nil)}}).Proxy(serve(b, ok()))
			if err != nil {
				b.Fatal(err)
			}
			return serve(b, h)
		}},
	} {
		b.Run(tg.name, func(b *testing.B) {
			c := dialRaw(b, tg.url(b))
			frames := make([][]byte, 1024)
			oks := make([]string, len(frames))
			for i := range frames {
				frames[i] = []byte(eventFrame(i, pubkeyN(i%7)))
				oks[i] = okReply(i, true, "")[:len(`["OK","`)+64+len(`",true`)]
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				roundTrip(b, c, frames[i%len(frames)], oks[i%len(frames)])
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
		})
	}
}

// BenchmarkIdleConnection opens b.N idle connections to khatru, directly
// and through the gate (Wrap and Proxy), and reports what each costs the
// process: heap and goroutine stacks (B/conn) and goroutines
// (goroutines/conn), measured after a GC with every connection open. The
// gate's own cost is a mode's figure minus direct's.
//
//	go test ./relay/ -run '^$' -bench IdleConnection -benchtime 2000x -count 1
func BenchmarkIdleConnection(b *testing.B) {
	for _, mode := range []string{"direct", "relay", "proxy"} {
		b.Run(mode, func(b *testing.B) {
			url := modeURL(b, mode)
			conns := make([]*websocket.Conn, 0, b.N)
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			before := heapInUse()
			g0 := runtime.NumGoroutine()
			for range b.N {
				conns = append(conns, dialOnce(b, url))
			}
			b.StopTimer()
			after := heapInUse()
			b.ReportMetric(float64(int64(after)-int64(before))/float64(b.N), "B/conn")
			b.ReportMetric(float64(runtime.NumGoroutine()-g0)/float64(b.N), "goroutines/conn")
		})
	}
}

// BenchmarkChurn opens a connection, makes one round trip and closes it
// cleanly, b.N times, to khatru directly and through the gate (Wrap and
// Proxy): the cost of a short-lived client.
//
//	go test ./relay/ -run '^$' -bench Churn -benchtime 3000x -count 3
func BenchmarkChurn(b *testing.B) {
	for _, mode := range []string{"direct", "relay", "proxy"} {
		b.Run(mode, func(b *testing.B) {
			url := modeURL(b, mode)
			b.ReportAllocs()
			for b.Loop() {
				c := dialOnce(b, url)
				_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
				_, _, _ = c.ReadMessage()
				c.Close()
			}
		})
	}
}

// dialOnce connects to url and makes one round trip (a COUNT), so the
// relay's side of the connection is set up too.
func dialOnce(b *testing.B, url string) *websocket.Conn {
	c, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		b.Fatal(err)
	}
	_ = c.WriteMessage(websocket.TextMessage, []byte(`["COUNT","c",{"kinds":[1]}]`))
	if _, _, err := c.ReadMessage(); err != nil {
		b.Fatal(err)
	}
	return c
}

// modeURL serves a fresh khatru directly ("direct") or behind a gate that
// charges nothing and caps nothing ("relay": Wrap, "proxy": Proxy), and
// returns the URL a client dials.
func modeURL(b *testing.B, mode string) string {
	kr := newKhatru(b)
	opts := Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxConnections: -1}
	switch mode {
	case "relay":
		return serve(b, newGate(b, opts).Wrap(kr))
	case "proxy":
		h, err := newGate(b, opts).Proxy(serve(b, kr))
		if err != nil {
			b.Fatal(err)
		}
		return serve(b, h)
	}
	return serve(b, kr)
}

// BenchmarkPublishUnderHeldFilters publishes a note with a hashtag through
// the gate (Wrap) to khatru and waits for its OK, with nothing else open
// ("idle"), and with one other address holding open as many filters as
// defaultMaxFilterBytes lets it ("held"): each filter of the kind khatru
// takes longest to reject for such a note, a "#t" list of 1,000 values as
// long as the note's tag, so every value is compared in full. khatru
// matches every new event against every open filter before it answers, so
// "held" over "idle" is what one address's open filters add to an honest
// publish. "unbounded" holds 8 times as much with the bound off.
//
//	go test ./relay/ -run '^$' -bench PublishUnderHeldFilters -benchtime 1000x -count 5
func BenchmarkPublishUnderHeldFilters(b *testing.B) {
	for _, mode := range []string{"idle", "held", "unbounded"} {
		b.Run(mode, func(b *testing.B) {
			opts := Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxConnections: -1, MaxSubscriptions: 1000}
			hold := 0
			switch mode {
			case "held":
				hold = defaultMaxFilterBytes
			case "unbounded":
				opts.MaxFilterBytes = -1
				hold = 8 * defaultMaxFilterBytes
			}
			url := serve(b, newGate(b, opts).Wrap(newKhatru(b)))
			var req strings.Builder
			held, n, full := 0, 0, hold == 0
			for conns := 0; !full && conns < 64*8; conns++ {
				c, _, err := websocket.DefaultDialer.Dial(url, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				for k := 0; k < 50 && !full; k++ {
					req.Reset()
					fmt.Fprintf(&req, `["REQ","h%d",{"#t":[`, n)
					for i := range 1000 {
						if i > 0 {
							req.WriteByte(',')
						}
						fmt.Fprintf(&req, `"%05x"`, i) // as long as the note's tag: compared in full
					}
					req.WriteString(`]}]`)
					if held+req.Len() > hold {
						full = true // as much as fits
						break
					}
					if err := c.WriteMessage(websocket.TextMessage, []byte(req.String())); err != nil {
						b.Fatal(err)
					}
					if _, m, err := c.ReadMessage(); err != nil || !bytes.HasPrefix(m, []byte(`["EOSE"`)) {
						b.Fatalf("filler REQ %d: %s %v", n, m, err)
					}
					held += req.Len()
					n++
				}
			}
			r := connect(b, url)
			sk := nostr.GeneratePrivateKey()
			ev := nostr.Event{Kind: 1, Content: "honest", Tags: nostr.Tags{{"t", "nostr"}}}
			b.ResetTimer()
			for i := range b.N {
				ev.CreatedAt = nostr.Timestamp(1_700_000_000 + i)
				ev.ID, ev.Sig = "", ""
				if err := ev.Sign(sk); err != nil {
					b.Fatal(err)
				}
				if err := nostrtest.Publish(b, r, ev); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(held), "held-B")
		})
	}
}
