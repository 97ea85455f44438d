package ratelimit_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// countingStore is a Store that counts its calls and can fail. It hides the
// MemoryStore behind the interface, so the Limiter takes its general path.
type countingStore struct {
	inner    ratelimit.Store
	calls    atomic.Int64
	zeroNows atomic.Int64
	err      error
}

func (s *countingStore) Decide(ctx context.Context, key string, limits *ratelimit.Windows, now time.Time) (ratelimit.Decision, error) {
	s.calls.Add(1)
	if now.IsZero() {
		s.zeroNows.Add(1)
	}
	if s.err != nil {
		return ratelimit.Decision{}, s.err
	}
	return s.inner.Decide(ctx, key, limits, now)
}

func newCounting() *countingStore {
	return &countingStore{inner: &perKeyStore{}}
}

// perKeyStore gives every key a MemoryStore of its own, so that no two keys
// of a test can ever share a slot: the Limiter's tests then never depend on
// the memory store's (rare, random) collisions.
type perKeyStore struct {
	mu     sync.Mutex
	stores map[string]*ratelimit.MemoryStore
}

func (s *perKeyStore) Decide(ctx context.Context, key string, limits *ratelimit.Windows, now time.Time) (ratelimit.Decision, error) {
	s.mu.Lock()
	m := s.stores[key]
	if m == nil {
		if s.stores == nil {
			s.stores = make(map[string]*ratelimit.MemoryStore)
		}
		m = ratelimit.NewMemoryStore(16)
		s.stores[key] = m
	}
	s.mu.Unlock()
	return m.Decide(ctx, key, limits, now)
}

func TestLimiterBlockedFloodCostsNoStoreCalls(t *testing.T) {
	store := newCounting()
	lim := ratelimit.NewLimiter(store, nil)
	ctx := context.Background()
	key := messageKey("192.0.2.1", "EVENT")
	for i := range 3 {
		if d, err := lim.AllowAt(ctx, key, per3s, t0); err != nil || !d.Allowed {
			t.Fatalf("message %d: %+v %v", i, d, err)
		}
	}
	d, err := lim.AllowAt(ctx, key, per3s, t0)
	if err != nil || d.Allowed || d.Wait != 585*time.Millisecond || d.Local {
		t.Fatalf("fourth: %+v %v, want refused by the store for 585ms", d, err)
	}
	calls := store.calls.Load()

	// A flood until the wait ends is answered locally, each with the wait
	// that remains.
	for i := range 10_000 {
		at := t0.Add(time.Duration(i) * 58 * time.Microsecond) // up to t0+580ms
		d, err := lim.AllowAt(ctx, key, per3s, at)
		if err != nil || d.Allowed || d.Wait != t3.Sub(at) || !d.Local {
			t.Fatalf("flood %d at t0+%v: %+v %v, want refused locally for %v", i, at.Sub(t0), d, err, t3.Sub(at))
		}
	}
	if got := store.calls.Load() - calls; got != 0 {
		t.Fatalf("a blocked flood of 10,000 cost %d store calls, want 0", got)
	}
	st := lim.Stats()
	if st.LocalRefusals != 10_000 || st.StoreCalls != uint64(calls) || st.StoreErrors != 0 {
		t.Fatalf("Stats = %+v, want 10000 local refusals and %d store calls", st, calls)
	}

	// Another type of the same client is not blocked.
	if d, _ := lim.AllowAt(ctx, messageKey("192.0.2.1", "REQ"), per3s, t1); !d.Allowed {
		t.Fatalf("REQ blocked by EVENT's refusal: %+v", d)
	}
}

