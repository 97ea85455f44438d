package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// TestLocalQuota: Quota.Local answers as the Quota does at its clock's
// instant, never with an error; nil and Unlimited admit everything.
func TestLocalQuota(t *testing.T) {
	ctx := context.Background()
	q, _ := ratelimit.NewQuota(2, time.Minute)
	now := t0.Add(15 * time.Second)
	var aq ratelimit.ActorQuota = q.Local(func() time.Time { return now })
	if aq.Events() != 2 || aq.Window() != time.Minute {
		t.Fatalf("Events, Window = %d, %v", aq.Events(), aq.Window())
	}
	for i, want := range []bool{true, true, false} {
		if ok, err := aq.Add(ctx, "alice"); ok != want || err != nil {
			t.Fatalf("Add %d = %v %v, want %v", i, ok, err, want)
		}
	}
	if over, wait, err := aq.Exceeded(ctx, "alice"); !over || wait != 45*time.Second || err != nil {
		t.Errorf("Exceeded = %v %v %v, want over, 45s", over, wait, err)
	}
	now = now.Add(45 * time.Second)
	if over, _, err := aq.Exceeded(ctx, "alice"); over || err != nil {
		t.Errorf("next window: Exceeded = %v %v", over, err)
	}
	if over, _ := q.Exceeded("alice", now); over {
		t.Error("the Quota's own methods disagree with Local")
	}
	for _, u := range []*ratelimit.Quota{nil, ratelimit.Unlimited()} {
		l := u.Local(nil)
		for range 3 {
			if ok, err := l.Add(ctx, "alice"); !ok || err != nil {
				t.Fatalf("unlimited Add = %v %v", ok, err)
			}
		}
		if over, _, err := l.Exceeded(ctx, "alice"); over || err != nil || l.Events() != 0 || l.Window() != 0 {
			t.Errorf("unlimited: %v %v %d %v", over, err, l.Events(), l.Window())
		}
	}
}
