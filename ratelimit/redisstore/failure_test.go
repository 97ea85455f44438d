package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// hangGuard is how long any single decision may take before the test calls
// it a hang. It is not a speed assertion: the deadline is 100 ms, and the
// guard only has to tell "bounded" from "stuck" on a loaded machine.
const hangGuard = 3 * time.Second

// countingClient returns a client for addr that counts its dials.
func countingClient(tb testing.TB, addr string, dials *atomic.Int64) *redis.Client {
	tb.Helper()
	d := &net.Dialer{}
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return d.DialContext(ctx, network, addr)
		},
	})
	return c
}

// settleGoroutines waits until the goroutine count is back to at most base
// and fails the test if it never is.
func settleGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines: %d before, %d after\n%s", base, n, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// decideTimed runs one decision and fails the test if it hangs.
func decideTimed(t *testing.T, s ratelimit.Store, key string, limits *ratelimit.Windows) (ratelimit.Decision, error) {
	t.Helper()
	start := time.Now()
	d, err := s.Decide(context.Background(), key, limits, time.Time{})
	if el := time.Since(start); el > hangGuard {
		t.Errorf("a decision took %v (hang guard %v)", el, hangGuard)
	}
	return d, err
}

// TestKilledAndRestarted: with Redis killed mid-run every decision fails
// closed with ErrUnavailable and none hangs; the breaker bounds the dials;
// after a restart the same Store and Limiter decide again; nothing leaks.
func TestKilledAndRestarted(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testKilledAndRestarted(t, false) })
	t.Run("batch", func(t *testing.T) { testKilledAndRestarted(t, true) })
}

func testKilledAndRestarted(t *testing.T, batch bool) {
	srv := redistest.Start(t)
	base := runtime.NumGoroutine()
	var dials atomic.Int64
	c := countingClient(t, srv.Addr(), &dials)
	var observed, observedErr atomic.Int64
	s := newStore(t, c, Options{
		Batch:   batchSize(batch),
		breaker: breakerOptions{Failures: 3, CoolDown: 200 * time.Millisecond},
		Observe: func(d time.Duration, err error) {
			observed.Add(1)
			if err != nil {
				observedErr.Add(1)
			}
		},
	})
	lim := ratelimit.NewLimiter(s, nil)
	limits := storetest.MustWindows(ratelimit.PerPeriod(1000, time.Second), ratelimit.PerPeriod(100000, time.Minute))

	// Healthy traffic from several goroutines, then the kill lands mid-run.
	var wg sync.WaitGroup
	var ok, failed, wrongErr atomic.Int64
	stop := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("{kill-%d}:message:EVENT", g)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := decideTimed(t, s, key, limits)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ratelimit.ErrUnavailable):
					failed.Add(1)
				default:
					wrongErr.Add(1)
				}
			}
		}()
	}
	for ok.Load() < 200 {
		time.Sleep(time.Millisecond)
	}
	srv.Kill()
	// Let the goroutines run against the dead server for a while.
	for failed.Load() < 2000 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if wrongErr.Load() != 0 {
		t.Errorf("%d errors not wrapping ErrUnavailable", wrongErr.Load())
	}

	// Dead: every decision fails closed, quickly, as unavailable — never as
	// a rate limit. The Limiter passes the error through.
	dialsBefore := dials.Load()
	for i := range 200 {
		d, err := decideTimed(t, s, "{kill-x}:message:EVENT", limits)
		if !errors.Is(err, ratelimit.ErrUnavailable) || d.Allowed {
			t.Fatalf("#%d after kill: %+v %v", i, d, err)
		}
		if _, err := lim.Allow(context.Background(), "{kill-y}:message:EVENT", limits); !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Fatalf("Limiter #%d after kill: %v", i, err)
		}
	}
	// 400 decisions cost a handful of dials, not 400: the breaker lets one
	// probe per cool-down through (each probe may dial 1+MaxRetries times).
	if n := dials.Load() - dialsBefore; n > 40 {
		t.Errorf("%d dials for 400 decisions against a dead Redis", n)
	}
	if st := s.breakerNow(); st == breakerClosed {
		t.Errorf("breaker %v with Redis dead", st)
	}

	// Restarted: the same Store and Limiter heal by themselves.
	srv.Restart()
	healed := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := decideTimed(t, s, "{kill-z}:message:EVENT", limits); err == nil {
			healed = true
			break
		}
	}
	if !healed {
		t.Fatal("store did not heal after the restart")
	}
	// The restarted server is empty: the script must have been reloaded
	// (NOSCRIPT → EVAL), and the Limiter decides through the same store.
	if d, err := lim.Allow(context.Background(), "{kill-y}:message:EVENT", limits); err != nil || !d.Allowed {
		t.Fatalf("Limiter after restart: %+v %v", d, err)
	}
	if st := s.breakerNow(); st != breakerClosed {
		t.Errorf("breaker %v after healing", st)
	}
	if observed.Load() == 0 || observedErr.Load() == 0 {
		t.Errorf("Observe saw %d calls, %d errors", observed.Load(), observedErr.Load())
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(context.Background(), "{kill-z}:message:EVENT", limits, time.Time{}); !errors.Is(err, errClosed) || !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Errorf("after Close: %v, want errClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	settleGoroutines(t, base)
}

// TestHungRedis: a Redis that accepts but never answers (SIGSTOP) costs each
// decision its deadline, not the client's 5 s ReadTimeout, and no more.
func TestHungRedis(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testHungRedis(t, false) })
	t.Run("batch", func(t *testing.T) { testHungRedis(t, true) })
}

