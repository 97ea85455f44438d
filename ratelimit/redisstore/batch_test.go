package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// TestBatchOneCallAgreesWithMemory: a batch of decisions of several clients
// and limit lists, some of one client and type twice or more, is decided in
// ONE script call (a batch of fewer than minCall, in a lean call each, in
// one pipeline), and every decision equals the memory store deciding the
// same sequence one by one at the same instant — so a later decision of a
// batch sees an earlier one's write, and each limit list reaches its own
// windows.
func TestBatchOneCallAgreesWithMemory(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		_, c := realRedis(t)
		testBatchOneCall(t, c, true)
	})
}

func testBatchOneCall(t *testing.T, c *redis.Client, countCalls bool) {
	ctx := context.Background()
	s := newStore(t, c, slow)
	b := &batcher{client: c, shared: true, max: 64} // no workers: exec is called directly
	want := memory()
	lists := []*ratelimit.Windows{
		storetest.MustWindows(ratelimit.PerPeriod(3, time.Second), ratelimit.PerPeriod(5, time.Minute)),
		storetest.MustWindows(ratelimit.PerPeriod(2, 500*time.Millisecond)),
		storetest.MustWindows(ratelimit.PerPeriod(4, time.Second), ratelimit.PerPeriod(6, 10*time.Second), ratelimit.PerPeriod(9, time.Hour)),
	}
	r := rand.New(rand.NewPCG(3, 5))
	if err := ewma.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	// A batch of one decision is the lean script's call.
	if err := ewma1.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); countCalls && err != nil {
		t.Fatal(err)
	}
	var sc batchScratch
	at := storetest.T0
	const rounds = 40
	refused, wantCalls := 0, 0
	for round := range rounds {
		at = at.Add(time.Duration(r.IntN(900)) * time.Millisecond)
		n := 1 + r.IntN(16)
		if n < minCall {
			wantCalls += n // a lean call each (see minCall)
		} else {
			wantCalls++
		}
		calls := make([]*call, n)
		keys := make([]string, n)
		limits := make([]*ratelimit.Windows, n)
		for i := range calls {
			// Few clients, so that most batches decide one key several
			// times; a key keeps one limit list (its client's).
			client := r.IntN(4)
			keys[i] = "{c" + strconv.Itoa(client) + "}:message:EVENT"
			limits[i] = lists[client%len(lists)]
			calls[i] = &call{req: s.request(keys[i], limits[i], at), res: make(chan callResult, 1)}
			calls[i].req.scores = make([]float64, limits[i].Len())
		}
		b.exec(time.Now().Add(slow.Timeout), 0, calls, &sc)
		for i, cl := range calls {
			res := <-cl.res
			got, err := res.d, res.err
			if err != nil {
				t.Fatalf("round %d decision %d (%s): %v", round, i, keys[i], err)
			}
			gs := cl.req.scores
			w, ws, err := want(ctx, keys[i], limits[i], at)
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != w.Allowed || got.Wait != w.Wait || len(gs) != len(ws) {
				t.Fatalf("round %d decision %d (%s): got %+v %v, memory %+v %v", round, i, keys[i], got, gs, w, ws)
			}
			for j := range ws {
				if !storetest.Close(gs[j], ws[j]) {
					t.Fatalf("round %d decision %d (%s) window %d: score %v, memory %v", round, i, keys[i], j, gs[j], ws[j])
				}
			}
			if !got.Allowed {
				refused++
			}
		}
	}
	if refused == 0 || refused > rounds*8 {
		t.Errorf("%d refusals: the sequence does not exercise both outcomes", refused)
	}
	if !countCalls {
		return
	}
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, stat, _ := strings.Cut(info, "cmdstat_evalsha:calls=")
	calls, _, _ := strings.Cut(stat, ",")
	if n, _ := strconv.Atoi(calls); n != wantCalls || strings.Contains(info, "cmdstat_eval:") {
		t.Errorf("%s EVALSHA for %d batches (commandstats %q), want %d: one call per batch of %d or more, one per decision in smaller ones", calls, rounds, info, wantCalls, minCall)
	}
}

