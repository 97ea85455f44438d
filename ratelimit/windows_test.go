package ratelimit_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// TestNewWindowsRefusesWhatCannotBeDecided: every list ValidateLimits
// refuses is refused when prepared, so no store ever sees it.
func TestNewWindowsRefusesWhatCannotBeDecided(t *testing.T) {
	ok := ratelimit.PerPeriod(10, time.Second)
	for _, l := range []ratelimit.Limit{
		ratelimit.PerPeriod(1, time.Second), // rate = cost: the wait would divide by zero
		{Rate: 0.5, Period: time.Second},    // rate below the default cost 1
		ratelimit.PerPeriod(5, 0),
		ratelimit.PerPeriod(5, 1500*time.Microsecond), // not a whole millisecond
		{Rate: 5, Period: time.Second, Cost: -1},
		ratelimit.PerPeriod(math.NaN(), time.Second),
		ratelimit.PerPeriod(math.Inf(1), time.Second),
		{Rate: 5, Period: time.Second, Cost: math.Inf(1)},
	} {
		if w, err := ratelimit.NewWindows(ok, l); !errors.Is(err, ratelimit.ErrInvalidLimit) || w != nil {
			t.Errorf("NewWindows(%v, %+v) = %v, %v; want ErrInvalidLimit", ok, l, w, err)
		}
	}
	if _, err := ratelimit.NewWindows(ok, ratelimit.PerPeriod(20, time.Second)); !errors.Is(err, ratelimit.ErrInvalidLimit) {
		t.Errorf("two windows of one period: %v, want ErrInvalidLimit", err)
	}
}

// TestWindowsPrepared: what a store reads from prepared windows is what the
// limits say, and the caller's slice is copied.
func TestWindowsPrepared(t *testing.T) {
	list := []ratelimit.Limit{ratelimit.PerPeriod(10, time.Second), {Rate: 2.5, Period: 90 * time.Minute, Cost: 0.5}}
	w := ratelimit.MustWindows(list...)
	list[0].Rate = 99
	if w.Len() != 2 || w.Limit(0).Rate != 10 || w.Limits()[1] != (ratelimit.Limit{Rate: 2.5, Period: 90 * time.Minute, Cost: 0.5}) {
		t.Fatalf("windows %v: not a copy of the limits", w)
	}
	if s := w.String(); s != "10/1s, 2.5/1h30m0s cost 0.5" {
		t.Errorf("String() = %q", s)
	}
	var none *ratelimit.Windows
	if none.Len() != 0 || none.Limits() != nil || none.String() != "" {
		t.Error("nil Windows is not empty")
	}
}

func TestMustWindowsPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("MustWindows of an invalid limit did not panic")
		}
	}()
	ratelimit.MustWindows(ratelimit.PerPeriod(1, time.Second))
}
