package relay

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// shapeModes serves a recorder (answering every REQ with EOSE) behind g in
// each mode over pipes, inside a synctest bubble: Wrap (the tap, sluice
// relay's mode) and Proxy (the bridge), whose upstream dials the
// recorder's own pipe network.
var shapeModes = []struct {
	name  string
	serve func(t *testing.T, g *Gate, rec *recorder) (*pipeNet, string)
}{
	{"wrap", func(t *testing.T, g *Gate, rec *recorder) (*pipeNet, string) {
		return servePipe(t, g.Wrap(rec))
	}},
	{"proxy", func(t *testing.T, g *Gate, rec *recorder) (*pipeNet, string) {
		upNet, upURL := servePipe(t, rec)
		up, _, err := newURLUpstream(upURL)
		if err != nil {
			t.Fatal(err)
		}
		up.dialer.NetDialContext = upNet.dial
		up.dialer.Proxy = nil
		return servePipe(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.serveWS(w, r, up) }))
	}},
}

// shapeGate returns a gate whose REQs pay a window (rate, 1 s) on the
// bubble's clock, holding for at most maxDelay, with an observer that
// counts held frames and the most held at once.
func shapeGate(t *testing.T, rate float64, maxDelay time.Duration) (*Gate, *holdCounts) {
	var l policy.Limits
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(rate, time.Second)}
	l.MaxDelay = maxDelay
	hc := &holdCounts{}
	var g *Gate
	obs := &policy.Observer{
		Frame: func(string, wire.Type, policy.Outcome) { hc.sample(g) },
		Held: func(_ wire.Type, d time.Duration, shadow bool) {
			hc.mu.Lock()
			defer hc.mu.Unlock()
			hc.held++
			hc.longest = max(hc.longest, d)
		},
	}
	g = newGate(t, Options{
		Limiter:          ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), time.Now),
		Policy:           policy.Config{Limits: &l},
		MaxSubscriptions: 1000,
		Observer:         obs,
	})
	return g, hc
}

// holdCounts is what a shaping gate's observer saw.
type holdCounts struct {
	mu sync.Mutex
	holdSeen
}

type holdSeen struct {
	held              int           // frames released after a hold
	longest           time.Duration // the longest hold
	maxFrames, maxBuf int64         // the most frames and bytes held at once
}

// settled is what the observer saw once every goroutine in the bubble
// is blocked: a frame held and then refused is observed after its
// CLOSED is written, so the client can read its last reply before the
// gate's goroutine tells the observer.
func (hc *holdCounts) settled() holdSeen {
	synctest.Wait()
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return hc.holdSeen
}

func (hc *holdCounts) sample(g *Gate) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	hc.maxFrames = max(hc.maxFrames, g.heldFrames.Load())
	hc.maxBuf = max(hc.maxBuf, g.heldBytes.Load())
}

// A client that opens three times its REQ burst at once gets every
// subscription (EOSE, no CLOSED) when MaxDelay covers what its budget
// takes to admit them, 2T/ln2 past the burst; the last one comes that
// late and no later. Without shaping the same burst gets 2R CLOSEDs; with
// a MaxDelay too short for all of it, the frames past the delay are
// refused with their wait, as without shaping, and none is held longer
// than MaxDelay counted from the run's first hold.
func TestShapeBurst(t *testing.T) {
	const rate = 5
	interval := time.Duration(float64(time.Second) * math.Log2(rate/(rate-1.0))) // one more admitted after the burst
	for _, mode := range shapeModes {
		for _, tc := range []struct {
			name     string
			maxDelay time.Duration
			closed   int
		}{
			{"off", 0, 2 * rate},
			{"enough", 4 * time.Second, 0},
			// 6 intervals (1.93 s) fit in 2 s, the 7th does not: the run
			// is over its bound and the last four are refused.
			{"short", 2 * time.Second, 2*rate - 6},
		} {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					g, hc := shapeGate(t, rate, tc.maxDelay)
					rec := newRecorder()
					rec.eose = true
					pn, url := mode.serve(t, g, rec)
					c := pn.dialWS(t, url)
					start := time.Now()
					go func() {
						for i := range 3 * rate {
							if c.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, `["REQ","s%d",`+narrowFilter+`]`, i)) != nil {
								return
							}
						}
					}()
					closed, eose := 0, 0
					var last time.Duration
					for closed+eose < 3*rate {
						_, data, err := c.ReadMessage()
						if err != nil {
							t.Fatalf("after %d EOSE and %d CLOSED: %v", eose, closed, err)
						}
						switch {
						case strings.HasPrefix(string(data), `["EOSE"`):
							eose++
							last = time.Since(start)
						case strings.HasPrefix(string(data), `["CLOSED"`):
							closed++
							if !strings.Contains(string(data), "rate-limited: ") || !strings.Contains(string(data), "; retry in 1s") {
								t.Errorf("refusal %s", data)
							}
						default:
							t.Fatalf("unexpected %s", data)
						}
					}
					if closed != tc.closed {
						t.Errorf("%d CLOSED, want %d", closed, tc.closed)
					}
					if got := len(rec.frames(eose)); got != eose {
						t.Errorf("relay got %d REQs, want the %d admitted", got, eose)
					}
					held := 3*rate - tc.closed - rate
					hs := hc.settled()
					if hs.held != held {
						t.Errorf("%d frames held, want %d", hs.held, held)
					}
					// The budget's own pace: the last admitted frame after
					// its held ones, each one interval after the last.
					if want := time.Duration(held) * interval; last < want-time.Millisecond || last > want+time.Millisecond || (tc.maxDelay > 0 && last > tc.maxDelay) {
						t.Errorf("last EOSE after %v, want %v (within MaxDelay %v)", last, want, tc.maxDelay)
					}
					if hs.longest > interval+time.Millisecond {
						t.Errorf("a frame was held %v, longer than one interval %v", hs.longest, interval)
					}
					if hs.maxFrames > 1 {
						t.Errorf("%d frames held at once on one connection", hs.maxFrames)
					}
					if n := g.heldFrames.Load(); n != 0 {
						t.Errorf("%d frames still counted held", n)
					}
				})
			})
		}
	}
}