func testHungRedis(t *testing.T, batch bool) {
	_, c := realRedis(t)
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	if pid <= 0 {
		t.Fatalf("no process_id in INFO server")
	}
	s := newStore(t, c, Options{Batch: batchSize(batch), Timeout: 100 * time.Millisecond, breaker: breakerOptions{Failures: -1}})
	limits := storetest.MustWindows(ratelimit.PerPeriod(100, time.Second))
	if _, err := decideTimed(t, s, "{hang}:message:EVENT", limits); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(cont)
	for i := range 5 {
		start := time.Now()
		_, err := s.Decide(context.Background(), "{hang}:message:EVENT", limits, time.Time{})
		el := time.Since(start)
		if !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Fatalf("#%d with Redis stopped: %v", i, err)
		}
		if el > hangGuard {
			t.Fatalf("#%d took %v with a 100ms deadline", i, el)
		}
	}
	// Many at once, more than a batched store queues (its callers wait in
	// line for room, with no timer of their own): each is still bounded.
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := s.Decide(context.Background(), "{hang"+strconv.Itoa(i)+"}:message:EVENT", limits, time.Time{})
			if el := time.Since(start); !errors.Is(err, ratelimit.ErrUnavailable) || el > hangGuard {
				t.Errorf("concurrent #%d with Redis stopped: %v after %v", i, err, el)
			}
		}()
	}
	wg.Wait()
	cont()
	healed := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := decideTimed(t, s, "{hang}:message:EVENT", limits); err == nil {
			healed = true
			break
		}
	}
	if !healed {
		t.Fatal("did not heal after SIGCONT")
	}
}

// TestCallerCancelDoesNotTrip: callers giving up (clients disconnecting)
// fail their own decisions but say nothing about Redis.
func TestCallerCancelDoesNotTrip(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, Options{breaker: breakerOptions{Failures: 2}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 10 {
		if _, err := s.Decide(ctx, "{cancel}:message:EVENT", twoWindows, time.Time{}); !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Fatalf("cancelled: %v", err)
		}
	}
	if st := s.breakerNow(); st != breakerClosed {
		t.Errorf("breaker %v after callers gave up", st)
	}
}

// lossyProxy forwards TCP to a Redis and, when armed, swallows the next
// reply that comes back and drops the connection: the reply was lost after
// Redis executed the command, which is what makes a blind retry charge twice.
type lossyProxy struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	lost   atomic.Int64
	wg     sync.WaitGroup
}

