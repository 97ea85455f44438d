package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// TestQuotaWithClock: a Quota reads its instants from its clock, never
// fails, and the Quota WithClock makes shares the counts of the one it was
// made from; nil admits everything.
func TestQuotaWithClock(t *testing.T) {
	ctx := context.Background()
	base, _ := ratelimit.NewQuota(2, time.Minute)
	now := t0.Add(15 * time.Second)
	var aq ratelimit.ActorQuota = base.WithClock(func() time.Time { return now })
	if aq.Events() != 2 || aq.Window() != time.Minute {
		t.Fatalf("Events, Window = %d, %v", aq.Events(), aq.Window())
	}
	for i, want := range []bool{true, true, false} {
		if ok, err := aq.Add(ctx, "alice", "", 0); ok != want || err != nil {
			t.Fatalf("Add %d = %v %v, want %v", i, ok, err, want)
		}
	}
	if over, wait, err := aq.Exceeded(ctx, "alice"); !over || wait != 45*time.Second || err != nil {
		t.Errorf("Exceeded = %v %v %v, want over, 45s", over, wait, err)
	}
	if over, _ := base.ExceededAt("alice", t0.Add(15*time.Second)); !over {
		t.Error("the Quota WithClock made does not share its counts")
	}
	now = now.Add(45 * time.Second)
	if over, _, err := aq.Exceeded(ctx, "alice"); over || err != nil {
		t.Errorf("next window: Exceeded = %v %v", over, err)
	}
	for _, u := range []*ratelimit.Quota{nil, (*ratelimit.Quota)(nil).WithClock(nil)} {
		for range 3 {
			if ok, err := u.Add(ctx, "alice", "", 0); !ok || err != nil {
				t.Fatalf("unlimited Add = %v %v", ok, err)
			}
		}
		if over, _, err := u.Exceeded(ctx, "alice"); over || err != nil || u.Events() != 0 || u.Window() != 0 {
			t.Errorf("unlimited: %v %v %d %v", over, err, u.Events(), u.Window())
		}
	}
}

// TestQuotaCountsWhatWasSigned: an id is charged once per window, an event
// created more than a window ago not at all.
func TestQuotaCountsWhatWasSigned(t *testing.T) {
	ctx := context.Background()
	base, _ := ratelimit.NewQuota(3, time.Minute)
	now := t0.Add(15 * time.Second)
	q := base.WithClock(func() time.Time { return now })
	for range 5 {
		if ok, _ := q.Add(ctx, "victim", "id-1", now.Unix()); !ok {
			t.Fatal("a re-sent event refused")
		}
		if ok, _ := q.Add(ctx, "victim", "old", now.Unix()-61); !ok {
			t.Fatal("an old event refused")
		}
	}
	if over, _, _ := q.Exceeded(ctx, "victim"); over {
		t.Fatal("one event and old copies filled a quota of 3")
	}
	for _, id := range []string{"id-2", "id-3"} {
		_, _ = q.Add(ctx, "victim", id, now.Unix())
	}
	if over, _, _ := q.Exceeded(ctx, "victim"); !over {
		t.Fatal("three distinct events did not fill a quota of 3")
	}
	// The next window charges the same id afresh.
	now = now.Add(time.Minute)
	if ok, _ := q.Add(ctx, "victim", "id-1", now.Unix()); !ok {
		t.Fatal("refused in a new window")
	}
	if over, _ := base.ExceededAt("victim", now); over {
		t.Fatal("one charge filled the new window")
	}
}
