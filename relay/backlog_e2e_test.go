//go:build !race

package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/relay/policy"
)

// The write timeout these tests give the gate: far longer than any test,
// so a gate that waits on a write toward a client, or cuts a client by a
// write deadline, hangs or cuts where the rule under test would not.
const noWriteDeadline = time.Hour

// dialReadBuffer dials url with a socket receive buffer of n bytes, as a
// client on a slow link or one that means to stall its queue.
func dialReadBuffer(t *testing.T, url string, n int) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{NetDial: func(network, addr string) (net.Conn, error) {
		c, err := net.Dial(network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(n)
		}
		return c, err
	}}
	c, _, err := d.Dial(url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cutCounter is an policy.Observer that counts slow-reader cuts and signals the
// first.
type cutCounter struct {
	n    atomic.Int64
	once sync.Once
	cut  chan struct{}
}

func newCutCounter() *cutCounter { return &cutCounter{cut: make(chan struct{})} }

func (c *cutCounter) observer() *policy.Observer {
	return &policy.Observer{Cut: func(r string) {
		if r == "slow_reader" {
			c.n.Add(1)
			c.once.Do(func() { close(c.cut) })
		}
	}}
}

// storeNotes stores n kind-1 events of size bytes of content on kr, by a
// client of its own, and returns their total content bytes.
func storeNotes(t *testing.T, kr http.Handler, n, size int) {
	t.Helper()
	direct := connect(t, serve(t, kr))
	sk := nostr.GeneratePrivateKey()
	pad := strings.Repeat("x", size)
	for i := range n {
		if err := nostrtest.Publish(t, direct, nostrtest.Note(t, sk, fmt.Sprint(i, pad))); err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
}

// A subscriber whose queue is full never holds up anyone else's publish or
// live delivery, in either mode: khatru writes each new event to its
// listeners one after another before it answers OK, so one write that
// waits for a stalled reader would hold every publisher behind it. The
// stalled reader is cut by its backlog instead. With a write that waits,
// the publishes below stop once the stalled client's socket buffers are
// full (about 4 MiB on loopback), and each waits for the hour-long write
// timeout.
func TestE2EStalledSubscriberHoldsNoPublisher(t *testing.T) {
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			cuts := newCutCounter()
			url := hostileTarget(t, mode, newKhatru(t), Options{
				Policy: policy.Config{Limits: &policy.Limits{}}, QueueBytes: 1 << 20, WriteTimeout: noWriteDeadline, Observer: cuts.observer(),
			})
			stalled := dialReadBuffer(t, url, 4<<10)
			if err := stalled.WriteMessage(websocket.TextMessage, []byte(`["REQ","all",{"kinds":[1]}]`)); err != nil {
				t.Fatal(err)
			}
			if got := readText(t, stalled); !strings.HasPrefix(got, `["EOSE","all"]`) {
				t.Fatalf("stalled client's REQ: %s", got)
			}

			var live atomic.Int64
			listener := connect(t, url)
			sub, err := listener.Subscribe(context.Background(), nostr.Filters{{Kinds: []int{1}}})
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				for range sub.Events {
					live.Add(1)
				}
			}()
			<-sub.EndOfStoredEvents

			// 8 MB toward the stalled client: twice what the kernel holds
			// for it, and eight times its queue bound.
			const n, size = 2000, 4 << 10
			pub := connect(t, url)
			sk := nostr.GeneratePrivateKey()
			pad := strings.Repeat("x", size)
			cutAt := -1
			for i := range n {
				// A bound for a hang, far above any publish on a loaded
				// machine, far below the hour a waiting write would take.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := pub.Publish(ctx, nostrtest.Note(t, sk, fmt.Sprint(i, pad)))
				cancel()
				if err != nil {
					t.Fatalf("honest publish %d of %d (stalled client cut: %v): %v", i, n, cuts.n.Load() > 0, err)
				}
				if cutAt < 0 && cuts.n.Load() > 0 {
					cutAt = i
				}
			}
			if cutAt < 0 {
				t.Fatalf("the stalled client was not cut after %d events toward it", n)
			}
			deadline := time.Now().Add(nostrtest.Timeout)
			for live.Load() < n && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond) // polls go-nostr's listener, a goroutine of its own, up to nostrtest.Timeout
			}
			if got := live.Load(); got != n {
				t.Fatalf("honest listener got %d of %d live events", got, n)
			}
			if got := cuts.n.Load(); got != 1 {
				t.Fatalf("%d slow-reader cuts, want the stalled client's alone", got)
			}
			t.Logf("stalled client cut after publish %d", cutAt)
		})
	}
}