// A flooder at ten times its rate is treated as without shaping once its
// run passes MaxDelay: admitted no more than its budget, refused most of
// what it sends, and cut for knocking as it would be without shaping,
// while it holds at most one frame (one buffer) at a time.
func TestShapeFlooder(t *testing.T) {
	const rate = 5
	for _, mode := range shapeModes {
		t.Run(mode.name, func(t *testing.T) {
			counts := map[time.Duration][2]int{}
			cutAt := map[time.Duration]time.Duration{}
			for _, maxDelay := range []time.Duration{0, time.Second} {
				synctest.Test(t, func(t *testing.T) {
					g, hc := shapeGate(t, rate, maxDelay)
					rec := newRecorder()
					rec.eose = true
					pn, url := mode.serve(t, g, rec)
					c := pn.dialWS(t, url)
					start := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					// Ten times the rate the budget sustains (R·ln2 per T).
					every := time.Duration(math.Round(float64(time.Second) / (rate * math.Ln2 * 10)))
					wrote := make(chan struct{})
					go func() {
						defer close(wrote)
						for i := 0; ctx.Err() == nil; i++ {
							if c.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, `["REQ","s%d",`+narrowFilter+`]`, i)) != nil {
								return
							}
							time.Sleep(every)
						}
					}()
					// Without the cut, the read times out.
					_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
					var eose, closed atomic.Int64
					cut := ""
					for {
						_, data, err := c.ReadMessage()
						if err != nil {
							cut = err.Error()
							break
						}
						s := string(data)
						switch {
						case strings.HasPrefix(s, `["EOSE"`):
							eose.Add(1)
						case strings.HasPrefix(s, `["CLOSED"`):
							closed.Add(1)
						}
					}
					cancel()
					<-wrote
					counts[maxDelay] = [2]int{int(eose.Load()), int(closed.Load())}
					if !strings.Contains(cut, "too many refused frames") {
						t.Errorf("max_delay %v: the flooder was not cut for knocking: %q", maxDelay, cut)
					}
					cutAt[maxDelay] = time.Since(start)
					hs := hc.settled()
					if maxDelay > 0 && hs.maxFrames > 1 {
						t.Errorf("%d frames held at once, want at most 1", hs.maxFrames)
					}
					// One pooled frame buffer: 4 KiB new, up to maxKeptFrameBuf
					// when the pool hands back a larger one.
					if maxDelay > 0 && hs.maxBuf > maxKeptFrameBuf {
						t.Errorf("%d bytes held at once, want one frame buffer (at most %d)", hs.maxBuf, maxKeptFrameBuf)
					}
					t.Logf("max_delay %v: %d admitted, %d refused, %d held, at most %d bytes held, cut after %v", maxDelay, eose.Load(), closed.Load(), hs.held, hs.maxBuf, cutAt[maxDelay])
				})
			}
			off, on := counts[0], counts[time.Second]
			t.Logf("refused %d with shaping, %d without", on[1], off[1])
			// The budget until the cut: the burst and R·ln2 a second.
			for d, n := range counts {
				if budget := rate + int(math.Ceil(cutAt[d].Seconds()*rate*math.Ln2)); n[0] > budget {
					t.Errorf("max_delay %v: admitted %d in %v, past the budget %d", d, n[0], cutAt[d], budget)
				}
			}
			if on[1] < 4*on[0] {
				t.Errorf("with shaping the flooder was refused %d and admitted %d: not refused as a flooder", on[1], on[0])
			}
		})
	}
}

