package ratelimit

import (
	"math"
	"time"
)

// MaxWindows is the most limits one key may have. ValidateLimits refuses
// more; the memory store decides up to this many windows without touching
// the heap.
const MaxWindows = 8

// maxWaitMs caps a wait (about 34 years) so that no arithmetic on it can
// overflow; a wait that long only arises from absurd configurations.
const maxWaitMs = 1 << 40

// decayAt returns score s written at unix millisecond at, seen at unix
// millisecond now, under half-life periodMs. This one expression is the
// admission test's and the wait search's, so the two can never disagree.
func decayAt(s float64, at, now int64, periodMs float64) float64 {
	dt := now - at
	if dt <= 0 {
		return s // a score never decays for time that has not passed
	}
	x := float64(dt) / periodMs
	if x > 1074 {
		return 0 // 2^-x is below half the smallest float64 (math.Exp2 says 0 too)
	}
	return s * exp2neg(x)
}

// exp2neg returns 2^-x for 0 < x ≤ 1074 by the steps of math.Exp2's pure-Go
// algorithm (argument reduction to |k−x| ≤ ½, its polynomial, Ldexp), each
// product converted to float64 so that no compiler fuses it into a
// multiply-add. It is therefore the same bits on every GOARCH and GOAMD64
// level — math.Exp2 is assembly on arm64 and loong64 and fused on amd64 v3 —
// and the same bits as internal/scripts/ewma.lua's decay, which does these steps in
// Lua, where each operation is one IEEE double operation: the Redis store
// and the memory store decide alike to the last bit, at an exact boundary
// too (scripts.TestScriptsAgreeWithGo). On amd64 v1 it equals math.Exp2(-x).
func exp2neg(x float64) float64 {
	const (
		ln2Hi = 6.93147180369123816490e-01
		ln2Lo = 1.90821492927058770002e-10
		p1    = 1.66666666666666657415e-01
		p2    = -2.77777777770155933842e-03
		p3    = 6.61375632143793436117e-05
		p4    = -1.65339022054652515390e-06
		p5    = 4.13813679705723846039e-08
	)
	k := math.Floor(x + 0.5)
	t := k - x
	hi := float64(t * ln2Hi)
	lo := float64(-t * ln2Lo)
	r := hi - lo
	q := float64(r * r)
	c := r - float64(q*(p1+float64(q*(p2+float64(q*(p3+float64(q*(p4+float64(q*p5)))))))))
	return math.Ldexp(1-((lo-float64(r*c)/(2-c))-hi), -int(k))
}

// decide is the whole decision for one key against prepared windows (valid
// by construction: NewWindows checked them), pure and allocation-free. Per
// window i it is given the stored score[i] and the unix millisecond at[i] it
// was written; now is the instant of the decision in unix milliseconds.
//
// The message is admitted when every window has decayed+cost ≤ rate. Then
// score[i] and at[i] hold what must be written back (decayed+cost, at the
// later of now and at[i]). When refused, score[i] holds the decayed score and
// at[i] is unchanged: the caller writes nothing. Either way out[i] (when out
// is not nil) receives score[i].
//
// The wait is the largest, over the refusing windows, of the smallest whole
// number of milliseconds w ≥ 1 such that the same admission test run at
// now+w admits. It starts from T·log2(S/(R−c)) rounded up and is then
// confirmed by running the admission test itself at w and w−1 (searching
// further when float error is large, see waitMs), so float error in Log2 or
// Exp2 can never make an obedient client be refused, and a client coming
// back 1 ms sooner is always refused.
func decide(ws *Windows, score []float64, at []int64, now int64, out []float64) (bool, time.Duration) {
	allowed := true
	var wait int64
	for i := range ws.win {
		l := &ws.win[i]
		s, w := score[i], at[i]
		d := decayAt(s, w, now, l.periodMs)
		score[i] = d
		if d+l.cost <= l.rate {
			continue
		}
		allowed = false
		if wi := waitMs(s, w, now, l.periodMs, l.cost, l.rate); wi > wait {
			wait = wi
		}
	}
	if allowed {
		for i := range ws.win {
			score[i] += ws.win[i].cost
			if now > at[i] {
				at[i] = now
			}
		}
		wait = 0
	}
	if out != nil {
		copy(out, score[:len(ws.win)])
	}
	return allowed, time.Duration(wait) * time.Millisecond
}

// waitMs returns the smallest w ≥ 1 (milliseconds) such that score s written
// at at admits a message of cost c under rate r at now+w. The caller has
// established that it refuses at now.
//
// The estimate T·log2(S/(R−c)) is right to far better than a millisecond for
// any sane limit, and then two probes of the admission test confirm it. When
// float error is large — R barely above c, where adding c to the score
// absorbs most of R−c — the probes gallop away from the estimate and a
// binary search finds the boundary, so the answer is exact for any limit.
func waitMs(s float64, at, now int64, periodMs, c, r float64) int64 {
	admits := func(w int64) bool { return decayAt(s, at, now+w, periodMs)+c <= r }
	// Time after at until the score has decayed to r−c, from the stored
	// score rather than the decayed one so that no rounding compounds.
	d := periodMs * math.Log2(s/(r-c))
	if !(d < maxWaitMs) { // also catches NaN
		d = maxWaitMs
	}
	w := at + int64(math.Ceil(d)) - now
	w = min(max(w, 1), maxWaitMs)

	// Bracket the boundary: lo refuses (0 is known to), hi admits.
	var lo, hi int64
	if admits(w) {
		hi = w
		for step := int64(1); ; step *= 2 {
			if hi-step <= 0 {
				lo = 0
				break
			}
			if !admits(hi - step) {
				lo = hi - step
				break
			}
			hi -= step
		}
	} else {
		lo = w
		for step := int64(1); ; step *= 2 {
			if lo+step >= maxWaitMs {
				if !admits(maxWaitMs) {
					return maxWaitMs // never, in practice: the longest wait we report
				}
				hi = maxWaitMs
				break
			}
			if admits(lo + step) {
				hi = lo + step
				break
			}
			lo += step
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if admits(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}
