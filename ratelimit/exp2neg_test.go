package ratelimit

import (
	"math"
	"math/rand"
	"testing"
)

// TestExp2negBits pins exp2neg's bits: they must be the same on every
// GOARCH and GOAMD64 level (and they are internal/scripts/ewma.lua's, see
// scripts.TestScriptsAgreeWithGo), so a compiler fusing one of its
// products into a multiply-add, or a change of its steps, fails here on
// the machine where it happens.
func TestExp2negBits(t *testing.T) {
	for _, c := range []struct {
		x    float64
		bits uint64
	}{
		{1e-09, 0x3fefffffffa0bc0d},
		{0.001, 0x3feffa52de61c11f},
		{0.5, 0x3fe6a09e667f3bcc},
		{0.75, 0x3fe306fe0a31b715},
		{1.0 / 3, 0x3fe965fea53d6e3c},
		{1, 0x3fe0000000000000},
		{2.5, 0x3fc6a09e667f3bcc},
		{33.142857142857146, 0x3ddcfbb031a74194},
		{1000.0 / 60000, 0x3fefa1e827a1b38c},
		{1022.5, 0xb504f333f9de6},
		{1073.9, 0x1},
	} {
		if got := math.Float64bits(exp2neg(c.x)); got != c.bits {
			t.Errorf("exp2neg(%v) = %#x, want %#x", c.x, got, c.bits)
		}
	}
}

// TestExp2negIsExp2: exp2neg(x) is math.Exp2(-x) to within one ulp for
// every x a decision meets (it is math.Exp2's pure-Go algorithm, which
// amd64 without FMA runs as is: there they are equal).
func TestExp2negIsExp2(t *testing.T) {
	rng := rand.New(rand.NewSource(9))
	equal := 0
	const n = 200000
	for i := 0; i < n; i++ {
		x := rng.Float64() * 1074
		if i%2 == 0 {
			x = float64(1+rng.Int63n(1<<20)) / float64(1+rng.Int63n(1<<30))
		}
		got, want := exp2neg(x), math.Exp2(-x)
		if got == want {
			equal++
		} else if got != math.Nextafter(want, got) {
			t.Fatalf("exp2neg(%v) = %v, math.Exp2(-x) = %v: more than one ulp apart", x, got, want)
		}
	}
	t.Logf("exp2neg(x) == math.Exp2(-x) for %d of %d x", equal, n)
}
