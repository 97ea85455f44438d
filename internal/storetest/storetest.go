// Package storetest is the conformance suite every ratelimit.Store must
// pass: one table of steps at fixed instants, with the decisions, waits and
// scores worked out by hand, plus seeded property tests. The memory store
// and a real Redis (one call per decision, and batched) run the same steps,
// so they make the same decisions.
//
// It imports only the standard library and ratelimit.
package storetest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// T0 is the first instant of every step table. It lies on a whole
// millisecond, as every instant in the suite does.
var T0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Tolerance is the relative difference allowed between an expected and an
// observed score (and between two stores' scores): the stores compute 2^x
// with different libraries, which may differ in the last bit.
const Tolerance = 1e-9

const ms = time.Millisecond

// step is one decision at T0+at. scores, when not nil, are the expected
// scores after it (see Scorer); n repeats the step n times (0 means once).
type step struct {
	at      time.Duration
	allowed bool
	wait    time.Duration
	scores  []float64
	n       int
}

type tcase struct {
	name   string
	limits []ratelimit.Limit
	steps  []step
}

func lim(rate float64, period time.Duration, cost float64) ratelimit.Limit {
	return ratelimit.Limit{Rate: rate, Period: period, Cost: cost}
}

// a is 2^(-1/60): what a 60 s half-life leaves of a score after one second.
var a = math.Exp2(-1.0 / 60)

// The expected values below were worked out independently of any store:
// waits are the smallest whole millisecond w with S·2^(-w/T)+c ≤ R, checked
// with 50-digit decimal arithmetic (for example 1000·log2(3/2) = 584.96…,
// so 585 ms; 60000·log2(3.94283…/3) − 1000 = 22656.2…, so 22657 ms).
var table = []tcase{
	{
		name:   "burst then exact wait",
		limits: []ratelimit.Limit{lim(3, time.Second, 1)},
		steps: []step{
			{at: 0, allowed: true, scores: []float64{1}},
			{at: 0, allowed: true, scores: []float64{2}},
			{at: 0, allowed: true, scores: []float64{3}},
			// T·log2(decayed/(R−c)) = 584.96 ms, not T·log2(3/3) = 0.
			{at: 0, allowed: false, wait: 585 * ms, scores: []float64{3}},
			// A refusal writes nothing: knocking again changes nothing.
			{at: 100 * ms, allowed: false, wait: 485 * ms, scores: []float64{3 * math.Exp2(-0.1)}, n: 5},
			{at: 584 * ms, allowed: false, wait: 1 * ms, scores: []float64{3 * math.Exp2(-0.584)}},
			{at: 585 * ms, allowed: true, scores: []float64{3*math.Exp2(-0.585) + 1}},
		},
	},
	{
		name:   "decay by half-lives",
		limits: []ratelimit.Limit{lim(10, time.Second, 1)},
		steps: []step{
			{at: 0, allowed: true, scores: []float64{1}},
			{at: 1000 * ms, allowed: true, scores: []float64{1.5}},
			{at: 3000 * ms, allowed: true, scores: []float64{1.375}},
			{at: 3500 * ms, allowed: true, scores: []float64{1.375*math.Exp2(-0.5) + 1}},
		},
	},
	{
		name:   "two windows",
		limits: []ratelimit.Limit{lim(2, time.Second, 1), lim(4, time.Minute, 1)},
		steps: []step{
			{at: 0, allowed: true, scores: []float64{1, 1}},
			{at: 0, allowed: true, scores: []float64{2, 2}},
			// The short window refuses; the long one would admit but is
			// not written. log2(2/1) = 1: exactly one half-life.
			{at: 0, allowed: false, wait: 1000 * ms, scores: []float64{2, 2}},
			{at: 999 * ms, allowed: false, wait: 1 * ms, scores: []float64{2 * math.Exp2(-0.999), 2 * math.Exp2(-0.999/60)}},
			{at: 1000 * ms, allowed: true, scores: []float64{2, 2*a + 1}},
			{at: 2000 * ms, allowed: true, scores: []float64{2, (2*a+1)*a + 1}},
			// Now the long window refuses while the short one would admit;
			// the wait is the long window's.
			{at: 3000 * ms, allowed: false, wait: 22657 * ms, scores: []float64{1, ((2*a+1)*a + 1) * a}},
			{at: 25656 * ms, allowed: false, wait: 1 * ms},
			{at: 25657 * ms, allowed: true},
		},
	},
	{
		name:   "cost",
		limits: []ratelimit.Limit{lim(10, time.Second, 4)},
		steps: []step{
			{at: 0, allowed: true, scores: []float64{4}},
			{at: 0, allowed: true, scores: []float64{8}},
			// 1000·log2(8/6) = 415.04 ms.
			{at: 0, allowed: false, wait: 416 * ms, scores: []float64{8}},
			{at: 415 * ms, allowed: false, wait: 1 * ms},
			{at: 416 * ms, allowed: true, scores: []float64{8*math.Exp2(-0.416) + 4}},
		},
	},
	{
		name:   "zero cost means one",
		limits: []ratelimit.Limit{lim(2, time.Second, 0)},
		steps: []step{
			{at: 0, allowed: true, scores: []float64{1}},
			{at: 0, allowed: true, scores: []float64{2}},
			{at: 0, allowed: false, wait: 1000 * ms, scores: []float64{2}},
		},
	},
	{
		name:   "fractional rate and cost",
		limits: []ratelimit.Limit{lim(2.5, time.Second, 0.5)},
		steps: []step{
			{at: 0, allowed: true, n: 5},
			{at: 0, allowed: false, wait: 322 * ms, scores: []float64{2.5}},
			{at: 321 * ms, allowed: false, wait: 1 * ms},
			{at: 322 * ms, allowed: true},
		},
	},
	{
		name:   "instant before the last write",
		limits: []ratelimit.Limit{lim(3, time.Second, 1)},
		steps: []step{
			{at: 1000 * ms, allowed: true, scores: []float64{1}},
			// An earlier instant decays nothing and does not move the
			// write time back, or the next decision would over-decay.
			{at: 0, allowed: true, scores: []float64{2}},
			{at: 2000 * ms, allowed: true, scores: []float64{2*0.5 + 1}},
		},
	},
	{
		name:   "long idle forgets",
		limits: []ratelimit.Limit{lim(3, time.Second, 1)},
		steps: []step{
			{at: 0, allowed: true, n: 3},
			{at: 0, allowed: false, wait: 585 * ms},
			{at: 2000 * time.Second, allowed: true, scores: []float64{1}},
		},
	},
	{
		name:   "long half-life",
		limits: []ratelimit.Limit{lim(240, time.Hour, 1)},
		steps: []step{
			{at: 0, allowed: true, n: 240},
			// 3600000·log2(240/239) = 21685.8 ms.
			{at: 0, allowed: false, wait: 21686 * ms, scores: []float64{240}},
		},
	},
	{
		name:   "no limits pass free",
		limits: nil,
		steps:  []step{{at: 0, allowed: true, scores: []float64{}, n: 3}},
	},
}

