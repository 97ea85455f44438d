package ratelimit_test

import (
	"context"
	"math"
	"math/rand"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluice-relay/sluice/ratelimit"
)

// Fixed instants for step tables; nothing in these tests sleeps.
var (
	t0 = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	t1 = t0.Add(100 * time.Millisecond)
	t2 = t0.Add(584 * time.Millisecond)
	t3 = t0.Add(585 * time.Millisecond)
	t4 = t0.Add(999 * time.Millisecond)
	t5 = t0.Add(time.Second)
	t6 = t0.Add(2 * time.Second)
	t7 = t0.Add(time.Minute)
	t8 = t0.Add(time.Hour)
	t9 = t0.Add(24 * time.Hour)
)

// step is one message: at instant at, expect allowed and wait, and (when
// scores is not nil) these scores within 1e-9 relative.
type step struct {
	at      time.Time
	allowed bool
	wait    time.Duration
	scores  []float64
}

// runSteps sends every step for key through s and checks each decision.
func runSteps(t *testing.T, s *ratelimit.MemoryStore, key string, limits *ratelimit.Windows, steps []step) {
	t.Helper()
	for i, st := range steps {
		d, scores, err := ratelimit.DecideScores(s, context.Background(), key, limits, st.at)
		if err != nil {
			t.Fatalf("step %d (t0+%v): %v", i, st.at.Sub(t0), err)
		}
		if d.Allowed != st.allowed || d.Wait != st.wait {
			t.Errorf("step %d (t0+%v): allowed %v wait %v, want allowed %v wait %v",
				i, st.at.Sub(t0), d.Allowed, d.Wait, st.allowed, st.wait)
		}
		if st.scores == nil {
			continue
		}
		if len(scores) != len(st.scores) {
			t.Errorf("step %d: scores %v, want %v", i, scores, st.scores)
			continue
		}
		for j := range st.scores {
			if !closeTo(scores[j], st.scores[j]) {
				t.Errorf("step %d: score[%d] = %v, want %v", i, j, scores[j], st.scores[j])
			}
		}
	}
}

