package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// client returns a go-redis client for addr that follows context deadlines,
// closed when the test ends.
func client(tb testing.TB, addr string) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

func newStore(tb testing.TB, c redis.UniversalClient, opts Options) *Store {
	tb.Helper()
	s, err := New(c, opts)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return s
}

// realRedis starts a redis-server for the test (skipped without one,
// failed under REQUIRE_REDIS=1).
func realRedis(tb testing.TB) (*redistest.Server, *redis.Client) {
	tb.Helper()
	srv := redistest.Start(tb)
	return srv, client(tb, srv.Addr())
}

// slow is for tests of correctness, not of failure: the machine is shared
// and -race is slow, so a call must not fail for being late.
var slow = Options{Timeout: 10 * time.Second}

func TestConformanceRedis(t *testing.T) {
	_, c := realRedis(t)
	storetest.Run(t, func(t *testing.T) storetest.Scorer { return scorer(newStore(t, c, slow)) })
}

func TestConformanceRedisBatch(t *testing.T) {
	_, c := realRedis(t)
	storetest.Run(t, func(t *testing.T) storetest.Scorer {
		s := newStore(t, c, Options{Batch: 8, Timeout: slow.Timeout})
		t.Cleanup(func() { _ = s.Close() })
		return scorer(s)
	})
}

// TestAgreeWithMemory: the memory store and Redis make the same decision,
// with the same wait, on every step of seeded random traffic, and their
// scores agree to the last bit (see storetest.Agree).
func TestAgreeWithMemory(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, slow)
	for seed := uint64(1); seed <= 3; seed++ {
		storetest.Agree(t, memory, scorer(s), seed, 100)
	}
}

func TestWaitIsExactRedis(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, slow)
	for seed := uint64(20); seed < 24; seed++ {
		storetest.WaitIsExact(t, s, seed, 150)
	}
}

// TestRedisTime: the zero instant means Redis TIME, and the script's clock
// is Redis's: a decision with the zero instant is decayed against it.
func TestRedisTime(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, slow)
	ctx := context.Background()
	limits := storetest.MustWindows(ratelimit.PerPeriod(3, time.Hour))
	key := "{time}:message:EVENT"
	for i := range 3 {
		d, err := s.Decide(ctx, key, limits, time.Time{})
		if err != nil || !d.Allowed {
			t.Fatalf("#%d: %+v %v", i, d, err)
		}
	}
	d, err := s.Decide(ctx, key, limits, time.Time{})
	if err != nil || d.Allowed {
		t.Fatalf("4th: %+v %v", d, err)
	}
	// Within a second of the burst the hour-long half-life has barely
	// decayed: the wait is close to 3600000·log2(3/2) ms = 35.1 min.
	if d.Wait < 35*time.Minute || d.Wait > 36*time.Minute {
		t.Errorf("wait %v, want about 35m06s", d.Wait)
	}
	raw, err := c.Get(ctx, defaultPrefix+key+":3600000"+valueTag).Result()
	if err != nil {
		t.Fatal(err)
	}
	tm, _ := c.Time(ctx).Result()
	at, _, ok := storedScores(raw, 1)
	if !ok {
		t.Fatalf("stored %q", raw)
	}
	if diff := tm.UnixMilli() - at; diff < 0 || diff > 5000 {
		t.Errorf("stored instant %d is %d ms from Redis TIME %d", at, diff, tm.UnixMilli())
	}
}