// sendBufTarget is hostileTarget with sendBufListener's send buffers of
// sendBuf bytes on the gate's side.
func sendBufTarget(t *testing.T, mode string, kr http.Handler, sendBuf int, opts Options) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.Listener = sendBufListener{srv.Listener, sendBuf}
	g := newGate(t, opts)
	if mode == "relay" {
		srv.Config.Handler = g.Wrap(kr)
	} else {
		h, err := g.Proxy(serve(t, kr))
		if err != nil {
			t.Fatal(err)
		}
		srv.Config.Handler = h
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return "ws://" + srv.Listener.Addr().String()
}

// A client the relay is behind on has its next requests wait in its own
// socket, in both modes: the gate reads no more of its frames while its
// backlog is over the low mark, so it holds the relay's goroutines and the
// gate's memory to constants, whatever it sends within its limits. Without
// that, khatru starts a goroutine per frame, and each answers into the
// backlog: here, 1,000 frames while the client reads nothing.
func TestE2EBackloggedClientWaitsInItsSocket(t *testing.T) {
	kr := newKhatru(t)
	// seen counts the EVENTs of the subtest's own client.
	var seen atomic.Int64
	var who atomic.Value
	who.Store("")
	kr.RejectEvent = append(kr.RejectEvent, func(_ context.Context, ev *nostr.Event) (bool, string) {
		if ev.PubKey == who.Load() {
			seen.Add(1)
		}
		return false, ""
	})
	// 3 MB of stored results, far past the low mark and the kernel's
	// buffers below.
	const stored = 1500
	storeNotes(t, kr, stored, 2<<10)
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			sk := nostr.GeneratePrivateKey()
			pk, _ := nostr.GetPublicKey(sk)
			who.Store(pk)
			seen.Store(0)
			url := sendBufTarget(t, mode, kr, 16<<10, Options{Policy: policy.Config{Limits: &policy.Limits{}}, QueueBytes: 64 << 20, WriteTimeout: noWriteDeadline})

			c := dialReadBuffer(t, url, 16<<10)
			if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","all",{"kinds":[1],"limit":500},{"kinds":[1],"limit":500},{"kinds":[1],"limit":500}]`)); err != nil {
				t.Fatal(err)
			}
			base := runtime.NumGoroutine()

			// 500 EVENTs (of a kind its REQ does not match) and 500
			// COUNTs, written while the client reads nothing; the writes
			// stop when its socket is full.
			const pairs = 500
			frames := make([][]byte, 0, 2*pairs)
			for i := range pairs {
				ev := nostr.Event{Kind: 7, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: fmt.Sprint("behind ", i)}
				if err := ev.Sign(sk); err != nil {
					t.Fatal(err)
				}
				b, _ := json.Marshal([]any{"EVENT", ev})
				frames = append(frames, b, fmt.Appendf(nil, `["COUNT","c%d",{"kinds":[1]}]`, i))
			}
			wrote := make(chan error, 1)
			go func() {
				for _, b := range frames {
					if err := c.WriteMessage(websocket.TextMessage, b); err != nil {
						wrote <- err
						return
					}
				}
				wrote <- nil
			}()
			// A second of real time (khatru serves real sockets) for a gate
			// that reads on to hand the relay every frame; this one hands
			// it a few.
			time.Sleep(time.Second)
			t.Logf("while behind: %d EVENTs handed to the relay, goroutines %+d", seen.Load(), runtime.NumGoroutine()-base)
			if got := seen.Load(); got > 50 {
				t.Errorf("the relay was handed %d of %d EVENTs while the client was behind", got, pairs)
			}
			if grew := runtime.NumGoroutine() - base; grew > 50 {
				t.Errorf("goroutines grew by %d while the client was behind", grew)
			}

			// It reads: everything it asked is answered.
			events, counts, oks := 0, 0, 0
			for events < stored || counts < pairs || oks < pairs {
				got := readText(t, c)
				switch {
				case strings.HasPrefix(got, `["EVENT","all",`):
					events++
				case strings.HasPrefix(got, `["EOSE","all"]`):
					if events != stored {
						t.Fatalf("EOSE after %d of %d stored events", events, stored)
					}
				case strings.HasPrefix(got, `["COUNT",`):
					counts++
				case strings.HasPrefix(got, `["OK",`) && strings.Contains(got, `,true,`):
					oks++
				default:
					t.Fatalf("unexpected %.200s", got)
				}
			}
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			if got := seen.Load(); got != pairs {
				t.Fatalf("the relay was handed %d of %d EVENTs in all", got, pairs)
			}
		})
	}
}