func closeTo(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

var (
	per3s = ratelimit.MustWindows(ratelimit.PerPeriod(3, time.Second))
	// Two windows: 2 per 1 s half-life and 4 per 60 s half-life.
	twoWindows = ratelimit.MustWindows(ratelimit.PerPeriod(2, time.Second), ratelimit.PerPeriod(4, time.Minute))
)

// The expected waits and scores were computed independently of this package
// (with Python's math module) from DESIGN.md's formulas.
var stepTables = []struct {
	name   string
	limits *ratelimit.Windows
	steps  []step
}{
	{"burst then true backoff", per3s, []step{
		{t0, true, 0, []float64{1}},
		{t0, true, 0, []float64{2}},
		{t0, true, 0, []float64{3}},
		// 1s·log2(3/(3−1)) = 584.96ms → 585ms; not log2(3/3) = 0.
		{t0, false, 585 * time.Millisecond, []float64{3}},
		{t0, false, 585 * time.Millisecond, []float64{3}}, // knocking again changes nothing
		{t1, false, 485 * time.Millisecond, []float64{2.7990989746104225}},
		{t2, false, time.Millisecond, nil}, // 1 ms before the wait ends
		{t3, true, 0, []float64{2.9999480156367984}},
		{t3, false, 585 * time.Millisecond, nil},
		{t9, true, 0, []float64{1}}, // a day later the score is gone
	}},
	{"exact half-life", ratelimit.MustWindows(ratelimit.PerPeriod(2, time.Second)), []step{
		{t0, true, 0, nil},
		{t0, true, 0, nil},
		{t0, false, time.Second, []float64{2}}, // log2(2/1) = 1 exactly
		{t4, false, time.Millisecond, nil},
		{t5, true, 0, []float64{2}}, // 2·2^-1 + 1
	}},
	{"cost 2", ratelimit.MustWindows(ratelimit.Limit{Rate: 5, Period: time.Second, Cost: 2}), []step{
		{t0, true, 0, []float64{2}},
		{t0, true, 0, []float64{4}},
		// 4+2 > 5: 1s·log2(4/3) = 415.04ms → 416ms.
		{t0, false, 416 * time.Millisecond, []float64{4}},
		{t0.Add(415 * time.Millisecond), false, time.Millisecond, nil},
		{t0.Add(416 * time.Millisecond), true, 0, nil},
	}},
	{"two windows, largest wait wins, refusal writes neither", twoWindows, []step{
		{t0, true, 0, []float64{1, 1}},
		{t0, true, 0, []float64{2, 2}},
		// The 1 s window refuses (wait 1s); the 60 s one would admit,
		// but nothing is written to either.
		{t0, false, time.Second, []float64{2, 2}},
		{t5, true, 0, []float64{2, 2.9770280407057923}},
		{t5, false, time.Second, nil},
		{t6, true, 0, []float64{2, 3.942833957221388}},
		// Both refuse: 1 s window 1000ms, 60 s window
		// 60s·log2(3.9428/3) = 23656.2ms → 23657ms.
		{t6, false, 23657 * time.Millisecond, []float64{2, 3.942833957221388}},
		{t6.Add(23656 * time.Millisecond), false, time.Millisecond, nil},
		{t6.Add(23657 * time.Millisecond), true, 0, nil},
	}},
	{"an instant before the last write does not decay", per3s, []step{
		{t5, true, 0, nil},
		{t5, true, 0, nil},
		{t0, true, 0, []float64{3}},
		// Refused at t0, with the score frozen until t5: the wait
		// counts from t5, 1s + 585ms.
		{t0, false, 1585 * time.Millisecond, []float64{3}},
		{t5.Add(585 * time.Millisecond), true, 0, nil},
	}},
	{"hour half-life: burst, minute, hour", ratelimit.MustWindows(ratelimit.PerPeriod(100, time.Hour)), append(
		burstSteps(t0, 100),
		step{t0, false, 52199 * time.Millisecond, []float64{100}}, // 1h·log2(100/99) = 52.1985s
		step{t7, true, 0, []float64{99.85140203528961}},
		step{t7, false, 44475 * time.Millisecond, nil}, // 1h·log2(99.8514/99) = 44.4741s
		step{t8, true, 0, []float64{51.505809720150964}},
	)},
	{"sub-millisecond instants are truncated", per3s, []step{
		{t0.Add(900 * time.Microsecond), true, 0, nil},
		{t0, true, 0, nil},
		{t0.Add(999 * time.Microsecond), true, 0, nil},
		{t0.Add(500 * time.Microsecond), false, 585 * time.Millisecond, []float64{3}},
	}},
}

// burstSteps is n admitted messages at instant at, from rest.
func burstSteps(at time.Time, n int) []step {
	steps := make([]step, n)
	for i := range steps {
		steps[i] = step{at, true, 0, []float64{float64(i + 1)}}
	}
	return steps
}

func TestMemoryStoreSteps(t *testing.T) {
	for _, tt := range stepTables {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, ratelimit.NewMemoryStore(0), "{198.51.100.1}:message:EVENT", tt.limits, tt.steps)
		})
	}
}

// TestMemoryStoreWindowsNeverShareASlot runs the two-window table on many
// keys in a table of two slots: the windows of one key always meet there, and
// must be kept apart or one would overwrite the other.
func TestMemoryStoreWindowsNeverShareASlot(t *testing.T) {
	for _, tt := range stepTables[3:4] {
		for k := range 200 {
			runSteps(t, ratelimit.NewMemoryStore(2), "key-"+strconv.Itoa(k), tt.limits, tt.steps)
			if t.Failed() {
				t.Fatalf("key %d", k)
			}
		}
	}
}

func TestMemoryStoreKeysAreSeparate(t *testing.T) {
	m := ratelimit.NewMemoryStore(1 << 20) // two keys share a slot once in a million runs
	ctx := context.Background()
	for range 3 {
		m.Decide(ctx, "a", per3s, t0)
	}
	if d, _ := m.Decide(ctx, "a", per3s, t0); d.Allowed {
		t.Fatal("a: fourth message admitted")
	}
	if d, scores, _ := ratelimit.DecideScores(m, ctx, "b", per3s, t0); !d.Allowed || scores[0] != 1 {
		t.Fatalf("b = %+v, want a fresh budget", d)
	}
}

// TestMemoryStoreZeroValue: the zero MemoryStore sizes itself on first use
// and decides at the real clock when given the zero instant.
func TestMemoryStoreZeroValue(t *testing.T) {
	var m ratelimit.MemoryStore
	ctx := context.Background()
	for range 3 {
		if d, _ := m.Decide(ctx, "k", per3s, time.Time{}); !d.Allowed {
			t.Fatalf("burst refused: %+v", d)
		}
	}
	// Within the same second at the real clock the fourth is refused for
	// at most 585 ms (less if the clock moved between the calls).
	d, _ := m.Decide(ctx, "k", per3s, time.Time{})
	if d.Allowed || d.Wait <= 0 || d.Wait > 585*time.Millisecond {
		t.Fatalf("fourth message at the real clock: %+v, want refused for at most 585ms", d)
	}
	if got := ratelimit.SlotsOf(&m); got != ratelimit.DefaultMemorySlots {
		t.Errorf("zero value has %d slots, want %d", got, ratelimit.DefaultMemorySlots)
	}
}