func TestLimiterLocalBlockExpires(t *testing.T) {
	store := newCounting()
	lim := ratelimit.NewLimiter(store, nil)
	ctx := context.Background()
	limits := ratelimit.MustWindows(ratelimit.PerPeriod(2, time.Second))
	lim.AllowAt(ctx, "k", limits, t0)
	lim.AllowAt(ctx, "k", limits, t0)
	if d, _ := lim.AllowAt(ctx, "k", limits, t0); d.Allowed || d.Wait != time.Second {
		t.Fatalf("third: %+v, want refused for 1s", d)
	}
	calls := store.calls.Load()
	if d, _ := lim.AllowAt(ctx, "k", limits, t4); d.Allowed || d.Wait != time.Millisecond {
		t.Fatalf("1ms before the end: %+v, want refused for 1ms", d)
	}
	if store.calls.Load() != calls {
		t.Fatal("the store was asked while the local block held")
	}
	// At exactly t0+wait the block is over: the store is asked, and admits.
	if d, _ := lim.AllowAt(ctx, "k", limits, t5); !d.Allowed {
		t.Fatalf("at the end of the wait: %+v, want admitted", d)
	}
	if store.calls.Load() != calls+1 {
		t.Fatal("the store was not asked once the block expired")
	}
}

func TestLimiterStoreErrorsFailClosed(t *testing.T) {
	plain := errors.New("dial tcp 127.0.0.1:1: connection refused")
	wrapped := errors.Join(ratelimit.ErrUnavailable, plain)
	for _, storeErr := range []error{plain, wrapped, context.DeadlineExceeded} {
		store := &countingStore{err: storeErr}
		lim := ratelimit.NewLimiter(store, nil)
		for range 3 {
			d, err := lim.AllowAt(context.Background(), "k", per3s, t0)
			if d.Allowed {
				t.Fatalf("%v: admitted on a store error", storeErr)
			}
			if !errors.Is(err, ratelimit.ErrUnavailable) || !errors.Is(err, storeErr) {
				t.Fatalf("%v: err = %v, want it wrapped with ErrUnavailable", storeErr, err)
			}
		}
		// An error is not a refusal: nothing is blocked locally, every
		// message asks the store again.
		if got := store.calls.Load(); got != 3 {
			t.Fatalf("%v: %d store calls for 3 messages", storeErr, got)
		}
		if st := lim.Stats(); st.StoreErrors != 3 || st.LocalRefusals != 0 {
			t.Fatalf("%v: Stats = %+v", storeErr, st)
		}
	}
}

// TestLimiterFingerprintCollision: with one bucket every key shares it; a
// blocked key's entry must never refuse another key.
func TestLimiterFingerprintCollision(t *testing.T) {
	store := newCounting()
	lim := ratelimit.NewLimiterSlots(store, nil, 1)
	ctx := context.Background()
	for range 4 {
		lim.AllowAt(ctx, "blocked", per3s, t0)
	}
	for i := range 100 {
		key := "other-" + strconv.Itoa(i)
		if d, err := lim.AllowAt(ctx, key, per3s, t1); err != nil || !d.Allowed {
			t.Fatalf("%s refused by another key's block: %+v %v", key, d, err)
		}
	}
	// Now four others are blocked, filling the bucket; "blocked", whose
	// entry ended first, lost it and asks the store, which still refuses
	// it honestly.
	for i := range 4 {
		for range 3 {
			lim.AllowAt(ctx, "other-"+strconv.Itoa(i), per3s, t1)
		}
	}
	calls := store.calls.Load()
	if d, _ := lim.AllowAt(ctx, "blocked", per3s, t1); d.Allowed || d.Wait != 485*time.Millisecond {
		t.Fatalf("evicted key: %+v, want the store's refusal for 485ms", d)
	}
	if store.calls.Load() != calls+1 {
		t.Fatal("evicted key was not asked of the store")
	}
}

// TestLimiterSharedBucketDoesNotThrash: blocked clients that share a
// bucket keep their entries, so neither costs store calls; a newcomer to a
// full bucket evicts the entry that ends first.
func TestLimiterSharedBucketDoesNotThrash(t *testing.T) {
	store := newCounting()
	lim := ratelimit.NewLimiterSlots(store, nil, 4)
	ctx := context.Background()
	block := func(k string, at time.Time) {
		for range 4 {
			lim.AllowAt(ctx, k, per3s, at)
		}
	}
	block("a", t0) // blocked until t0+585ms, the earliest
	for _, k := range []string{"b", "c", "d"} {
		block(k, t1) // until t1+585ms
	}
	calls := store.calls.Load()
	keys := []string{"a", "b", "c", "d"}
	for i := range 1000 {
		if d, _ := lim.AllowAt(ctx, keys[i%4], per3s, t2); d.Allowed {
			t.Fatal("blocked key admitted")
		}
	}
	if got := store.calls.Load() - calls; got != 0 {
		t.Fatalf("four blocked keys in one bucket cost %d store calls", got)
	}
	block("e", t2)
	calls = store.calls.Load()
	for _, k := range []string{"e", "d", "c", "b", "a"} {
		if d, _ := lim.AllowAt(ctx, k, per3s, t2); d.Allowed {
			t.Fatalf("%s admitted", k)
		}
	}
	// Only a, whose entry ended first, was evicted: one store call.
	if got := store.calls.Load() - calls; got != 1 {
		t.Fatalf("after one eviction, %d store calls for five blocked keys, want 1", got)
	}
}

