package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// TestDecideAllOneCall: a frame of three budgets on one Redis is one
// script call, one round trip; refused by one budget, it writes none of
// them, and the refusal names that budget with its wait.
func TestDecideAllOneCall(t *testing.T) {
	srv, admin := realRedis(t)
	s := newStore(t, client(t, srv.Addr()), slow)
	ctx := context.Background()
	wide := storetest.MustWindows(ratelimit.PerPeriod(100, time.Hour))
	narrow := storetest.MustWindows(ratelimit.PerPeriod(1.5, time.Hour))
	frame := []ratelimit.Budget{
		{Key: "{c}:message:EVENT", Windows: wide},
		{Key: "{c}:kind:reactions", Windows: narrow},
		{Key: "{p}:aggregate", Windows: wide},
	}
	before := evalshaCalls(t, admin)
	if d, err := s.DecideAll(ctx, frame, time.Time{}); !d.Allowed || err != nil {
		t.Fatalf("first frame: %+v %v", d, err)
	}
	if n := evalshaCalls(t, admin) - before; n != 1 || s.Stats().RoundTrips != 1 {
		t.Fatalf("%d script calls, %d round trips for one frame, want 1 and 1", n, s.Stats().RoundTrips)
	}
	keys := func() int { return len(admin.Keys(ctx, defaultPrefix+"*").Val()) }
	if n := keys(); n != 3 {
		t.Fatalf("%d keys after an admitted frame of 3 budgets", n)
	}
	d, err := s.DecideAll(ctx, frame, time.Time{})
	if err != nil || d.Allowed || d.By != 1 || d.Wait <= 0 {
		t.Fatalf("second frame: %+v %v, want refused by budget 1", d, err)
	}
	// Nothing written: the aggregate's score is still one message's.
	agg := frame[2]
	for range 98 {
		if d, _ := s.DecideAll(ctx, []ratelimit.Budget{agg}, time.Time{}); !d.Allowed {
			t.Fatalf("the aggregate refused early: the refused frame charged it")
		}
	}
	if d, _ := s.DecideAll(ctx, []ratelimit.Budget{agg}, time.Time{}); !d.Allowed {
		t.Fatal("the aggregate's 100th message refused")
	}
}

// A frame refused by its first budget charges none of the later ones: the
// refusal of a group's first decision leaves nothing queued, and the last
// decision, admitting, must not then be written as a lone one.
func TestDecideAllFirstRefusedChargesNoOther(t *testing.T) {
	srv, _ := realRedis(t)
	s := newStore(t, client(t, srv.Addr()), slow)
	ctx := context.Background()
	frame := []ratelimit.Budget{
		{Key: "{c}:kind:reactions", Windows: storetest.MustWindows(ratelimit.PerPeriod(1.5, time.Hour))},
		{Key: "{p}:aggregate", Windows: storetest.MustWindows(ratelimit.PerPeriod(100, time.Hour))},
	}
	if d, err := s.DecideAll(ctx, frame, time.Time{}); !d.Allowed || err != nil {
		t.Fatalf("first frame: %+v %v", d, err)
	}
	for i := range 10 {
		if d, err := s.DecideAll(ctx, frame, time.Time{}); err != nil || d.Allowed || d.By != 0 {
			t.Fatalf("frame %d: %+v %v, want refused by budget 0", i+2, d, err)
		}
	}
	agg := frame[1]
	for i := range 99 {
		if d, _ := s.DecideAll(ctx, []ratelimit.Budget{agg}, time.Time{}); !d.Allowed {
			t.Fatalf("the aggregate refused its message %d of 100: the refused frames charged it", i+2)
		}
	}
}
