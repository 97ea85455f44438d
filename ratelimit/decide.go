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
	if x > 1100 {
		return 0 // 2^-1100 is below the smallest float64; skip the subnormals
	}
	return s * math.Exp2(-x)
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