// Scorer decides one message like ratelimit.Store's Decide and also returns
// each window's score after the decision (written when admitted; decayed
// but unwritten when refused), in the windows' order. Scores are what the
// suite checks besides decisions and waits, and only the suite needs them,
// so no store exports a way to get them: each store's own tests build its
// Scorer from unexported code.
type Scorer func(ctx context.Context, key string, ws *ratelimit.Windows, now time.Time) (ratelimit.Decision, []float64, error)

// Decide is s without the scores.
func (s Scorer) Decide(ctx context.Context, key string, ws *ratelimit.Windows, now time.Time) (ratelimit.Decision, error) {
	d, _, err := s(ctx, key, ws, now)
	return d, err
}

// Run runs the conformance suite. newStore is called once per subtest; it
// may return the same store each time (every subtest uses keys of its own,
// unique to this run) or a fresh one.
func Run(t *testing.T, newStore func(t *testing.T) Scorer) {
	t.Helper()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i, tc := range table {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			ws := MustWindows(tc.limits...)
			key := fmt.Sprintf("{storetest-%s-%d}:message:EVENT", run, i)
			for j, st := range tc.steps {
				for k := 0; k < max(st.n, 1); k++ {
					d, scores, err := s(context.Background(), key, ws, T0.Add(st.at))
					if err != nil {
						t.Fatalf("step %d (+%v) #%d: %v", j, st.at, k, err)
					}
					checkDecision(t, fmt.Sprintf("step %d (+%v) #%d", j, st.at, k), d, scores, len(tc.limits), st)
				}
			}
		})
	}
	t.Run("keys are independent", func(t *testing.T) {
		s := newStore(t)
		limits := MustWindows(lim(2, time.Second, 1))
		k1 := "{storetest-" + run + "-a}:message:EVENT"
		k2 := "{storetest-" + run + "-b}:message:EVENT"
		k3 := "{storetest-" + run + "-a}:message:REQ"
		for range 2 {
			mustDecide(t, s, k1, limits, T0, true)
		}
		mustDecide(t, s, k1, limits, T0, false)
		mustDecide(t, s, k2, limits, T0, true)
		mustDecide(t, s, k3, limits, T0, true)
	})
	t.Run("concurrent burst is atomic", func(t *testing.T) {
		s := newStore(t)
		limits := MustWindows(lim(50, time.Second, 1), lim(80, time.Minute, 1))
		key := "{storetest-" + run + "-conc}:message:EVENT"
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 12 {
					d, err := s.Decide(context.Background(), key, limits, T0)
					if err != nil {
						t.Errorf("goroutine %d: %v", g, err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		// 96 attempts at one instant: exactly the short window's burst.
		if got := admitted.Load(); got != 50 {
			t.Errorf("admitted %d of 96 at one instant, want exactly 50", got)
		}
	})
	t.Run("waiting the reported wait is exact", func(t *testing.T) {
		WaitIsExact(t, newStore(t), 1, 400)
	})
}

func mustDecide(t *testing.T, s Scorer, key string, limits *ratelimit.Windows, at time.Time, allowed bool) ratelimit.Decision {
	t.Helper()
	d, err := s.Decide(context.Background(), key, limits, at)
	if err != nil {
		t.Fatalf("%s at %v: %v", key, at, err)
	}
	if d.Allowed != allowed {
		t.Fatalf("%s at %v: allowed = %v, want %v (%+v)", key, at, d.Allowed, allowed, d)
	}
	return d
}

func checkDecision(t *testing.T, what string, d ratelimit.Decision, scores []float64, n int, st step) {
	t.Helper()
	if d.Allowed != st.allowed {
		t.Fatalf("%s: allowed = %v, want %v (%+v)", what, d.Allowed, st.allowed, d)
	}
	if d.Allowed && d.Wait != 0 {
		t.Errorf("%s: admitted with wait %v", what, d.Wait)
	}
	if !d.Allowed {
		if d.Wait < ms || d.Wait%ms != 0 {
			t.Errorf("%s: refused with wait %v, want a whole number of ms ≥ 1ms", what, d.Wait)
		}
		if st.wait != 0 && d.Wait != st.wait {
			t.Errorf("%s: wait = %v, want %v", what, d.Wait, st.wait)
		}
	}
	if len(scores) != n {
		t.Errorf("%s: %d scores for %d windows", what, len(scores), n)
		return
	}
	if st.scores != nil {
		for i, want := range st.scores {
			if !Close(scores[i], want) {
				t.Errorf("%s: score[%d] = %.17g, want %.17g", what, i, scores[i], want)
			}
		}
	}
}

// MustWindows is ratelimit.NewWindows for limits known to be valid, as in
// a test's table; it panics on an invalid list.
func MustWindows(limits ...ratelimit.Limit) *ratelimit.Windows {
	w, err := ratelimit.NewWindows(limits...)
	if err != nil {
		panic(err)
	}
	return w
}

// Close reports whether two scores agree within Tolerance, relative.
func Close(got, want float64) bool {
	if got == want {
		return true
	}
	return math.Abs(got-want) <= Tolerance*math.Max(math.Abs(got), math.Abs(want))
}

// RandomLimits returns 1 to 3 valid limits with distinct periods, drawn from r.
func RandomLimits(r *rand.Rand) []ratelimit.Limit {
	return limitSet(r, func() ratelimit.Limit {
		p := time.Duration(1+r.IntN(120_000)) * ms
		var cost float64
		switch r.IntN(3) {
		case 0:
			cost = 1
		case 1:
			cost = 0.05 + r.Float64()*3
		default:
			cost = float64(1 + r.IntN(5))
		}
		return ratelimit.Limit{Rate: cost * (1.01 + r.Float64()*40), Period: p, Cost: cost}
	})
}

// limitSet returns 1 to 3 limits from draw, with distinct periods: a key
// has one window per period.
func limitSet(r *rand.Rand, draw func() ratelimit.Limit) []ratelimit.Limit {
	n := 1 + r.IntN(3)
	out := make([]ratelimit.Limit, 0, n)
	seen := map[time.Duration]bool{}
	for len(out) < n {
		l := draw()
		if !seen[l.Period] {
			seen[l.Period] = true
			out = append(out, l)
		}
	}
	return out
}

// degeneratePeriods are half-lives at the edges: the shortest a key can
// hold, odd ones, and ones long enough that waits reach the 2^40 ms cap.
var degeneratePeriods = []time.Duration{
	ms, 2 * ms, 3 * ms, 7 * ms, 999 * ms, 60002 * ms, time.Hour,
	30 * 24 * time.Hour, 365 * 24 * time.Hour, 10 * 365 * 24 * time.Hour,
}

// DegenerateLimits returns 1 to 3 valid limits with distinct periods that
// stress the arithmetic rather than model a relay: R a few ulps or a tiny
// fraction above c (adding c then absorbs most of R−c, and the true wait is
// far from T·log2(S/(R−c))), costs far from 1, and periods from 1 ms to
// ten years (waits up to the 2^40 ms cap).
func DegenerateLimits(r *rand.Rand) []ratelimit.Limit {
	return limitSet(r, func() ratelimit.Limit {
		var p time.Duration
		if r.IntN(2) == 0 {
			p = degeneratePeriods[r.IntN(len(degeneratePeriods))]
		} else {
			p = time.Duration(1+r.Int64N(1<<r.IntN(40))) * ms
		}
		var cost float64
		switch r.IntN(4) {
		case 0:
			cost = 1
		case 1:
			cost = 1.0 / float64(3+r.IntN(20)) // 1/6 is the fuzzer's find
		case 2:
			cost = math.Exp2(float64(r.IntN(60)-30)) * (1 + r.Float64())
		default:
			cost = float64(1 + r.IntN(1000))
		}
		var rate float64
		switch r.IntN(4) {
		case 0: // a few ulps above c
			rate = cost
			for range 1 + r.IntN(4) {
				rate = math.Nextafter(rate, math.Inf(1))
			}
		case 1: // a tiny fraction above c
			rate = cost * (1 + math.Pow(10, -float64(6+r.IntN(10))))
		case 2: // far above c
			rate = cost * math.Pow(10, float64(1+r.IntN(9)))
		default:
			rate = cost * (1.01 + r.Float64()*3)
		}
		if rate <= cost { // rounding ate the fraction
			rate = math.Nextafter(cost, math.Inf(1))
		}
		return ratelimit.Limit{Rate: rate, Period: p, Cost: cost}
	})
}

// DegenerateCases are limits worth checking on every run, whatever the seed.
var DegenerateCases = [][]ratelimit.Limit{
	// Found by FuzzDecide: the first admitting millisecond is minutes after
	// ceil(T·log2(S/(R−c))).
	{{Rate: 0.16666666666666669, Period: 60002 * ms, Cost: 0.16666666666666666}},
	{{Rate: math.Nextafter(1, 2), Period: ms, Cost: 1}},
	{{Rate: math.Nextafter(1, 2), Period: 10 * 365 * 24 * time.Hour, Cost: 1}},
	{{Rate: 3, Period: time.Second, Cost: 1}, {Rate: math.Nextafter(0.1, 1), Period: time.Hour, Cost: 0.1}},
	{{Rate: 1e9, Period: 2 * ms, Cost: 1e-9}},
}

// WaitIsExact drives store with seeded random limits and arrivals: every
// time a message is refused with wait w at instant t, the same message at
// t+w−1ms must be refused and at t+w admitted. rounds is the number of
// random limit sets; each gets a key of its own.
func WaitIsExact(t *testing.T, store ratelimit.Store, seed uint64, rounds int) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0x5105e))
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	ctx := context.Background()
	refusals := 0
	for round := range rounds {
		list := RandomLimits(r)
		limits := MustWindows(list...)
		key := fmt.Sprintf("{storetest-wait-%s-%d}:message:EVENT", run, round)
		shortest := list[0].Period
		for _, l := range list {
			shortest = min(shortest, l.Period)
		}
		now := T0
		for range 12 {
			// Mostly bursts at one instant, sometimes a gap up to 2 half-lives.
			if r.IntN(3) == 0 {
				now = now.Add(time.Duration(r.Int64N(int64(2*shortest/ms)+1)) * ms)
			}
			d, err := store.Decide(ctx, key, limits, now)
			if err != nil {
				t.Fatalf("round %d %v: %v", round, limits, err)
			}
			if d.Allowed {
				continue
			}
			refusals++
			if d.Wait < ms || d.Wait%ms != 0 {
				t.Fatalf("round %d %v: refused with wait %v", round, limits, d.Wait)
			}
			if d.Wait > ms {
				early, err := store.Decide(ctx, key, limits, now.Add(d.Wait-ms))
				if err != nil {
					t.Fatal(err)
				}
				if early.Allowed {
					t.Fatalf("round %d %v: refused at %v with wait %v, but admitted 1ms sooner than that",
						round, limits, now.Sub(T0), d.Wait)
				}
			}
			now = now.Add(d.Wait)
			on, err := store.Decide(ctx, key, limits, now)
			if err != nil {
				t.Fatal(err)
			}
			if !on.Allowed {
				t.Fatalf("round %d %v: told to wait %v, but refused again after exactly that (wait %v)",
					round, limits, d.Wait, on.Wait)
			}
		}
	}
	if refusals < rounds {
		t.Errorf("only %d refusals in %d rounds: the property was barely exercised", refusals, rounds)
	}
}