// TestKeysAndTTL checks the key layout and that every written key expires,
// never before the longest wait it could still report.
func TestKeysAndTTL(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, Options{Prefix: "p:", Timeout: slow.Timeout})
	ctx := context.Background()
	limits := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute))
	for range 10 {
		if _, err := s.Decide(ctx, "{203.0.113.7}:message:EVENT", limits, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	refused, err := s.Decide(ctx, "{203.0.113.7}:message:EVENT", limits, time.Time{})
	if err != nil || refused.Allowed {
		t.Fatalf("11th: %+v %v", refused, err)
	}
	// One key holds both windows: its TTL serves the longer-lived of them.
	const key = "p:{203.0.113.7}:message:EVENT:1000:60000" + valueTag
	for i := range limits.Len() {
		l := limits.Limit(i)
		ttl, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 {
			t.Fatalf("%s: PTTL %v, want a positive TTL", key, ttl)
		}
		// The longest wait this key could report: from a full score R.
		longest := time.Duration(float64(l.Period) * log2(l.Rate/(l.Rate-1)))
		if ttl < longest {
			t.Errorf("%s: TTL %v shorter than the longest wait %v", key, ttl, longest)
		}
		if ttl < refused.Wait {
			t.Errorf("%s: TTL %v shorter than the wait just reported %v", key, ttl, refused.Wait)
		}
	}
	// And bounded: at most T·log2(1024·R/min(c,R−c)) plus slack, for the
	// longest-lived window.
	var bound time.Duration
	for i := range limits.Len() {
		l := limits.Limit(i)
		bound = max(bound, time.Duration(float64(l.Period)*(log2(1024*l.Rate)+1)))
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl > bound {
		t.Errorf("%s: TTL %v beyond the bound %v", key, ttl, bound)
	}
	// The key is the only one: both windows, then the last 4 admitted
	// request ids (16 characters each).
	keys, _ := c.Keys(ctx, "p:*").Result()
	if len(keys) != 1 || keys[0] != key {
		t.Errorf("keys %v, want %s only", keys, key)
	}
	v, _ := c.Get(ctx, key).Result()
	if _, _, ok := storedScores(v, 2); !ok || len(v) != 24+4*idLen {
		t.Fatalf("value %q: want an instant, two scores and 4 ids", v)
	}
}

// TestNoScriptHeals: after SCRIPT FLUSH, EVALSHA fails with NOSCRIPT and the
// store falls back to EVAL, which reloads the script.
func TestNoScriptHeals(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testNoScriptHeals(t, slow) })
	t.Run("batch", func(t *testing.T) { testNoScriptHeals(t, Options{Timeout: slow.Timeout, Batch: 4}) })
}

func testNoScriptHeals(t *testing.T, opts Options) {
	_, c := realRedis(t)
	s := newStore(t, c, opts)
	defer s.Close()
	ctx := context.Background()
	limits := storetest.MustWindows(ratelimit.PerPeriod(100, time.Second))
	if _, err := s.Decide(ctx, "{flush}:message:EVENT", limits, storetest.T0); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.ScriptExists(ctx, ewma1.Hash()).Result(); ok[0] {
		t.Fatal("script still cached after SCRIPT FLUSH")
	}
	d, scores, err := scorer(s)(ctx, "{flush}:message:EVENT", limits, storetest.T0)
	if err != nil || !d.Allowed || !storetest.Close(scores[0], 2) {
		t.Fatalf("after SCRIPT FLUSH: %+v %v %v", d, scores, err)
	}
	// A decision alone (as both of these are) is the lean script.
	if ok, _ := c.ScriptExists(ctx, ewma1.Hash()).Result(); !ok[0] {
		t.Error("script not cached again after the EVAL fallback")
	}
}