// The decision at release is the real one: two connections of one client
// that each open twice their shared REQ burst at once are admitted, all
// told, no more than the budget allows at any instant, the frames each
// held being charged when they are let go.
func TestShapeReleaseRedecides(t *testing.T) {
	const rate = 5
	for _, mode := range shapeModes {
		t.Run(mode.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g, hc := shapeGate(t, rate, 4*time.Second)
				rec := newRecorder()
				rec.eose = true
				pn, url := mode.serve(t, g, rec)
				start := time.Now()
				var mu sync.Mutex
				var admitted []time.Duration
				var wg sync.WaitGroup
				for k := range 2 {
					c := pn.dialWS(t, url)
					wg.Add(1)
					go func() {
						defer wg.Done()
						go func() {
							for i := range 2 * rate {
								_ = c.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, `["REQ","c%ds%d",`+narrowFilter+`]`, k, i))
							}
						}()
						for range 2 * rate {
							_, data, err := c.ReadMessage()
							if err != nil {
								t.Errorf("connection %d: %v", k, err)
								return
							}
							if strings.HasPrefix(string(data), `["EOSE"`) {
								mu.Lock()
								admitted = append(admitted, time.Since(start))
								mu.Unlock()
							}
						}
					}()
				}
				wg.Wait()
				for i, at := range admitted {
					// From rest a window (R, T) admits R at once and then
					// one more every interval at most.
					if budget := rate + int(math.Floor(at.Seconds()/math.Log2(rate/(rate-1.0))+1e-9)); i+1 > budget {
						t.Errorf("%d admitted after %v, past the budget %d", i+1, at, budget)
					}
				}
				hs := hc.settled()
				if hs.held == 0 {
					t.Error("nothing was held")
				}
				t.Logf("%d admitted, %d held", len(admitted), hs.held)
			})
		})
	}
}

// In shadow mode nothing is refused, so nothing is held; the observer
// hears of each frame that would have been, with the wait it would have
// been held for.
func TestShapeShadow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate = 5
		var l policy.Limits
		l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(rate, time.Second)}
		l.MaxDelay = time.Second
		var would, held atomic.Int64
		obs := &policy.Observer{Held: func(_ wire.Type, d time.Duration, shadow bool) {
			if !shadow {
				held.Add(1)
			} else if d > 0 && d <= time.Second {
				would.Add(1)
			}
		}}
		g := newGate(t, Options{
			Limiter:          ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), time.Now),
			Policy:           policy.Config{Limits: &l, Shadow: true},
			MaxSubscriptions: 100,
			Observer:         obs,
		})
		rec := newRecorder()
		rec.eose = true
		pn, url := servePipe(t, g.Wrap(rec))
		c := pn.dialWS(t, url)
		start := time.Now()
		for i := range 3 * rate {
			if err := c.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, `["REQ","s%d",`+narrowFilter+`]`, i)); err != nil {
				t.Fatal(err)
			}
			if _, data, err := c.ReadMessage(); err != nil || !strings.HasPrefix(string(data), `["EOSE"`) {
				t.Fatalf("REQ %d: %s %v", i, data, err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("shadow mode delayed the frames by %v", d)
		}
		if would.Load() != 2*rate || held.Load() != 0 {
			t.Errorf("observer heard %d would-be holds and %d holds, want %d and 0", would.Load(), held.Load(), 2*rate)
		}
	})
}

// Past the gate's bound on held buffers (maxHeldBytes) a frame is refused
// with its wait, as without shaping, and held again once there is room.
func TestShapeGateBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate = 5
		g, hc := shapeGate(t, rate, 4*time.Second)
		g.heldBytes.Add(maxHeldBytes - frameBufSize + 1) // no room for one buffer
		rec := newRecorder()
		rec.eose = true
		pn, url := servePipe(t, g.Wrap(rec))
		c := pn.dialWS(t, url)
		send := func(n int) (eose, closed int) {
			for i := range n {
				if err := c.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, `["REQ","s%d",`+narrowFilter+`]`, i)); err != nil {
					t.Fatal(err)
				}
			}
			for range n {
				_, data, err := c.ReadMessage()
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(string(data), `["CLOSED"`) {
					closed++
				} else {
					eose++
				}
			}
			return eose, closed
		}
		if eose, closed := send(rate + 1); eose != rate || closed != 1 || hc.settled().held != 0 {
			t.Errorf("gate full: %d EOSE, %d CLOSED, %d held; want %d, 1, 0", eose, closed, hc.settled().held, rate)
		}
		g.heldBytes.Add(-(maxHeldBytes - frameBufSize + 1))
		time.Sleep(5 * time.Second) // after the refusal's wait, and max_delay without one
		if eose, closed := send(rate + 1); eose != rate+1 || closed != 0 || hc.settled().held == 0 {
			t.Errorf("room again: %d EOSE, %d CLOSED, %d held; want %d, 0, some", eose, closed, hc.settled().held, rate+1)
		}
	})
}

// narrowFilter is a filter priced 1 (policy.ReadCost's narrow): the
// tests count frames, not prices.
const narrowFilter = `{"authors":["0000000000000000000000000000000000000000000000000000000000000001"]}`