func TestLimiterNoLimitsPassFree(t *testing.T) {
	store := newCounting()
	lim := ratelimit.NewLimiter(store, nil)
	for range 100 {
		if d, err := lim.Allow(context.Background(), "k", nil); err != nil || !d.Allowed {
			t.Fatalf("no limits: %+v %v", d, err)
		}
	}
	if store.calls.Load() != 0 {
		t.Fatal("no limits still asked the store")
	}
}

func TestLimiterClock(t *testing.T) {
	// Without a clock the store's own clock decides: it gets the zero instant.
	store := newCounting()
	lim := ratelimit.NewLimiter(store, nil)
	lim.Allow(context.Background(), "k", per3s)
	if store.zeroNows.Load() != 1 {
		t.Fatal("nil Clock: the store was not left to its own clock")
	}
	// With a clock, it is used for both the store and the local table.
	now := t0
	store = newCounting()
	lim = ratelimit.NewLimiter(store, func() time.Time { return now })
	for range 4 {
		lim.Allow(context.Background(), "k", per3s)
	}
	if store.zeroNows.Load() != 0 {
		t.Fatal("Clock set: the store got the zero instant")
	}
	now = t1
	if d, _ := lim.Allow(context.Background(), "k", per3s); d.Allowed || d.Wait != 485*time.Millisecond {
		t.Fatalf("at the injected t1: %+v, want refused for 485ms", d)
	}
	now = t3
	if d, _ := lim.Allow(context.Background(), "k", per3s); !d.Allowed {
		t.Fatalf("at the injected t3: %+v, want admitted", d)
	}
}

// TestLimiterOverMemory: a Limiter over a MemoryStore decides as the store
// does, and allocates nothing.
func TestLimiterOverMemory(t *testing.T) {
	for _, tt := range stepTables {
		t.Run(tt.name, func(t *testing.T) {
			// A fresh Limiter per step, so that its local table does not
			// answer: the store alone decides.
			m := ratelimit.NewMemoryStore(0)
			for i, st := range tt.steps {
				d, err := ratelimit.NewLimiter(m, nil).AllowAt(context.Background(), "k", tt.limits, st.at)
				if err != nil || d.Allowed != st.allowed || d.Wait != st.wait {
					t.Errorf("step %d: %+v %v, want allowed %v wait %v", i, d, err, st.allowed, st.wait)
				}
			}
		})
	}
	lim := ratelimit.NewLimiter(nil, func() time.Time { return t0 })
	key := messageKey("192.0.2.9", "EVENT")
	if allocs := testing.AllocsPerRun(1000, func() { lim.Allow(context.Background(), key, twoWindows) }); allocs != 0 {
		t.Errorf("Allow over a MemoryStore allocates %v per call, want 0", allocs)
	}
}

// TestLimiterConcurrent exercises the lock-free table under -race: many
// goroutines, few slots, keys blocking and expiring. Each key's admissions
// never exceed what the store allows.
func TestLimiterConcurrent(t *testing.T) {
	lim := ratelimit.NewLimiterSlots(&perKeyStore{}, nil, 4)
	limits := ratelimit.MustWindows(ratelimit.PerPeriod(5, time.Hour))
	var admitted [16]atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := (g + i) % len(admitted)
				at := t0.Add(time.Duration(i) * time.Millisecond)
				d, err := lim.AllowAt(context.Background(), "key-"+strconv.Itoa(k), limits, at)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted[k].Add(1)
				} else if d.Wait <= 0 {
					t.Errorf("refused with wait %v", d.Wait)
					return
				}
			}
		}()
	}
	wg.Wait()
	for k := range admitted {
		// 5 from rest, plus what decays back within 2 s of a 1 h half-life: none.
		if got := admitted[k].Load(); got != 5 {
			t.Errorf("key-%d admitted %d times, want 5", k, got)
		}
	}
	if st := lim.Stats(); st.LocalRefusals == 0 || st.StoreCalls+st.LocalRefusals != 16000 {
		t.Errorf("Stats = %+v, want 16000 decisions, some local", st)
	}
}