func TestNewRefusesClientWithoutContextTimeouts(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := New(c, Options{}); !errors.Is(err, errConfig) {
		t.Errorf("client without ContextTimeoutEnabled: err = %v, want errConfig", err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	if _, err := New(cc, Options{}); !errors.Is(err, errConfig) {
		t.Errorf("cluster client without ContextTimeoutEnabled: err = %v, want errConfig", err)
	}
	good := client(t, "127.0.0.1:1")
	for _, p := range []string{"a{b", "x}", "{}"} {
		if _, err := New(good, Options{Prefix: p}); !errors.Is(err, errConfig) {
			t.Errorf("prefix %q: err = %v, want errConfig", p, err)
		}
	}
	if _, err := New(nil, Options{}); !errors.Is(err, errConfig) {
		t.Errorf("nil client: err = %v, want errConfig", err)
	}
	for _, o := range []Options{{Batch: -1}, {Batch: 1, batchWorkers: -1}, {Batch: maxBatch + 1}, {Batch: 1 << 40}, {Batch: 1, batchWorkers: maxBatchWorkers + 1}} {
		if s, err := New(good, o); !errors.Is(err, errConfig) {
			if s != nil {
				_ = s.Close()
			}
			t.Errorf("Batch %d, batchWorkers %d: err = %v, want errConfig", o.Batch, o.batchWorkers, err)
		}
	}
	s, err := New(good, Options{Batch: maxBatch, batchWorkers: maxBatchWorkers})
	if err != nil {
		t.Fatalf("the largest batch: %v", err)
	}
	_ = s.Close()
	if _, err := New(good, Options{breaker: breakerOptions{CoolDown: -1}}); !errors.Is(err, errConfig) {
		t.Errorf("negative cool-down: err = %v, want errConfig", err)
	}
}

// TestAgreeDegenerate: the memory store and Redis report the same exact
// wait for limits where T·log2(S/(R−c)) is far from it (R a few ulps above
// c, 1 ms to ten-year half-lives, costs far from 1).
func TestAgreeDegenerate(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, slow)
	storetest.AgreeDegenerate(t, memory, scorer(s), 1, 200)
}

// TestMalformedStoredValue: a window holding something the script did not
// write (garbage, NaN, infinity, a negative score, a fractional or negative
// instant) is an error wrapping errBadReply — never an admission on a score
// of zero, never a refusal with a wait of decades — and, since Redis did
// answer, it does not open the breaker for every other client.
func TestMalformedStoredValue(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		_, c := realRedis(t)
		testMalformedStoredValue(t, c)
	})
}

func testMalformedStoredValue(t *testing.T, c *redis.Client) {
	ctx := context.Background()
	s := newStore(t, c, Options{Timeout: slow.Timeout, breaker: breakerOptions{Failures: 1}})
	limits := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(100, time.Minute))
	const key = "{bad}:message:EVENT"
	at := storetest.T0.UnixMilli()
	nan, inf := math.NaN(), math.Inf(1)
	full := defaultPrefix + key + ":1000:60000" + valueTag
	for _, v := range []string{"garbage", "", "1 " + itoa(at) + " 1 " + itoa(at), stored(at, []float64{1}),
		stored(at, []float64{nan, 1}), stored(at, []float64{1, inf}), stored(at, []float64{-inf, 1}), stored(at, []float64{1, -1}),
		stored(-5, []float64{1, 1}), string(pack(1.5, 1, 1)), string(pack(nan, 1, 1)), stored(at, []float64{1, 1})[:23]} {
		c.Del(ctx, full)
		c.Set(ctx, full, v, 0)
		d, err := s.Decide(ctx, key, limits, storetest.T0)
		if !errors.Is(err, errBadReply) || !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Errorf("holding %q: %+v %v, want errBadReply", v, d, err)
		}
		if st := s.breakerNow(); st != breakerClosed {
			t.Fatalf("holding %q: breaker %v, want closed", v, st)
		}
	}
	// A seen request id in a corrupt value: still an error.
	ids := []string{full}
	c.Del(ctx, ids...)
	seen := []any{pack(float64(at), 0, 1, 2, 10, 1000, 1, 100, 60000, 1), "\x01\x00", "seen"}
	if err := ewma.Run(ctx, c, ids, seen...).Err(); err != nil {
		t.Fatal(err)
	}
	c.Set(ctx, ids[0], stored(at, []float64{1, nan}, "seen"), 0)
	if v, err := ewma.Run(ctx, c, ids, seen...).Slice(); err != nil || len(v) != 2 || v[0] != int64(-1) {
		t.Errorf("repeat with a corrupt window replied %v %v, want -1", v, err)
	} else if _, err := parseReply(v, limits.Len(), nil); !isScriptRefusal(err) || !errors.Is(err, errBadReply) {
		t.Errorf("repeat with a corrupt window: %v, want a script refusal", err)
	}
}