// A client that reads whatever it is sent, however slowly, is not cut
// while its backlog stays under the bound, in both modes: at 16 and
// 64 KB/s, behind a REQ result, with a write timeout of two seconds. The
// gate's send buffer toward each is four seconds of its reading, as
// autotuning leaves it for a client that was fast before it slowed. A
// gate that cuts by a write deadline cuts both: a write blocked on a full
// socket resumes only once the kernel has freed a good part of the send
// buffer, which at these rates takes longer than the timeout. (The gate
// sees a client read only as its kernel frees receive buffers, every half
// buffer or so: a timeout must be well above the time a client takes to
// read that, here 8 KiB at 16 KB/s.)
func TestE2ESteadySlowReadersNotCut(t *testing.T) {
	kr := newKhatru(t)
	storeNotes(t, kr, 300, 3<<10)
	for _, mode := range []string{"relay", "proxy"} {
		for _, rate := range []int{16 << 10, 64 << 10} {
			// About fourteen seconds of reading each, all four at once.
			events := 14 * rate / (3 << 10)
			t.Run(fmt.Sprintf("%s/%dKBps", mode, rate>>10), func(t *testing.T) {
				t.Parallel()
				cuts := newCutCounter()
				url := sendBufTarget(t, mode, kr, 4*rate, Options{Policy: policy.Config{Limits: &policy.Limits{}}, WriteTimeout: 2 * time.Second, Observer: cuts.observer()})
				c := dialReadBuffer(t, url, 8<<10)
				if err := c.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, `["REQ","r",{"kinds":[1],"limit":%d}]`, events)); err != nil {
					t.Fatal(err)
				}
				start, read, got := time.Now(), 0, 0
				for {
					_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
					_, b, err := c.ReadMessage()
					if err != nil {
						t.Fatalf("cut after %d of %d events, %d bytes read at %d B/s: %v", got, events, read, rate, err)
					}
					if strings.HasPrefix(string(b), `["EOSE",`) {
						break
					}
					got++
					read += len(b)
					// Keep to the rate on a real socket: sleep until read
					// bytes are due (at most one frame's worth at rate).
					time.Sleep(time.Until(start.Add(time.Duration(read) * time.Second / time.Duration(rate))))
				}
				if got != events || cuts.n.Load() != 0 {
					t.Fatalf("%d of %d events, %d cuts", got, events, cuts.n.Load())
				}
			})
		}
	}
}

// A client that reads nothing is cut once its backlog passes the queue
// bound, in both modes, however long the write timeout: the cut is by
// bytes.
func TestE2ENeverReaderCutByBytes(t *testing.T) {
	kr := newKhatru(t)
	storeNotes(t, kr, 500, 2<<10)
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			cuts := newCutCounter()
			url := sendBufTarget(t, mode, kr, 16<<10, Options{Policy: policy.Config{Limits: &policy.Limits{}}, QueueBytes: 256 << 10, WriteTimeout: noWriteDeadline, Observer: cuts.observer()})
			c := dialReadBuffer(t, url, 16<<10)
			if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","all",{"kinds":[1],"limit":500}]`)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-cuts.cut:
			case <-time.After(30 * time.Second):
				t.Fatal("a client that reads nothing behind 1 MB was not cut")
			}
			// What it reads now ends before the EOSE: in a 1008 close when
			// the socket was between frames, else in the TCP close (a
			// close frame may not go inside a frame the client has part
			// of).
			for {
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, b, err := c.ReadMessage()
				if err != nil {
					if !websocket.IsCloseError(err, websocket.ClosePolicyViolation, websocket.CloseAbnormalClosure) {
						t.Fatalf("after the cut: %v, want the connection closed", err)
					}
					break
				}
				if strings.HasPrefix(string(b), `["EOSE",`) {
					t.Fatal("the cut client got its EOSE")
				}
			}
			honest(t, url)
		})
	}
}

// A client that goes away while the gate is writing its backlog leaves
// nothing behind, in either mode: the flush, the relay's connection and
// their buffers go with it.
func TestE2EGoneMidWriteLeavesNothing(t *testing.T) {
	kr := newKhatru(t)
	storeNotes(t, kr, 500, 2<<10)
	// The test store leaves khatru's query goroutine waiting forever when
	// a query's context ends mid-answer (it returns without closing its
	// channel); its queries run to the end here, so that what is counted
	// is the gate's.
	for i, q := range kr.QueryEvents {
		kr.QueryEvents[i] = func(_ context.Context, f nostr.Filter) (chan *nostr.Event, error) {
			return q(context.Background(), f)
		}
	}
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			url := sendBufTarget(t, mode, kr, 16<<10, Options{Policy: policy.Config{Limits: &policy.Limits{}}, WriteTimeout: noWriteDeadline})
			base := runtime.NumGoroutine()
			for range 20 {
				c := dialReadBuffer(t, url, 16<<10)
				if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","all",{"kinds":[1],"limit":500}]`)); err != nil {
					t.Fatal(err)
				}
				// The first event read: the relay is answering, and the
				// rest waits for the client.
				if got := readText(t, c); !strings.HasPrefix(got, `["EVENT","all",`) {
					t.Fatalf("first answer %.100s", got)
				}
				_ = c.UnderlyingConn().Close()
			}
			settle(t, base)
		})
	}
}

