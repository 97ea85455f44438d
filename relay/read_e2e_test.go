//go:build !race

package relay

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fiatjaf/khatru"
	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
)

// readEventBytes is the content of each stored note: with its envelope a
// message of about 4.3 KiB, so a scrape of 500 returns about 2 MiB.
const readEventBytes = 4 << 10

// storeBigNotes stores n notes of readEventBytes by one author directly in
// kr and returns the author's pubkey.
func storeBigNotes(t *testing.T, kr *khatru.Relay, n int) string {
	t.Helper()
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	content := strings.Repeat("x", readEventBytes)
	for i := range n {
		ev := nostr.Event{Kind: 1, CreatedAt: nostr.Timestamp(1_700_000_000 + i), Tags: nostr.Tags{}, Content: content}
		if err := ev.Sign(sk); err != nil {
			t.Fatal(err)
		}
		if _, err := kr.AddEvent(context.Background(), &ev); err != nil {
			t.Fatal(err)
		}
	}
	return pk
}

// TestE2EReadBudgetScraper: a scraper repeating {"kinds":[1],"limit":500}
// on 20 connections across 3 gates sharing one Redis (two Wrap, one
// Proxy) receives at most its read budget plus the stated overshoot
// (readmeter.go: holdBytes per gate, whatever the connections), which is
// within a tenth of the budget; a timeline client alongside is never
// refused; once spent, the scraper's REQs are answered by the gates and
// never reach the relay. The clock is frozen, so the allowance is the
// burst, exactly.
func TestE2EReadBudgetScraper(t *testing.T) {
	srv := redistest.Start(t)
	clk := nostrtest.NewClock()
	const budget = 16 << 20
	cfg := readPolicy([]ratelimit.Limit{ratelimit.PerPeriod(budget, time.Minute)})
	var filters, events atomic.Int64
	kr := badgerKhatru(t, &filters, &events)
	author := storeBigNotes(t, kr, 500)
	var settled, settles atomic.Int64
	obs := &policy.Observer{Sent: func(_ string, n, _ int64) { settled.Add(n); settles.Add(1) }}
	var urls []string
	var lims []*ratelimit.Limiter
	for i := range 3 {
		lim := redisLimiter(t, srv.URL(), clk)
		lims = append(lims, lim)
		g := newGate(t, Options{Limiter: lim, Observer: obs, Policy: cfg})
		if i < 2 {
			urls = append(urls, serve(t, g.Wrap(kr)))
			continue
		}
		h, err := g.Proxy(serve(t, kr))
		if err != nil {
			t.Fatal(err)
		}
		urls = append(urls, serve(t, h))
	}

	const conns = 20
	var received, unavailable atomic.Int64
	var wg sync.WaitGroup
	scrapers := make([]*websocket.Conn, conns)
	for i := range conns {
		scrapers[i] = dialAs(t, urls[i%3], "198.51.100.7")
	}
	for i, c := range scrapers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				got, closed := readAnswer(t, c, fmt.Sprintf("s%d-%d", i, n), `{"kinds":[1],"limit":500}`)
				received.Add(int64(got))
				if closed == scan.ReasonUnavailable {
					// A charge that did not decide in time (a loaded
					// machine): the next REQ finds it decided.
					unavailable.Add(1)
					continue
				}
				if closed != "" {
					if !strings.HasPrefix(closed, readSpent) {
						t.Errorf("scraper %d closed: %q", i, closed)
					}
					return
				}
				if n > 100 {
					t.Errorf("scraper %d never refused", i)
					return
				}
			}
		}()
	}
	timeline := dialAs(t, urls[0], "203.0.113.9")
	refusals := 0
	for n := range 20 {
		_, closed := readAnswer(t, timeline, fmt.Sprintf("t%d", n), `{"authors":["`+author+`"],"kinds":[1],"limit":20}`)
		if closed != "" {
			refusals++
			t.Errorf("timeline REQ %d closed: %q", n, closed)
		}
	}
	wg.Wait()

	// The stated bound: per gate, holdBytes owed at most when a charge is
	// refused (its messages are shorter than holdBytes - settleBytes), the
	// same for 1 connection or 20; and that within a tenth of the budget.
	overshoot := 3 * int64(holdBytes)
	if overshoot > budget/10 {
		t.Errorf("stated overshoot %d (3 gates x holdBytes) is more than a tenth of the budget %d", overshoot, budget)
	}
	got := received.Load()
	t.Logf("scraper received %d bytes (%.2f MiB) on %d connections across 3 gates; read budget %d (%.0f MiB), stated overshoot %d (%.2f MiB): %.3f of the budget, %.3f of budget+overshoot; %d subscriptions closed as unavailable; timeline refusals %d",
		got, float64(got)/(1<<20), conns, budget, float64(budget)/(1<<20), overshoot, float64(overshoot)/(1<<20), float64(got)/float64(budget), float64(got)/float64(budget+overshoot), unavailable.Load(), refusals)
	var calls uint64
	for _, lim := range lims {
		calls += lim.Stats().StoreCalls
	}
	t.Logf("store calls: %d in all on 3 gates (REQs and reads), of which %d admitted read charges settling %d bytes: %.1f read charges per MiB settled",
		calls, settles.Load(), settled.Load(), float64(settles.Load())/(float64(settled.Load())/(1<<20)))
	if got > budget+overshoot {
		t.Errorf("scraper received %d bytes, budget %d + overshoot %d", got, budget, overshoot)
	}
	if got < budget/2 {
		t.Errorf("scraper received %d bytes of a budget of %d: the meter refuses too early", got, budget)
	}

	// Spent: every further REQ is answered by its gate, with the wait,
	// and none reaches the relay.
	before := filters.Load()
	for i, c := range scrapers {
		_, closed := readAnswer(t, c, fmt.Sprintf("again%d", i), `{"kinds":[1],"limit":500}`)
		if closed == scan.ReasonUnavailable {
			continue // a charge under way; answered by the gate all the same
		}
		if !strings.HasPrefix(closed, readSpent) {
			t.Errorf("spent scraper %d: REQ answered %q", i, closed)
		}
	}
	if after := filters.Load(); after != before {
		t.Errorf("%d filters of a spent client reached the relay", after-before)
	}
}