// TestBatchRefusalStaysWithItsDecision: in one script call, a decision
// whose stored value is corrupt gets the script's refusal (an error wrapping
// errBadReply that does not count against Redis); the other decisions of
// the call are decided and written as usual.
func TestBatchRefusalStaysWithItsDecision(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    func(t *testing.T) *redis.Client
	}{
		{"redis", func(t *testing.T) *redis.Client { _, c := realRedis(t); return c }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c(t)
			ctx := context.Background()
			s := newStore(t, c, slow)
			b := &batcher{client: c, shared: true, max: 8}
			limits := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second))
			if err := c.Set(ctx, defaultPrefix+"{bad}:message:EVENT"+keySuffix(limits), "garbage", 0).Err(); err != nil {
				t.Fatal(err)
			}
			keys := []string{"{ok1}:message:EVENT", "{bad}:message:EVENT", "{ok2}:message:EVENT"}
			calls := make([]*call, len(keys))
			for i, k := range keys {
				calls[i] = &call{req: s.request(k, limits, storetest.T0), res: make(chan callResult, 1)}
				calls[i].req.scores = make([]float64, limits.Len())
			}
			b.exec(time.Now().Add(slow.Timeout), 0, calls, &batchScratch{})
			for i, cl := range calls {
				res := <-cl.res
				d, err := res.d, res.err
				if i == 1 {
					if !errors.Is(err, errBadReply) || !errors.Is(err, ratelimit.ErrUnavailable) || !IsPerKey(err) || !strings.Contains(err.Error(), "malformed value") {
						t.Errorf("corrupt key: %+v %v, want a per-key refusal", d, err)
					}
					continue
				}
				if sc := cl.req.scores; err != nil || !d.Allowed || sc[0] != 1 {
					t.Errorf("%s beside a corrupt key: %+v %v %v, want admitted with score 1", keys[i], d, sc, err)
				}
				v, err := c.Get(ctx, defaultPrefix+keys[i]+keySuffix(limits)).Result()
				if _, sc, ok := storedScores(v, 1); err != nil || !ok || sc[0] != 1 {
					t.Errorf("%s beside a corrupt key stored %q %v", keys[i], v, err)
				}
			}
		})
	}
}

// TestBatchStraightOutUpToTwiceFlight: with nothing queued, decisions go
// straight out alone up to twice flight round trips at once (at 4 callers
// and 2 in flight, queueing half of them cost more than it saved); the next
// one queues, and the first of those round trips to finish starts its
// batch at once, although more than flight are still in flight; from the
// first that queued until nothing is in flight, decisions go straight out
// only below flight.
func TestBatchStraightOutUpToTwiceFlight(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, Options{Timeout: slow.Timeout})
	limits := storetest.MustWindows(ratelimit.PerPeriod(1e9, time.Second))
	// Patience an hour: only a finished round trip can start a batch.
	b := newBatcher(c, true, 32, 2, time.Hour, nil)
	t.Cleanup(b.close)
	newCall := func(i int) *call {
		req := s.request("{twice-"+strconv.Itoa(i)+"}:message:EVENT", limits, storetest.T0)
		return &call{req: req, asked: time.Now(), deadline: time.Now().Add(slow.Timeout)}
	}
	state := func() (inflight, leaders, live int) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.inflight, b.leaders, b.live
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !ok(); { // a liveness bound, not a timing assertion
			if time.Now().After(deadline) {
				in, le, li := state()
				t.Fatalf("%s: never (inflight %d, leaders %d, queued %d)", what, in, le, li)
			}
			runtime.Gosched()
		}
	}

	release := make(chan struct{})
	var entered atomic.Int64
	held := func() (ratelimit.Decision, error) {
		entered.Add(1)
		<-release
		return ratelimit.Decision{Allowed: true}, nil
	}
	notDirect := func() (ratelimit.Decision, error) {
		t.Error("went straight out while a round trip of its own would pass the cap")
		return ratelimit.Decision{}, errors.New("not direct")
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.do(context.Background(), newCall(i), held); err != nil {
				t.Error(err)
			}
		}()
	}
	waitFor("4 decisions straight out at once with flight 2", func() bool { return entered.Load() == 4 })
	queued := make(chan error, 2)
	for i := 4; i < 6; i++ {
		go func() {
			_, err := b.do(context.Background(), newCall(i), notDirect)
			queued <- err
		}()
	}
	waitFor("2 more queued", func() bool { _, _, li := state(); return li == 2 })
	b.mu.Lock()
	queuedCap := b.directCapLocked()
	b.mu.Unlock()
	if queuedCap != b.flight {
		t.Errorf("cap once a decision queued: %d, want flight %d", queuedCap, b.flight)
	}

	// One of the four finishes: with no batch in flight, its slot goes to
	// the queue at once, though 3 are still in flight (more than flight).
	release <- struct{}{}
	for range 2 {
		select {
		case err := <-queued:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Minute): // a liveness bound, not a timing assertion
			close(release)
			t.Fatal("the queued decisions waited for more round trips to finish")
		}
	}
	if got := b.pipelines.Load(); got != 1 || b.calls.Load() != 2 {
		t.Errorf("%d batches carrying %d decisions, want the 2 queued in 1", got, b.calls.Load())
	}
	if in, _, _ := state(); in != 3 {
		t.Errorf("%d round trips in flight after the batch, want the 3 held", in)
	}

	// While round trips are in flight after a batch, the cap stays flight.
	b.mu.Lock()
	capped := b.directCapLocked()
	b.mu.Unlock()
	if capped != b.flight {
		t.Errorf("cap with 3 in flight after a batch: %d, want flight %d", capped, b.flight)
	}
	close(release)
	wg.Wait()
	b.mu.Lock()
	idleCap := b.directCapLocked()
	b.mu.Unlock()
	if idleCap != b.directFlight {
		t.Errorf("cap with nothing queued or in flight: %d, want %d", idleCap, b.directFlight)
	}
	if got := b.direct.Load(); got != 4 {
		t.Errorf("%d decisions went straight out, want 4", got)
	}
}