func startLossyProxy(t *testing.T, target string) *lossyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *lossyProxy) serve() {
	defer p.wg.Done()
	for {
		cl, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			cl.Close()
			continue
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(up, cl); up.Close() }()
		go func() {
			defer p.wg.Done()
			defer cl.Close()
			defer up.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := up.Read(buf)
				if n > 0 {
					if p.armed.CompareAndSwap(true, false) {
						p.lost.Add(1)
						return // the reply is lost with the connection
					}
					if _, werr := cl.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// TestLostReplyChargesOnce: Redis admits and charges, the reply is lost,
// go-redis retries the EVALSHA on a new connection — and the request id
// makes the retry return the first reply instead of charging again. The
// same loss without a request id (the script run directly) charges twice,
// so the test can tell the two apart.
func TestLostReplyChargesOnce(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testLostReplyChargesOnce(t, false) })
	t.Run("batch", func(t *testing.T) { testLostReplyChargesOnce(t, true) })
}

func testLostReplyChargesOnce(t *testing.T, batch bool) {
	srv, direct := realRedis(t)
	p := startLossyProxy(t, srv.Addr())
	c := client(t, p.ln.Addr().String()) // go-redis defaults: MaxRetries 3
	s := newStore(t, c, Options{Timeout: slow.Timeout, Batch: batchSize(batch)})
	ctx := context.Background()
	limits := storetest.MustWindows(ratelimit.PerPeriod(100, time.Hour))
	key := "{lost}:message:EVENT"
	// stored is the score in Redis; with an hour's half-life the few ms the
	// test takes decay it by less than 1e-5.
	stored := func() float64 {
		v, _ := direct.Get(ctx, defaultPrefix+key+":3600000"+valueTag).Result()
		_, sc, ok := storedScores(v, 1)
		if !ok {
			t.Fatalf("stored %q", v)
		}
		return sc[0]
	}
	near := func(x, want float64) bool { return x > want-1e-3 && x <= want }

	if d, err := s.Decide(ctx, key, limits, time.Time{}); err != nil || !d.Allowed {
		t.Fatalf("warm-up: %+v %v", d, err)
	}
	p.armed.Store(true)
	d, scores, err := scorer(s)(ctx, key, limits, time.Time{})
	if err != nil || !d.Allowed {
		t.Fatalf("decision whose first reply was lost: %+v %v", d, err)
	}
	if p.lost.Load() != 1 {
		t.Fatalf("proxy lost %d replies, want 1", p.lost.Load())
	}
	if got := stored(); !near(got, 2) || !near(scores[0], 2) {
		t.Errorf("after 2 decisions (one retried): stored score %v, reply %v; want 2 (charged once)", got, scores)
	}

	// The hazard, shown: the same lost reply without a request id.
	keys := []string{defaultPrefix + key + ":3600000" + valueTag}
	// Warm the plain pool first (a batched Store pipelines on a pool of its
	// own), so the lost reply is the script's, not a new connection's HELLO.
	if err := ewma.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	if err := ewma.Run(ctx, c, keys, pack(0, 0, 1, 1, 100, 3600000, 1), "\x01\x00").Err(); err != nil {
		t.Fatalf("raw script: %v", err)
	}
	if got := stored(); !near(got, 4) {
		t.Errorf("without a request id the retried call left score %v; expected it to charge twice (≈4)", got)
	}
}

// TestLostReplyNoRetryChargesOnce: on a client with go-redis retries off
// (max_retries=-1) the store sends no request id (and a decision
// alone as the lean script), so the guard is not there — and not needed: a
// lost reply fails its decision as unavailable and is never resent, so the
// client is charged once for it (an unavailable refusal that was charged:
// see the package doc), never twice.
func TestLostReplyNoRetryChargesOnce(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testLostReplyNoRetry(t, false) })
	t.Run("batch", func(t *testing.T) { testLostReplyNoRetry(t, true) })
}

