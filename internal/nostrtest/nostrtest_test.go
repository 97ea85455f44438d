package nostrtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

func TestClock(t *testing.T) {
	c := NewClock()
	if !c.Now().Equal(T0) {
		t.Fatalf("NewClock at %v, want T0 %v", c.Now(), T0)
	}
	c.Advance(6 * time.Second)
	if want := T0.Add(6 * time.Second); !c.Now().Equal(want) {
		t.Fatalf("after Advance: %v, want %v", c.Now(), want)
	}
}

// TestOutageStore: while Down every decision is ErrUnavailable; up again,
// the memory store beneath decides, with the budget it had.
func TestOutageStore(t *testing.T) {
	s := &OutageStore{Store: ratelimit.NewMemoryStore(16)}
	limits := []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
	ctx := context.Background()
	if d, err := s.Decide(ctx, "k", limits, T0); err != nil || !d.Allowed {
		t.Fatalf("first: %+v, %v; want allowed", d, err)
	}
	s.Down.Store(true)
	if _, err := s.Decide(ctx, "k", limits, T0); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("down: %v, want ErrUnavailable", err)
	}
	s.Down.Store(false)
	if d, err := s.Decide(ctx, "k", limits, T0); err != nil || d.Allowed {
		t.Fatalf("up again: %+v, %v; want refused (1.5 per hour, one charged)", d, err)
	}
}