// TestE2EReadBudgetRetryHint: the wait told to a spent client is true:
// a REQ one second before it is refused (and not forwarded), one at it is
// forwarded and answered. Wrap and Proxy alike, on the memory store.
func TestE2EReadBudgetRetryHint(t *testing.T) {
	for _, mode := range []string{"wrap", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			clk := nostrtest.NewClock()
			lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), clk.Now)
			var filters, events atomic.Int64
			kr := badgerKhatru(t, &filters, &events)
			storeBigNotes(t, kr, 500)
			g := newGate(t, Options{Limiter: lim, Policy: readPolicy([]ratelimit.Limit{ratelimit.PerPeriod(4<<20, time.Minute)})})
			url := serveMode(t, g, mode, kr)
			c := dialAs(t, url, "198.51.100.8")
			var closed string
			for n := 0; closed == "" && n < 20; n++ {
				_, closed = readAnswer(t, c, fmt.Sprintf("s%d", n), `{"kinds":[1],"limit":500}`)
			}
			if !strings.HasPrefix(closed, readSpent) {
				t.Fatalf("never refused: %q", closed)
			}
			wait := retryIn(t, closed)
			clk.Advance(wait - time.Second)
			before := filters.Load()
			if _, closed := readAnswer(t, c, "early", `{"ids":["`+strings.Repeat("0", 64)+`"]}`); !strings.HasPrefix(closed, readSpent) {
				t.Fatalf("one second before the hint (%v): %q, want refused", wait, closed)
			}
			if filters.Load() != before {
				t.Fatal("a refused REQ reached the relay")
			}
			clk.Advance(time.Second)
			if _, closed := readAnswer(t, c, "ontime", `{"ids":["`+strings.Repeat("0", 64)+`"]}`); closed != "" {
				t.Fatalf("at the hint (%v): %q, want EOSE", wait, closed)
			}
			if filters.Load() != before+1 {
				t.Fatal("the REQ at the hint did not reach the relay")
			}
		})
	}
}

// readCalls is a Store that counts the decisions on read keys.
type readCalls struct {
	ratelimit.Store
	n atomic.Int64
}

func (s *readCalls) Decide(ctx context.Context, key string, ws *ratelimit.Windows, now time.Time) (ratelimit.Decision, error) {
	if strings.HasSuffix(key, ":read") {
		s.n.Add(1)
	}
	return s.Store.Decide(ctx, key, ws, now)
}