// TestRequestAllocs: building a decision's command line costs two
// allocations (the request and the one string holding its key and the
// request id) however many windows, and classifying a nil error
// costs none. It was 6 of the 27 allocations per Decide before.
func TestRequestAllocs(t *testing.T) {
	s := newStore(t, client(t, "127.0.0.1:1"), Options{})
	limits := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute), ratelimit.PerPeriod(1000, time.Hour))
	if n := testing.AllocsPerRun(100, func() { s.request("{a}:message:EVENT", limits, time.Time{}) }); n > 2 {
		t.Errorf("request: %v allocations, want at most 2", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = isScriptRefusal(nil) || isCrossSlot(nil) }); n != 0 {
		t.Errorf("classifying a nil error: %v allocations, want 0", n)
	}
	r := s.request("{a}:message:EVENT", limits, storetest.T0)
	want := []string{"evalsha", ewma.Hash(), "1", "sluice:{a}:message:EVENT:1000:60000:3600000" + valueTag,
		string(pack(float64(storetest.T0.UnixMilli()), 0, 1, 3, 10, 1000, 1, 240, 60000, 1, 1000, 3600000, 1)), "\x01\x00", r.id}
	if got := argStrings(command([]*request{r})); !slices.Equal(got, want) {
		t.Errorf("command\n got %q\nwant %q", got, want)
	}
	if len(r.id) != idLen {
		t.Errorf("request id %q is not %d characters", r.id, idLen)
	}
	if n := testing.AllocsPerRun(100, func() { command([]*request{r}) }); n > 2 {
		t.Errorf("command: %v allocations, want at most 2 (the argument slice, the packed arguments)", n)
	}
}

// TestRequestFromWindows: a request's one key is the prefix, the key,
// ":<period_ms>" of each window in order and valueTag, and its command
// packs each window's rate, half-life in ms and cost (the default cost as
// 1) after the packed instant, cutoff, list count and window count.
func TestRequestFromWindows(t *testing.T) {
	s := newStore(t, client(t, "127.0.0.1:1"), Options{Prefix: "p:"})
	t0 := float64(storetest.T0.UnixMilli())
	for _, c := range []struct {
		ws   *ratelimit.Windows
		key  string
		nums []float64
	}{
		{storetest.MustWindows(ratelimit.PerPeriod(5, 1500*time.Millisecond)),
			"p:{k}:message:EVENT:1500:bin", []float64{t0, 0, 1, 1, 5, 1500, 1}},
		{storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute),
			ratelimit.Limit{Rate: 2.5, Period: 90 * time.Minute, Cost: 0.5}, ratelimit.Limit{Rate: 1e4, Period: 24 * time.Hour}),
			"p:{k}:message:EVENT:1000:60000:5400000:86400000:bin",
			[]float64{t0, 0, 1, 4, 10, 1000, 1, 240, 60000, 1, 2.5, 5400000, 0.5, 1e4, 86400000, 1}},
	} {
		r := s.request("{k}:message:EVENT", c.ws, storetest.T0)
		if r.windows != c.ws || len(r.keys) != 1 {
			t.Fatalf("%v: request of %d keys, want 1", c.ws, len(r.keys))
		}
		if r.keys[0] != c.key {
			t.Errorf("%v: key is %q, want %q", c.ws, r.keys[0], c.key)
		}
		if len(r.id) != idLen {
			t.Errorf("%v: request id %q, want %d bytes", c.ws, r.id, idLen)
		}
		// evalsha, sha, numkeys, the key, then the packed numbers; then
		// the index and the id.
		args := command([]*request{r})
		if got := argStrings(args); got[4] != string(pack(c.nums...)) || len(args) != 7 {
			t.Errorf("%v: command %q, want the numbers %v packed", c.ws, got, c.nums)
		}
	}
}