// Agree drives two stores with the same seeded random limits and arrivals
// and fails at the first decision they disagree on: allowed, wait, or any
// score, all compared exactly. The stores compute the decay alike to the
// last bit (ratelimit's exp2neg and internal/scripts/ewma.lua's decay do the same
// IEEE operations), so a last-bit difference in a score is a regression —
// C pow against math.Exp2 differ so for about one x in eight
// (scripts.TestPowIsNotExp2) — and one that, at an exact boundary, would
// flip an admission and move a wait by 1 ms. newWant returns the reference
// store (the memory store) afresh for every round, which uses one key: a
// fixed-size table lets two keys share a slot by design, and that sharing
// is not a disagreement worth failing on.
func Agree(t *testing.T, newWant func() Scorer, got Scorer, seed uint64, rounds int) {
	t.Helper()
	AgreeOn(t, newWant, got, seed, rounds, RandomLimits)
}

// AgreeDegenerate is Agree over DegenerateCases and then rounds sets of
// DegenerateLimits: the stores must agree on the exact wait even where
// T·log2(S/(R−c)) is far from it.
func AgreeDegenerate(t *testing.T, newWant func() Scorer, got Scorer, seed uint64, rounds int) {
	t.Helper()
	i := 0
	AgreeOn(t, newWant, got, seed, len(DegenerateCases)+rounds, func(r *rand.Rand) []ratelimit.Limit {
		if i < len(DegenerateCases) {
			i++
			return DegenerateCases[i-1]
		}
		return DegenerateLimits(r)
	})
}