// A client that sends nothing and answers no ping is closed after two
// ping intervals: a half-open connection is found by the gate's pings.
// (In relay mode the relay keeps the client's socket alive or not itself:
// khatru pings and drops a client that answers none.)
func TestE2EHalfOpenClientFoundByPings(t *testing.T) {
	var open atomic.Int64
	obs := &policy.Observer{Open: func(d int) { open.Add(int64(d)) }}
	url := hostileTarget(t, "proxy", newKhatru(t), Options{Policy: policy.Config{Limits: &policy.Limits{}}, PingInterval: 100 * time.Millisecond, Observer: obs})
	dialRaw(t, url) // never reads: the pings go unanswered
	deadline := time.Now().Add(10 * time.Second)
	for open.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polls, up to 10 s: the gate counts the connection on its own goroutine
	}
	for open.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polls, up to 10 s, for the close two ping intervals of real sockets on
	}
	if open.Load() != 0 {
		t.Fatal("a client answering no ping was not closed")
	}
}

// A client reading steadily behind a backlog is alive, in both modes,
// though the keepalive ping waits behind what the kernel holds for it and
// its pong comes late: its reading (the bytes its socket acknowledges)
// keeps it connected. Here the pong deadline (the gate's two intervals in
// proxy mode, khatru's PongWait in relay mode: 4 s) is shorter than the
// time the client takes to read what the sockets hold before the ping
// (~270 KB at 32 KB/s); a gate that waits for the pong alone drops it.
func TestE2ESlowReaderOutlivesItsPongs(t *testing.T) {
	kr := newKhatru(t)
	kr.PingPeriod, kr.PongWait = 2*time.Second, 4*time.Second
	storeNotes(t, kr, 150, 3<<10)
	const rate = 32 << 10
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			cuts := newCutCounter()
			url := sendBufTarget(t, mode, kr, 256<<10, Options{Policy: policy.Config{Limits: &policy.Limits{}},
				WriteTimeout: time.Second, PingInterval: 2 * time.Second, Observer: cuts.observer()})
			c := dialReadBuffer(t, url, 8<<10)
			if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","r",{"kinds":[1],"limit":150}]`)); err != nil {
				t.Fatal(err)
			}
			start, read, got := time.Now(), 0, 0
			for {
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, b, err := c.ReadMessage()
				if err != nil {
					t.Fatalf("dropped after %d of 150 events, %d bytes read at %d B/s: %v", got, read, rate, err)
				}
				if strings.HasPrefix(string(b), `["EOSE",`) {
					break
				}
				got++
				read += len(b)
				time.Sleep(time.Until(start.Add(time.Duration(read) * time.Second / rate))) // keeps to the rate
			}
			if got != 150 || cuts.n.Load() != 0 {
				t.Fatalf("%d of 150 events, %d cuts", got, cuts.n.Load())
			}
			// Still connected, not drained on its way out: it is answered.
			if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","after",{"kinds":[1],"limit":1}]`)); err != nil {
				t.Fatal(err)
			}
			if got := readText(t, c); !strings.HasPrefix(got, `["EVENT","after",`) {
				t.Fatalf("after the result: %.100s", got)
			}
		})
	}
}

// A client that stops reading behind a backlog smaller than the queue's
// bound, with no write timeout to cut it, is still closed by the
// keepalive: once its receive buffer is full it acknowledges nothing, so
// what keeps a slow reader alive does not keep it.
func TestE2EStoppedReaderClosedByKeepalive(t *testing.T) {
	kr := newKhatru(t)
	kr.PingPeriod, kr.PongWait = 200*time.Millisecond, 400*time.Millisecond
	storeNotes(t, kr, 100, 3<<10)
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			var open atomic.Int64
			obs := &policy.Observer{Open: func(d int) { open.Add(int64(d)) }}
			url := sendBufTarget(t, mode, kr, 16<<10, Options{Policy: policy.Config{Limits: &policy.Limits{}},
				QueueBytes: 64 << 20, WriteTimeout: noWriteDeadline, PingInterval: 200 * time.Millisecond, Observer: obs})
			c := dialReadBuffer(t, url, 8<<10)
			if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","r",{"kinds":[1],"limit":100}]`)); err != nil {
				t.Fatal(err)
			}
			if got := readText(t, c); !strings.HasPrefix(got, `["EVENT","r",`) {
				t.Fatalf("first answer %.100s", got)
			}
			// Reads nothing more: ~300 KB wait for it.
			deadline := time.Now().Add(20 * time.Second)
			for open.Load() != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond) // polls, up to 20 s, for the keepalive's close
			}
			if open.Load() != 0 {
				t.Fatal("a client that stopped reading behind a backlog was not closed")
			}
		})
	}
}