func TestMemoryStoreSizes(t *testing.T) {
	for _, tt := range []struct{ ask, want int }{
		{0, ratelimit.DefaultMemorySlots}, {-1, ratelimit.DefaultMemorySlots},
		{1, 1}, {3, 4}, {1000, 1024}, {1 << 20, 1 << 20},
	} {
		if got := ratelimit.SlotsOf(ratelimit.NewMemoryStore(tt.ask)); got != tt.want {
			t.Errorf("NewMemoryStore(%d) has %d slots, want %d", tt.ask, got, tt.want)
		}
	}
}

// TestMemoryStoreDecideAllocatesNothing: a decision over one to three
// windows, admitted or refused, allocates nothing.
func TestMemoryStoreDecideAllocatesNothing(t *testing.T) {
	m := ratelimit.NewMemoryStore(0)
	three := []ratelimit.Limit{
		ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(100, time.Minute), ratelimit.PerPeriod(1000, time.Hour),
	}
	for n := 1; n <= 3; n++ {
		ws := ratelimit.MustWindows(three[:n]...)
		i := 0
		allocs := testing.AllocsPerRun(100, func() {
			i++ // admitted and refused both
			m.Decide(context.Background(), "k", ws, t9.Add(time.Duration(i)*time.Millisecond))
		})
		if allocs != 0 {
			t.Errorf("Decide with %d windows allocates %v per call, want 0", n, allocs)
		}
	}
}

// TestMemoryStoreHonestWait is the property DESIGN.md promises, over random
// limits and arrivals: a refused client that comes back exactly Wait later is
// admitted, and one that comes back 1 ms sooner is refused (with 1 ms to go).
func TestMemoryStoreHonestWait(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	ctx := context.Background()
	refusals := 0
	for trial := range 300 {
		list := randomLimits(rng)
		limits := ratelimit.MustWindows(list...)
		m := ratelimit.NewMemoryStore(0)
		key := "trial-" + strconv.Itoa(trial)
		now := t0.Add(time.Duration(rng.Int63n(int64(time.Hour))))
		for range 60 {
			d, err := m.Decide(ctx, key, limits, now)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				now = now.Add(time.Duration(rng.ExpFloat64() * float64(list[0].Interval()) / 3))
				continue
			}
			refusals++
			if d.Wait < time.Millisecond || d.Wait%time.Millisecond != 0 {
				t.Fatalf("%v: wait %v is not a whole number of milliseconds ≥ 1", limits, d.Wait)
			}
			early, _ := m.Decide(ctx, key, limits, now.Add(d.Wait-time.Millisecond))
			if early.Allowed || early.Wait != time.Millisecond {
				t.Fatalf("%v at %v: wait %v, but 1ms sooner: %+v", limits, now.Sub(t0), d.Wait, early)
			}
			now = now.Add(d.Wait)
			if onTime, _ := m.Decide(ctx, key, limits, now); !onTime.Allowed {
				t.Fatalf("%v: waited exactly %v and was refused again: %+v", limits, d.Wait, onTime)
			}
		}
	}
	if refusals < 1000 {
		t.Fatalf("only %d refusals exercised", refusals)
	}
}

// randomLimits returns 1 to 3 valid limits with distinct periods.
func randomLimits(rng *rand.Rand) []ratelimit.Limit {
	n := 1 + rng.Intn(3)
	var ls []ratelimit.Limit
	period := time.Duration(1+rng.Intn(2000)) * time.Millisecond
	for range n {
		cost := 1.0
		if rng.Intn(3) == 0 {
			cost = 0.1 + rng.Float64()*3
		}
		ls = append(ls, ratelimit.Limit{
			Rate:   cost * (1.01 + rng.Float64()*50),
			Period: period,
			Cost:   cost,
		})
		period = period*time.Duration(2+rng.Intn(60)) + time.Duration(rng.Intn(1000))*time.Millisecond
	}
	return ls
}

// TestMemoryStoreBurstMatchesLimit checks Limit.Burst against the store.
func TestMemoryStoreBurstMatchesLimit(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	for range 200 {
		l := randomLimits(rng)[0]
		m := ratelimit.NewMemoryStore(0)
		n := 0
		for {
			d, _ := m.Decide(context.Background(), "k", ratelimit.MustWindows(l), t0)
			if !d.Allowed {
				break
			}
			n++
		}
		if n != l.Burst() {
			t.Fatalf("%+v: store admits %d from rest, Burst says %d", l, n, l.Burst())
		}
	}
}

