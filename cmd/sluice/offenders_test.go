package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/internal/nostrtest"
)

// The heavy hitters of a stream are found, in order, whatever else passes
// through; a million distinct clients leave the view at its size; counts
// halve every half-life, and clients that fade away leave.
func TestOffenders(t *testing.T) {
	clk := nostrtest.NewClock()
	// 64 counters over ~1.1 M refusals: any client with more than 1/64 of
	// them (17,800) is guaranteed a place.
	o := NewOffenders(64, time.Minute, clk.Now)
	for i := range 1_000_000 {
		o.Add(fmt.Sprint("noise-", i))
		switch {
		case i%10 == 0:
			o.Add("heavy")
		case i%25 == 0:
			o.Add("medium")
		}
	}
	if n := len(o.entries); n != 64 || len(o.index) != 64 {
		t.Fatalf("%d entries, %d indexed after a million clients, want 64", n, len(o.index))
	}
	top := o.Top(2)
	if len(top) != 2 || top[0].Client != "heavy" || top[1].Client != "medium" {
		t.Fatalf("top two %+v, want heavy then medium", top)
	}
	// Space-Saving: a count is at least the truth and at most its
	// overestimate above it.
	if top[0].Refusals < 100_000 || top[0].Refusals-top[0].Overestimate > 100_000 {
		t.Errorf("heavy: %+v, true count 100000", top[0])
	}

	clk.Advance(time.Minute)
	if got := o.Top(1)[0].Refusals; got < 50_000 || got > 50_000+top[0].Overestimate/2+1 {
		t.Errorf("heavy a half-life later: %v, want about half of %v", got, top[0].Refusals)
	}
	clk.Advance(40 * time.Minute) // 2^-40 of a million is far below 1e-3
	if got := o.Top(0); len(got) != 0 {
		t.Errorf("after 40 half-lives %d clients remain: %+v", len(got), got)
	}
	o.Add("new")
	if got := o.Top(0); len(got) != 1 || got[0].Client != "new" || got[0].Refusals != 1 {
		t.Errorf("after the fade: %+v", got)
	}
}
