package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/wire"
)

func TestEffectiveMaxFilters(t *testing.T) {
	if got := EffectiveMaxFilters(0, nil); got != DefaultMaxFilters {
		t.Errorf("EffectiveMaxFilters(0, nil) = %d", got)
	}
	if got := EffectiveMaxFilters(50, []ratelimit.Limit{{Rate: 20, Period: time.Second, Cost: 2}}); got != 9 {
		t.Errorf("EffectiveMaxFilters under rate 20, cost 2 = %d, want 9 (9·2 < 20)", got)
	}
	if got := EffectiveMaxFilters(50, []ratelimit.Limit{{Rate: 1.5, Period: time.Second}}); got != 1 {
		t.Errorf("EffectiveMaxFilters under rate 1.5 = %d, want 1", got)
	}
}

// TestCompile: the compiled windows are the configured ones, a REQ of n
// filters costs n REQs in every window, and an invalid limit is refused
// with the type named.
func TestCompile(t *testing.T) {
	l := DefaultLimits()
	p, err := Compile(l, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.MaxFilters() != DefaultMaxFilters {
		t.Errorf("MaxFilters = %d", p.MaxFilters())
	}
	if !p.Free(wire.TypeCLOSE) || p.Free(wire.TypeOther) || p.Free(wire.TypeEVENT) {
		t.Error("CLOSE must be free, OTHER and EVENT charged")
	}
	if got := p.Message(wire.TypeEVENT).Limits(); len(got) != 2 || got[0] != l.Message[wire.TypeEVENT][0] {
		t.Errorf("EVENT windows %v", got)
	}
	for n := 1; n <= p.MaxFilters(); n++ {
		w := p.REQ(n)
		for i, lim := range l.Message[wire.TypeREQ] {
			if got := w.Limit(i); got.Rate != lim.Rate || got.Period != lim.Period || got.Cost != float64(n)*lim.EffectiveCost() {
				t.Errorf("REQ of %d filters, window %d: %+v", n, i, got)
			}
		}
	}
	if p.Connection().Len() != len(l.Connection) {
		t.Errorf("connection windows %v", p.Connection())
	}
	l.Message[wire.TypeCOUNT] = []ratelimit.Limit{ratelimit.PerPeriod(1, time.Second)}
	if _, err := Compile(l, 0); !errors.Is(err, ratelimit.ErrInvalidLimit) || !strings.Contains(err.Error(), "COUNT") {
		t.Errorf("Compile with COUNT rate = cost: %v, want ErrInvalidLimit naming COUNT", err)
	}
}
