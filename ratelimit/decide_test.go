package ratelimit

import (
	"math"
	"math/rand"
	"testing"
	"time"
)

// TestWaitMsIsTheSmallestAdmittingMillisecond compares waitMs with its
// definition — the first millisecond at which the admission test admits —
// on scores built to sit within float error of a millisecond boundary
// (s = room·2^(m/T)), where a wait computed from Log2 alone is off by one.
func TestWaitMsIsTheSmallestAdmittingMillisecond(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	boundary := 0
	for range 20000 {
		periodMs := float64(1 + rng.Intn(100000))
		c := 1.0
		if rng.Intn(2) == 0 {
			c = 0.1 + 3*rng.Float64()
		}
		r := c * (1.001 + 20*rng.Float64())
		room := r - c
		m := 1 + rng.Int63n(int64(periodMs)*8)
		s := room * math.Exp2(float64(m)/periodMs)
		at := rng.Int63n(1 << 41)
		now := at + rng.Int63n(m) // refused at now (m ms after at it is about the boundary)
		if rng.Intn(4) == 0 {
			now = at - rng.Int63n(5000) // an instant before the write
		}
		admits := func(x int64) bool { return decayAt(s, at, x, periodMs)+c <= r }
		if admits(now) {
			continue
		}
		// The admission test is monotone in time: binary search for the
		// first admitting millisecond.
		lo, hi := int64(0), int64(1)<<42 // refuses at now+lo, admits at now+hi
		for hi-lo > 1 {
			if mid := lo + (hi-lo)/2; admits(now + mid) {
				hi = mid
			} else {
				lo = mid
			}
		}
		want := hi
		if want == m+at-now {
			boundary++
		}
		if got := waitMs(s, at, now, periodMs, c, r); got != want {
			t.Fatalf("waitMs(s=%v at=%d now=%d T=%vms c=%v r=%v) = %d, want %d", s, at, now, periodMs, c, r, got, want)
		}
	}
	if boundary < 1000 {
		t.Fatalf("only %d cases on a boundary", boundary)
	}
}

func TestDecayAt(t *testing.T) {
	tests := []struct {
		name     string
		s        float64
		at, now  int64
		periodMs float64
		want     float64
	}{
		{"no time", 5, 100, 100, 1000, 5},
		{"now before written", 5, 100, 50, 1000, 5},
		{"one half-life", 5, 0, 1000, 1000, 2.5},
		{"underflow is zero", 5, 0, 1 << 40, 1, 0},
		{"far past is zero, not NaN", math.MaxFloat64, 0, 1 << 40, 1, 0},
		{"subnormal region is zero", 1, 0, 1090, 1, 0},
	}
	for _, tt := range tests {
		if got := decayAt(tt.s, tt.at, tt.now, tt.periodMs); got != tt.want {
			t.Errorf("%s: decayAt = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestDecideIsPure: a refusal leaves the state it was given untouched apart
// from reporting decayed scores, and an admission writes decayed+c at now.
func TestDecideIsPure(t *testing.T) {
	limits := MustWindows(PerPeriod(2, time.Second), PerPeriod(10, time.Minute))
	score := []float64{2, 1}
	at := []int64{1000, 1000}
	out := make([]float64, 2)
	ok, wait := decide(limits, score, at, 1000, out)
	if ok || wait != time.Second {
		t.Fatalf("decide = %v %v, want refused for 1s", ok, wait)
	}
	if at[0] != 1000 || at[1] != 1000 || out[0] != 2 || out[1] != 1 {
		t.Fatalf("refusal changed state: at %v out %v", at, out)
	}
	score = []float64{2, 1}
	ok, wait = decide(limits, score, at, 2000, out)
	if !ok || wait != 0 {
		t.Fatalf("decide a second later = %v %v, want admitted", ok, wait)
	}
	if at[0] != 2000 || at[1] != 2000 || score[0] != 2 || out[1] != score[1] || math.Abs(score[1]-(1*math.Exp2(-1.0/60)+1)) > 1e-15 {
		t.Fatalf("admission wrote score %v at %v (out %v)", score, at, out)
	}
}

// FuzzDecide drives decide with arbitrary limits and arrival gaps and checks
// what must hold for every valid limit: no error, finite scores never above
// the rate once written, and a wait that is a whole number of milliseconds
// after which the message is admitted and 1 ms before which it is not.
func FuzzDecide(f *testing.F) {
	f.Add(3.0, 1.0, uint32(1000), 10.0, uint32(60000), []byte{0, 0, 0, 0, 200, 1, 90})
	f.Add(0.3, 0.1, uint32(1), 1e9, uint32(1), []byte{0, 0, 0, 255, 255})
	f.Add(1.5, 1.0, uint32(86_400_000), 2.5, uint32(7), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, r1, c1 float64, p1 uint32, r2 float64, p2 uint32, gaps []byte) {
		list := []Limit{{Rate: r1, Period: time.Duration(p1) * time.Millisecond, Cost: c1}}
		if p2 != p1 {
			list = append(list, Limit{Rate: r2, Period: time.Duration(p2) * time.Millisecond, Cost: c1})
		}
		limits, err := NewWindows(list...)
		if err != nil {
			return
		}
		n := len(list)
		score, at := make([]float64, n), make([]int64, n)
		work, workAt := make([]float64, n), make([]int64, n)
		try := func(now int64) (bool, time.Duration) {
			copy(work, score)
			copy(workAt, at)
			return decide(limits, work, workAt, now, nil)
		}
		now := int64(1_700_000_000_000)
		for _, g := range gaps {
			now += int64(g) * int64(g) // 0 to 65 s, mostly short
			ok, wait := try(now)
			if !ok {
				if wait < time.Millisecond || wait%time.Millisecond != 0 {
					t.Fatalf("%v at %d: wait %v", limits, now, wait)
				}
				w := int64(wait / time.Millisecond)
				if w < maxWaitMs {
					if early, _ := try(now + w - 1); early {
						t.Fatalf("%v: admitted 1ms before the wait %v", limits, wait)
					}
					if late, _ := try(now + w); !late {
						t.Fatalf("%v: refused at the end of the wait %v", limits, wait)
					}
				}
				continue
			}
			ok, _ = decide(limits, score, at, now, nil)
			if !ok {
				t.Fatal("decide is not deterministic")
			}
			for i, s := range score {
				if !(s >= 0 && s <= list[i].Rate) {
					t.Fatalf("%v: wrote score %v", limits, s)
				}
			}
		}
	})
}

// TestWaitMs: the wait of a refused message from its decayed score, for a
// 3/1s limit: T·log2(decayed/(R−c)) rounded up, never 0, and not the
// off-by-one T·log2(decayed/R).
func TestWaitMs(t *testing.T) {
	for _, tt := range []struct {
		decayed float64
		want    int64
	}{
		{3, 585},         // 1s·log2(3/2) = 584.96ms, rounded up; log2(3/3) would say 0
		{4, 1000},        // exactly one half-life
		{2.0000001, 1},   // a hair over: the smallest wait is 1ms, never 0
		{2.9990, 585},    // 584.48ms rounded up
		{1e300, 995_579}, // 1s·log2(1e300/2) = 995.5784s: far over, still exact
	} {
		if got := waitMs(tt.decayed, 0, 0, 1000, 1, 3); got != tt.want {
			t.Errorf("waitMs(%v) = %d ms, want %d", tt.decayed, got, tt.want)
		}
	}
}