// TestMemoryStoreMillionKeys: a million distinct keys leave the table as it
// was — same slots, no allocation, no heap growth.
func TestMemoryStoreMillionKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("a million decisions")
	}
	m := ratelimit.NewMemoryStore(0)
	ctx := context.Background()
	buf := make([]byte, 0, 64)
	i := 0
	decideNext := func() {
		// The key is built in a reused buffer so that the test, not the
		// store, would be the one allocating.
		buf = strconv.AppendInt(append(buf[:0], "{2001:db8:"...), int64(i), 16)
		buf = append(buf, "::/64}:message:EVENT"...)
		key := unsafe.String(&buf[0], len(buf))
		m.Decide(ctx, key, twoWindows, t0)
		i++
	}
	decideNext() // warm up lazily built state
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	allocs := testing.AllocsPerRun(1, func() {
		for range 1_000_000 {
			decideNext()
		}
	})
	runtime.GC()
	runtime.ReadMemStats(&after)
	if allocs != 0 {
		t.Errorf("a million keys: %v allocations, want 0", allocs)
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 256<<10 {
		t.Errorf("a million keys grew the heap by %d bytes", grew)
	}
	if i < 1_000_000 {
		t.Fatalf("only %d keys", i)
	}
}

// TestMemoryStoreAtomicWindows: many goroutines hit one key at one instant;
// exactly the burst of the tighter window is admitted, never more, and every
// refusal tells the same wait. A store that decided windows one at a time or
// without its lock would admit extra messages under -race or otherwise.
func TestMemoryStoreAtomicWindows(t *testing.T) {
	m := ratelimit.NewMemoryStore(0)
	limits := ratelimit.MustWindows(ratelimit.PerPeriod(100, time.Hour), ratelimit.PerPeriod(50, 10*time.Hour))
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				d, err := m.Decide(context.Background(), "shared", limits, t0)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != 50 {
		t.Fatalf("admitted %d of 320, want exactly 50", got)
	}
}

// TestDecideAllIsOneDecision: budgets decided together are admitted only
// if all admit and written only then; a refusal names the budget with the
// largest wait and charges none of them.
func TestDecideAllIsOneDecision(t *testing.T) {
	m := ratelimit.NewMemoryStore(0)
	ctx := context.Background()
	event := ratelimit.MustWindows(ratelimit.PerPeriod(5, time.Hour))
	class := ratelimit.MustWindows(ratelimit.PerPeriod(2, time.Hour))
	short := ratelimit.MustWindows(ratelimit.PerPeriod(2, time.Second))
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	frame := func(kind string) []ratelimit.Budget {
		bs := []ratelimit.Budget{{Key: "{c}:message:EVENT", Windows: event}}
		if kind != "" {
			bs = append(bs, ratelimit.Budget{Key: "{c}:kind:" + kind, Windows: class})
		}
		return bs
	}
	for i := range 2 {
		if d, _ := m.DecideAll(ctx, frame("r"), now); !d.Allowed {
			t.Fatalf("reaction %d refused: %+v", i, d)
		}
	}
	for i := range 10 {
		d, _ := m.DecideAll(ctx, frame("r"), now)
		if d.Allowed || d.By != 1 || d.Wait <= 0 {
			t.Fatalf("reaction %d: %+v, want refused by budget 1", i+2, d)
		}
	}
	for i := range 3 {
		if d, _ := m.DecideAll(ctx, frame(""), now); !d.Allowed {
			t.Fatalf("note %d refused: %+v (the refused reactions were charged)", i, d)
		}
	}
	// The largest wait wins: EVENT is full now (5 of 5, an hour's
	// half-life), the short window full too (2 of 2, a second's).
	bs := []ratelimit.Budget{{Key: "{c}:s", Windows: short}, {Key: "{c}:s", Windows: short}}
	if d, _ := m.DecideAll(ctx, bs[:1], now); !d.Allowed {
		t.Fatal(d)
	}
	if d, _ := m.DecideAll(ctx, bs[:1], now); !d.Allowed {
		t.Fatal(d)
	}
	d, _ := m.DecideAll(ctx, []ratelimit.Budget{{Key: "{c}:s", Windows: short}, {}, {Key: "{c}:message:EVENT", Windows: event}}, now)
	if d.Allowed || d.By != 2 || d.Wait < time.Minute {
		t.Fatalf("%+v, want refused by budget 2 with the hour's wait", d)
	}
}