func testLostReplyNoRetry(t *testing.T, batch bool) {
	srv, direct := realRedis(t)
	p := startLossyProxy(t, srv.Addr())
	u, err := NewClient("redis://" + p.ln.Addr().String() + "/0?max_retries=-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = u.Close() })
	s := newStore(t, u, Options{Timeout: slow.Timeout, Batch: batchSize(batch)})
	if !s.lean {
		t.Fatal("a client without retries: the store is not lean")
	}
	ctx := context.Background()
	limits := storetest.MustWindows(ratelimit.PerPeriod(100, time.Hour))
	key := "{lostlean}:message:EVENT"
	stored := func() string {
		v, _ := direct.Get(ctx, defaultPrefix+key+":3600000"+valueTag).Result()
		return v
	}
	score := func() float64 {
		v := stored()
		_, sc, ok := storedScores(v, 1)
		if !ok {
			t.Fatalf("stored %q", v)
		}
		return sc[0]
	}
	near := func(x, want float64) bool { return x > want-1e-3 && x <= want }
	if d, err := s.Decide(ctx, key, limits, time.Time{}); err != nil || !d.Allowed {
		t.Fatalf("warm-up: %+v %v", d, err)
	}
	if v := stored(); len(v) != 16 {
		t.Fatalf("stored %q: want no request id", v)
	}
	p.armed.Store(true)
	if _, err := s.Decide(ctx, key, limits, time.Time{}); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("decision whose reply was lost: %v, want unavailable (not resent)", err)
	}
	if p.lost.Load() != 1 {
		t.Fatalf("proxy lost %d replies, want 1", p.lost.Load())
	}
	if got := score(); !near(got, 2) {
		t.Errorf("after a lost reply: score %v, want 2 (charged once, never resent)", got)
	}
	d, scores, err := scorer(s)(ctx, key, limits, time.Time{})
	if err != nil || !d.Allowed || !near(scores[0], 3) {
		t.Fatalf("next decision: %+v %v %v, want admitted at score 3", d, scores, err)
	}
}

// batchSize is the Options.Batch of the batched variant of a test.
func batchSize(on bool) int {
	if on {
		return 16
	}
	return 0
}

// TestCallerDeadlineOnHungRedisTrips: a caller whose own deadline is
// shorter than the store's Timeout did not give up on Redis — Redis did
// not answer in time. Counted as "caller gave up", every decision on a
// hung Redis would wait out the caller's deadline and the breaker would
// never open.
func TestCallerDeadlineOnHungRedisTrips(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() { // a Redis that accepts and never answers
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	s := newStore(t, client(t, ln.Addr().String()), Options{Timeout: 5 * time.Second, breaker: breakerOptions{Failures: 2, CoolDown: time.Hour}})
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := s.Decide(ctx, "{hung}:message:EVENT", twoWindows, time.Time{})
		cancel()
		if !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Fatalf("#%d: %v, want ErrUnavailable", i, err)
		}
	}
	if st := s.breakerNow(); st != breakerOpen {
		t.Errorf("breaker %v after 2 calls that Redis never answered, want open", st)
	}
}

// TestBatchCloseStrandsNoCall: a call racing Close either gets its reply
// or errClosed; none is left in the queue after the workers have gone,
// waiting for a reply that never comes (with no deadline, forever).
func TestBatchCloseStrandsNoCall(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, Options{Timeout: slow.Timeout})
	limits := storetest.MustWindows(ratelimit.PerPeriod(1e9, time.Second))
	for round := range 50 {
		b := newBatcher(c, true, 4, 2, time.Millisecond, nil)
		var wg sync.WaitGroup
		done := make(chan struct{})
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					req := s.request("{close}:message:EVENT", limits, storetest.T0)
					cl := &call{req: req, asked: time.Now(), deadline: time.Now().Add(slow.Timeout)}
					_, err := b.do(context.Background(), cl, func() (ratelimit.Decision, error) {
						reply, err := run(context.Background(), c, req)
						return decision(reply, err, req)
					})
					if errors.Is(err, errClosed) {
						return
					}
					if err != nil {
						t.Errorf("round %d: %v", round, err)
						return
					}
				}
			}()
		}
		go func() { wg.Wait(); close(done) }()
		b.close()
		select {
		case <-done:
		case <-time.After(time.Minute): // a liveness bound, not a timing assertion
			t.Fatalf("round %d: a call is still waiting a minute after Close", round)
		}
	}
}
