package ratelimit_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

func TestLimitValidate(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name string
		l    ratelimit.Limit
		ok   bool
	}{
		{"plain", ratelimit.PerPeriod(10, time.Second), true},
		{"zero cost means 1", ratelimit.Limit{Rate: 2, Period: time.Second}, true},
		{"fractional cost", ratelimit.Limit{Rate: 1, Period: time.Second, Cost: 0.5}, true},
		{"one millisecond", ratelimit.PerPeriod(2, time.Millisecond), true},
		{"zero period", ratelimit.PerPeriod(10, 0), false},
		{"negative period", ratelimit.PerPeriod(10, -time.Second), false},
		{"sub-millisecond period", ratelimit.PerPeriod(10, 999*time.Microsecond), false},
		{"fractional milliseconds", ratelimit.PerPeriod(10, 1500*time.Microsecond), false},
		{"rate equals cost", ratelimit.PerPeriod(1, time.Second), false},
		{"rate below cost", ratelimit.Limit{Rate: 2, Period: time.Second, Cost: 3}, false},
		{"zero rate", ratelimit.PerPeriod(0, time.Second), false},
		{"negative rate", ratelimit.PerPeriod(-5, time.Second), false},
		{"negative cost", ratelimit.Limit{Rate: 5, Period: time.Second, Cost: -1}, false},
		{"NaN rate", ratelimit.PerPeriod(nan, time.Second), false},
		{"Inf rate", ratelimit.PerPeriod(inf, time.Second), false},
		{"NaN cost", ratelimit.Limit{Rate: 5, Period: time.Second, Cost: nan}, false},
		{"Inf cost", ratelimit.Limit{Rate: 5, Period: time.Second, Cost: inf}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.l.Validate()
			if tt.ok && err != nil {
				t.Fatalf("Validate(%+v) = %v, want nil", tt.l, err)
			}
			if !tt.ok && !errors.Is(err, ratelimit.ErrInvalidLimit) {
				t.Fatalf("Validate(%+v) = %v, want ErrInvalidLimit", tt.l, err)
			}
		})
	}
}

// TestNewWindowsValidates: NewWindows refuses an invalid limit, a period
// twice and more than MaxWindows; no limits is valid.
func TestNewWindowsValidates(t *testing.T) {
	validate := func(ls []ratelimit.Limit) error {
		_, err := ratelimit.NewWindows(ls...)
		return err
	}
	sec := ratelimit.PerPeriod(10, time.Second)
	min := ratelimit.PerPeriod(240, time.Minute)
	if err := validate(nil); err != nil {
		t.Errorf("no limits: %v, want nil (the type passes free)", err)
	}
	if err := validate([]ratelimit.Limit{sec, min}); err != nil {
		t.Errorf("two windows: %v", err)
	}
	bad := []struct {
		name   string
		limits []ratelimit.Limit
	}{
		{"one invalid", []ratelimit.Limit{sec, ratelimit.PerPeriod(1, time.Hour)}},
		{"same period twice", []ratelimit.Limit{sec, ratelimit.PerPeriod(20, time.Second)}},
		{"too many", func() []ratelimit.Limit {
			var ls []ratelimit.Limit
			for i := 1; i <= ratelimit.MaxWindows+1; i++ {
				ls = append(ls, ratelimit.PerPeriod(10, time.Duration(i)*time.Second))
			}
			return ls
		}()},
	}
	for _, tt := range bad {
		if err := validate(tt.limits); !errors.Is(err, ratelimit.ErrInvalidLimit) {
			t.Errorf("%s: %v, want ErrInvalidLimit", tt.name, err)
		}
	}
}

func TestLimitMeaning(t *testing.T) {
	tests := []struct {
		l         ratelimit.Limit
		burst     int
		interval  time.Duration // within 1µs
		sustained float64       // per second, within 1e-6 relative
	}{
		// −1s·log2(1−1/10) = 152.003µs·1000
		{ratelimit.PerPeriod(10, time.Second), 10, 152003093, 6.578813},
		{ratelimit.PerPeriod(2, time.Second), 2, time.Second, 1},
		{ratelimit.PerPeriod(240, time.Minute), 240, 361427258, 2.766808}, // ≈ R·ln2/c per T
		{ratelimit.Limit{Rate: 5, Period: time.Second, Cost: 2}, 2, 736965594, 1.356915},
		// 0.1+0.1+0.1 > 0.3 in float: a store admits 2, so Burst says 2.
		{ratelimit.Limit{Rate: 0.3, Period: time.Second, Cost: 0.1}, 2, 584962501, 1.709511},
		{ratelimit.PerPeriod(1, time.Second), 0, 0, 0}, // invalid
	}
	for _, tt := range tests {
		if got := tt.l.Burst(); got != tt.burst {
			t.Errorf("%v: Burst = %d, want %d", tt.l, got, tt.burst)
		}
		if got := tt.l.Interval(); (got - tt.interval).Abs() > time.Microsecond {
			t.Errorf("%v: Interval = %v, want %v", tt.l, got, tt.interval)
		}
		if got := tt.l.Sustained(); math.Abs(got-tt.sustained) > 1e-4*math.Max(1, tt.sustained) {
			t.Errorf("%v: Sustained = %v, want %v", tt.l, got, tt.sustained)
		}
	}
}

func TestLimitString(t *testing.T) {
	for l, want := range map[ratelimit.Limit]string{
		ratelimit.PerPeriod(10, time.Second):        "10/1s",
		{Rate: 2.5, Period: time.Minute, Cost: 0.5}: "2.5/1m0s cost 0.5",
		{Rate: 20, Period: 1500 * time.Millisecond}: "20/1.5s",
	} {
		if got := l.String(); got != want {
			t.Errorf("String(%+v) = %q, want %q", l, got, want)
		}
	}
}