// TestLimiterWaitIsExactAtAnyInstant: arrivals at instants that are not
// whole milliseconds, through the Limiter (local table and store). After a
// refusal at t with wait w, t+w−1ms is refused and t+w admitted, whether
// the Limiter that answers has the refusal in its local table or not (a
// second Limiter over the same store has not). The store decides on whole
// milliseconds and the local table on nanoseconds; neither may make the
// other lie.
func TestLimiterWaitIsExactAtAnyInstant(t *testing.T) {
	ctx := context.Background()
	rng := uint64(0x9e3779b97f4a7c15)
	next := func(n uint64) uint64 { // xorshift: reproducible
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return rng % n
	}
	for run := range 200 {
		list := []ratelimit.Limit{ratelimit.PerPeriod(float64(2+next(20))+float64(next(100))/100, time.Duration(1+next(5000))*time.Millisecond)}
		if next(2) == 0 {
			list = append(list, ratelimit.PerPeriod(float64(5+next(50)), time.Duration(5001+next(60000))*time.Millisecond))
		}
		limits := ratelimit.MustWindows(list...)
		store := &perKeyStore{}
		a := ratelimit.NewLimiter(store, nil)
		b := ratelimit.NewLimiter(store, nil)
		now := t0.Add(time.Duration(next(1e9)))
		var d ratelimit.Decision
		for i := 0; ; i++ {
			var err error
			if d, err = a.AllowAt(ctx, "k", limits, now); err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				break
			}
			if i > 10000 {
				t.Fatalf("run %d: %v never refused", run, limits)
			}
			now = now.Add(time.Duration(next(uint64(time.Millisecond))))
		}
		w := d.Wait
		for _, lim := range []*ratelimit.Limiter{a, b} {
			if d, _ := lim.AllowAt(ctx, "k", limits, now.Add(w-time.Millisecond)); d.Allowed {
				t.Fatalf("run %d: %v refused at %v for %v, admitted 1ms sooner", run, limits, now, w)
			}
		}
		lim := a // the one that remembers the first refusal, or the other
		if run%2 == 1 {
			lim = b
		}
		if d, _ := lim.AllowAt(ctx, "k", limits, now.Add(w)); !d.Allowed {
			t.Fatalf("run %d: %v refused at %v for %v, refused again after exactly that wait: %+v", run, limits, now, w, d)
		}
	}
}

// TestLimiterForget: after Forget a refused client asks the store again,
// which decides by the windows it is given now.
func TestLimiterForget(t *testing.T) {
	store := newCounting()
	lim := ratelimit.NewLimiter(store, nil)
	ctx := context.Background()
	tight := ratelimit.MustWindows(ratelimit.PerPeriod(1.5, time.Hour))
	lim.AllowAt(ctx, "k", tight, t0)
	if d, _ := lim.AllowAt(ctx, "k", tight, t0); d.Allowed {
		t.Fatal("second message admitted by 1.5/1h")
	}
	calls := store.calls.Load()
	loose := ratelimit.MustWindows(ratelimit.PerPeriod(100, time.Hour))
	if d, _ := lim.AllowAt(ctx, "k", loose, t1); d.Allowed || store.calls.Load() != calls {
		t.Fatalf("before Forget: %+v with %d store calls, want a local refusal", d, store.calls.Load()-calls)
	}
	lim.Forget()
	if _, ok := lim.Refused("k"); ok {
		t.Fatal("Refused after Forget")
	}
	if d, _ := lim.AllowAt(ctx, "k", loose, t1); !d.Allowed {
		t.Fatalf("after Forget, under 100/1h: %+v, want admitted", d)
	}
}

