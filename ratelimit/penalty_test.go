package ratelimit

import (
	"context"
	"testing"
	"time"
)

// TestMemoryGuardPenalty steps a memory Guard's penalty box over fixed
// instants: points decay by the half-life, a score reaching the threshold
// bans every key for Ban, each further ban doubles up to MaxBan, a banned
// key gains nothing, and Hold refuses a banned client or aggregate with
// the remaining time.
func TestMemoryGuardPenalty(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	g := NewMemoryGuard(func() time.Time { return now })
	ctx := context.Background()
	p := Penalty{Threshold: 2, HalfLife: time.Minute, Ban: time.Minute, MaxBan: 3 * time.Minute}
	keys := []string{"192.0.2.1", "192.0.2.0/24"}
	at := func(d time.Duration) { now = now.Add(d) }

	if k, w, s, _ := g.Violate(ctx, keys, 1, p); k != "" || w != 0 || s {
		t.Fatalf("one point: banned %q %v %v", k, w, s)
	}
	at(time.Minute) // the point halves: 0.5 + 1 < 2
	if k, _, _, _ := g.Violate(ctx, keys, 1, p); k != "" {
		t.Fatalf("1.5 points banned %q", k)
	}
	for i, want := range []time.Duration{time.Minute, 2 * time.Minute, 3 * time.Minute, 3 * time.Minute} {
		k, w, s, _ := g.Violate(ctx, keys, 1, p)
		if k == "" || w != want || !s {
			t.Fatalf("ban %d: %q for %v, started %v; want %v", i, k, w, s, want)
		}
		at(time.Second)
		if _, w2, s2, _ := g.Violate(ctx, keys, 5, p); w2 != want-time.Second || s2 {
			t.Fatalf("ban %d: a violation while banned: %v, started %v", i, w2, s2)
		}
		if w3, ok, _ := g.Hold(ctx, "192.0.2.7", []string{"192.0.2.0/24"}, 0); ok || w3 != want-time.Second {
			t.Fatalf("ban %d: a client of the banned aggregate: admitted %v, %v", i, ok, w3)
		}
		at(want)
		if _, ok, _ := g.Hold(ctx, "192.0.2.1", nil, 0); !ok {
			t.Fatalf("ban %d: refused after it ended", i)
		}
		g.Violate(ctx, keys, 1, p) // the first point towards the next ban
	}
	// A day without violations forgets the strikes.
	at(PenaltyMemory)
	g.Violate(ctx, keys, 1, p)
	if _, w, _, _ := g.Violate(ctx, keys, 1, p); w != time.Minute {
		t.Fatalf("after a quiet day the ban is %v, want Ban again", w)
	}
}

// TestMemoryGuardCap: a memory Guard counts a client's connections against
// the cap; Release frees a place; no cap counts nothing.
func TestMemoryGuardCap(t *testing.T) {
	g := NewMemoryGuard(nil)
	ctx := context.Background()
	for range 2 {
		if _, ok, _ := g.Hold(ctx, "a", nil, 2); !ok {
			t.Fatal("refused below the cap")
		}
	}
	if w, ok, _ := g.Hold(ctx, "a", nil, 2); ok || w != 0 {
		t.Fatalf("past the cap: %v %v", ok, w)
	}
	g.Release("a")
	if _, ok, _ := g.Hold(ctx, "a", nil, 2); !ok {
		t.Fatal("refused after a Release")
	}
	if len(g.(*memoryGuard).conns) != 1 {
		t.Fatal("conns table")
	}
}

// TestPenaltyValidate: zero fields are defaults; what the store cannot
// keep is refused.
func TestPenaltyValidate(t *testing.T) {
	if err := (Penalty{}).Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	for _, p := range []Penalty{
		{Threshold: -1},
		{HalfLife: time.Millisecond},
		{Ban: 2 * time.Hour, MaxBan: time.Hour},
		{MaxBan: 48 * time.Hour},
		{Ban: 1500 * time.Microsecond},
	} {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}