// TestCommandSharesLists: decisions sharing a call list the windows of each
// in order, send each distinct set of windows once, and point at it by index.
func TestCommandSharesLists(t *testing.T) {
	s := newStore(t, client(t, "127.0.0.1:1"), Options{})
	two := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute))
	one := storetest.MustWindows(ratelimit.PerPeriod(5, time.Second))
	a := s.request("{a}:message:EVENT", two, time.Time{})
	b := s.request("{b}:message:REQ", one, time.Time{})
	c := s.request("{c}:message:EVENT", two, time.Time{})
	want := []string{"evalsha", ewma.Hash(), "3",
		"sluice:{a}:message:EVENT:1000:60000" + valueTag, "sluice:{b}:message:REQ:1000" + valueTag, "sluice:{c}:message:EVENT:1000:60000" + valueTag,
		string(pack(0, 0, 2, 2, 10, 1000, 1, 240, 60000, 1, 1, 5, 1000, 1)), "\x01\x00\x02\x00\x01\x00",
		a.id, b.id, c.id}
	if got := argStrings(command([]*request{a, b, c})); !slices.Equal(got, want) {
		t.Errorf("command\n got %q\nwant %q", got, want)
	}
}

// argStrings renders a command line the way go-redis writes it.
func argStrings(args []any) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = v
		case *string:
			out[i] = *v
		case int:
			out[i] = itoa(int64(v))
		case *int64:
			out[i] = itoa(*v)
		case []byte:
			out[i] = string(v)
		default:
			out[i] = fmt.Sprintf("?%T", a)
		}
	}
	return out
}

// TestRequestIDsStartApart: two stores whose random bases happen to be
// equal still do not issue the same ids in step.
func TestRequestIDsStartApart(t *testing.T) {
	c := client(t, "127.0.0.1:1")
	a, b := newStore(t, c, Options{}), newStore(t, c, Options{})
	b.idBase = a.idBase
	limits := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second))
	ida := a.request("{x}:message:EVENT", limits, time.Time{}).id
	idb := b.request("{x}:message:EVENT", limits, time.Time{}).id
	if ida == idb || len(ida) != idLen {
		t.Errorf("first ids %q and %q", ida, idb)
	}
}

// TestScriptRefusals: every error the script itself replies is classed as
// Redis answering (not an outage), and nothing else is.
func TestScriptRefusals(t *testing.T) {
	c := client(t, miniredis.RunT(t).Addr())
	ctx := context.Background()
	for _, msg := range []string{"malformed value at k", "bad limit for k", "want n keys and 2+3n args"} {
		err := c.Eval(ctx, "return redis.error_reply('ERR sluice ewma: "+msg+"')", nil).Err()
		if !isScriptRefusal(err) {
			t.Errorf("%q (%v): not a script refusal", msg, err)
		}
	}
	for _, err := range []error{
		c.Eval(ctx, "return redis.error_reply('ERR something else')", nil).Err(),
		c.Eval(ctx, "return redis.call('NOPE')", nil).Err(),
		context.DeadlineExceeded,
	} {
		if isScriptRefusal(err) {
			t.Errorf("%v: classed as a script refusal", err)
		}
	}
}

// TestEvalArgsPicksSource: the EVAL fallback of a lean call sends the lean
// script's source, of a batch call the batch script's.
func TestEvalArgsPicksSource(t *testing.T) {
	s := newStore(t, client(t, "127.0.0.1:1"), Options{})
	r := s.request("{a}:message:EVENT", storetest.MustWindows(ratelimit.PerPeriod(10, time.Second)), time.Time{})
	if a := evalArgs(leanArgs(r, 0)); a[0] != argEval || a[1] != argSource1 {
		t.Errorf("lean call falls back to %.20q", a[:2])
	}
	if a := evalArgs(command([]*request{r})); a[0] != argEval || a[1] != argSource {
		t.Errorf("batch call falls back to %.20q", a[:2])
	}
}