// messageKey is the key the gate decides messages of type typ from client
// under ("{client}:message:TYPE").
func messageKey(client, typ string) string { return "{" + client + "}:message:" + typ }

// A Room is decided only by the store that keeps the quota's counts
// (redisstore): on the memory store, and on a store deciding budget by
// budget, a message with one is unavailable, and nothing is charged —
// never admitted as if the quota had room.
func TestRoomOnlyWhereCountsAre(t *testing.T) {
	ctx := context.Background()
	ws := ratelimit.MustWindows(ratelimit.PerPeriod(1.5, time.Hour))
	room := ratelimit.Budget{Key: "{q:alice}:quota:60000", Room: &ratelimit.Room{Events: 1, Window: time.Minute}}
	for name, store := range map[string]ratelimit.Store{
		"memory":     ratelimit.NewMemoryStore(0),
		"one by one": decideOnly{ratelimit.NewMemoryStore(0)},
	} {
		lim := ratelimit.NewLimiter(store, nil)
		d, err := lim.AllowAll(ctx, []ratelimit.Budget{{Key: "{c}:message:EVENT", Windows: ws}, room})
		if !errors.Is(err, ratelimit.ErrUnavailable) || d.Allowed || d.By != 1 {
			t.Fatalf("%s: %+v %v, want unavailable by the room", name, d, err)
		}
		if d, _ := lim.Allow(ctx, "{c}:message:EVENT", ws); !d.Allowed {
			t.Fatalf("%s: the frame with a room charged its EVENT budget", name)
		}
	}
}

// decideOnly is a Store without DecideAll.
type decideOnly struct{ s ratelimit.Store }

func (d decideOnly) Decide(ctx context.Context, key string, w *ratelimit.Windows, now time.Time) (ratelimit.Decision, error) {
	return d.s.Decide(ctx, key, w, now)
}

// roomStore decides windows on a memory store and refuses a Room of at
// most 5 events (an actor at 10 of them), as the Redis store would.
type roomStore struct {
	*ratelimit.MemoryStore
	asked int
}

func (s *roomStore) DecideAll(ctx context.Context, budgets []ratelimit.Budget, now time.Time) (ratelimit.Decision, error) {
	s.asked++
	var plain []ratelimit.Budget
	for i, b := range budgets {
		if b.Room != nil {
			if b.Room.Events <= 5 {
				return ratelimit.Decision{Wait: 30 * time.Second, By: i}, nil
			}
			continue
		}
		plain = append(plain, b)
	}
	return s.MemoryStore.DecideAll(ctx, plain, now)
}

// Two quotas of one window (the global one and a tier's) count one actor
// at one key: a refusal by the smaller one, which the Limiter remembers,
// must not answer for the larger one. An actor at 10 events is over a
// quota of 5 and within one of 5,000.
func TestRoomRefusalRemembersItsQuota(t *testing.T) {
	ctx := context.Background()
	st := &roomStore{MemoryStore: ratelimit.NewMemoryStore(0)}
	lim := ratelimit.NewLimiter(st, nil)
	ws := ratelimit.MustWindows(ratelimit.PerPeriod(100, time.Second))
	frame := func(client string, events int) []ratelimit.Budget {
		return []ratelimit.Budget{{Key: "{" + client + "}:message:EVENT", Windows: ws}, {Key: "{q:alice}:quota:60000", Room: &ratelimit.Room{Events: events, Window: time.Minute}}}
	}
	if d, err := lim.AllowAll(ctx, frame("anon", 5)); err != nil || d.Allowed || d.By != 1 {
		t.Fatalf("global quota: %+v %v, want refused by the room", d, err)
	}
	if d, err := lim.AllowAll(ctx, frame("anon", 5)); err != nil || d.Allowed || !d.Local {
		t.Fatalf("global quota again: %+v %v, want refused from the local table", d, err)
	}
	asked := st.asked
	if d, err := lim.AllowAll(ctx, frame("member", 5000)); err != nil || !d.Allowed || st.asked != asked+1 {
		t.Fatalf("tier quota of 5,000: %+v %v (store asked %d times more), want admitted by the store", d, err, st.asked-asked)
	}
}