// TestE2EReadStoreCalls: what the relay sends is settled in one store call
// per 64 KiB or query answered, never one per event, and every byte and
// event of it is reported (Observer.Sent).
func TestE2EReadStoreCalls(t *testing.T) {
	st := &readCalls{Store: ratelimit.NewMemoryStore(0)}
	lim := ratelimit.NewLimiter(st, nil)
	var filters, events atomic.Int64
	kr := badgerKhatru(t, &filters, &events)
	author := storeBigNotes(t, kr, 500)
	var settled, settles, sent atomic.Int64
	obs := &policy.Observer{Sent: func(_ string, n, evs int64) { settled.Add(n); settles.Add(1); sent.Add(evs) }}
	g := newGate(t, Options{Limiter: lim, Observer: obs, Policy: readPolicy([]ratelimit.Limit{ratelimit.PerPeriod(1<<40, time.Minute)})})
	c := dialAs(t, serve(t, g.Wrap(kr)), "198.51.100.9")
	var got int
	const reqs = 20
	for n := range reqs {
		b, closed := readAnswer(t, c, fmt.Sprintf("a%d", n), `{"authors":["`+author+`"],"limit":100}`)
		if closed != "" {
			t.Fatalf("closed: %q", closed)
		}
		got += b
	}
	// Settled off the relay's path: the last charge may still be under way.
	deadline := time.Now().Add(5 * time.Second)
	for settled.Load() < int64(got-eoseBytes) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	calls := st.n.Load()
	mib := float64(got) / (1 << 20)
	t.Logf("%d bytes (%.1f MiB) of events in %d REQs: %d store calls on the read key, %.1f per MiB (settled %d bytes in %d)", got, mib, reqs, calls, float64(calls)/mib, settled.Load(), settles.Load())
	if most := int64(got/settleBytes) + reqs + 1; calls > most {
		t.Errorf("%d store calls for %d bytes and %d answers, want at most %d", calls, got, reqs, most)
	}
	if calls == 0 {
		t.Error("nothing settled")
	}
	if sent.Load() != reqs*100 {
		t.Errorf("%d events reported sent, want %d", sent.Load(), reqs*100)
	}
}

// A subscription the read budget closes for a client that then sends
// nothing is closed at the relay too, at once: a publish no longer finds
// its listener there (khatru answers an ephemeral event no listener
// matched "mute: no one was listening for this"). Before, the relay kept
// the listener until the client's next frame, which a silent client never
// sends, and matched and wrote every publish to it for the gate to drop.
func TestE2EClosedSubscriptionLeavesTheRelay(t *testing.T) {
	for _, mode := range []string{"wrap", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), time.Now)
			var filters, events atomic.Int64
			kr := badgerKhatru(t, &filters, &events)
			storeBigNotes(t, kr, 500) // about 2 MiB
			g := newGate(t, Options{Limiter: lim, Policy: readPolicy([]ratelimit.Limit{ratelimit.PerPeriod(1<<20, time.Hour)})})
			url := serveMode(t, g, mode, kr)
			c := dialAs(t, url, "198.51.100.9")
			pub := dialAs(t, url, "198.51.100.10")
			// The relay's OK to an ephemeral event (pub reads nothing else).
			publish := func() string {
				frame, _ := signedFrame(t, 20001, nostr.Tags{})
				return send(t, pub, []byte(frame))
			}
			// The relay counts the listeners an ephemeral event reached: one
			// while c holds a subscription to the kind, none after c's own
			// CLOSE.
			if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","live",{"kinds":[20001]}]`)); err != nil {
				t.Fatal(err)
			}
			if _, data, err := c.ReadMessage(); err != nil || strings.TrimSpace(string(data)) != `["EOSE","live"]` {
				t.Fatalf("REQ live answered %s, %v", data, err)
			}
			if ok := publish(); !strings.Contains(ok, `,"broadcasted to 1 listeners"]`) {
				t.Fatalf("a publish with c subscribed was answered %q", ok)
			}
			if err := c.WriteMessage(websocket.TextMessage, []byte(`["CLOSE","live"]`)); err != nil {
				t.Fatal(err)
			}
			// The stored notes, past the budget, and live ephemeral events.
			if _, closed := readAnswer(t, c, "s", `{"kinds":[1],"limit":500},{"kinds":[20001]}`); !strings.HasPrefix(closed, readSpent) {
				t.Fatalf("the subscription ended %q, want the read budget's CLOSED", closed)
			}
			// c sends nothing more.
			var reason string
			for try := range 100 {
				reason = publish()
				if strings.Contains(reason, `,"mute: `) {
					t.Logf("no listener left after %d publishes", try+1)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Fatalf("after 5 s the relay still has the closed subscription's listener: the last publish was %q", reason)
		})
	}
}