// AgreeOn is Agree over limit sets drawn by limits.
func AgreeOn(t *testing.T, newWant func() Scorer, got Scorer, seed uint64, rounds int, limits func(*rand.Rand) []ratelimit.Limit) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0xa9ee))
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	ctx := context.Background()
	decisions, refused := 0, 0
	draw := limits
	for round := range rounds {
		want := newWant()
		list := draw(r)
		limits := MustWindows(list...)
		key := fmt.Sprintf("{storetest-agree-%s-%d}:message:EVENT", run, round)
		now := T0.Add(time.Duration(r.IntN(1000)) * ms)
		for range 20 {
			if r.IntN(2) == 0 {
				now = now.Add(time.Duration(r.Int64N(int64(list[0].Period/ms)+1)) * ms)
			}
			dw, sw, errw := want(ctx, key, limits, now)
			dg, sg, errg := got(ctx, key, limits, now)
			if errw != nil || errg != nil {
				t.Fatalf("round %d: errors %v / %v", round, errw, errg)
			}
			decisions++
			if !dw.Allowed {
				refused++
			}
			if dw.Allowed != dg.Allowed || dw.Wait != dg.Wait || len(sw) != limits.Len() || len(sg) != limits.Len() {
				t.Fatalf("round %d %v at +%v: want %+v %v, got %+v %v", round, limits, now.Sub(T0), dw, sw, dg, sg)
			}
			for i := range sw {
				if sg[i] != sw[i] {
					t.Fatalf("round %d %v at +%v: score[%d] want %.17g got %.17g", round, limits, now.Sub(T0), i, sw[i], sg[i])
				}
			}
		}
	}
	if refused == 0 || refused == decisions {
		t.Errorf("%d of %d decisions refused: the comparison was one-sided", refused, decisions)
	}
}
