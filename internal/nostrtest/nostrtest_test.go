package nostrtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/internal/storetest"
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
	limits := storetest.MustWindows(ratelimit.PerPeriod(1.5, time.Hour))
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

// TestQuotaApart: actors it calls apart have budgets of their own, actors
// it does not share one, and probing leaves the quota as it was.
func TestQuotaApart(t *testing.T) {
	q, err := ratelimit.NewQuota(1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	actors := make([]string, 120) // ~7 colliding pairs in 1,024 slots
	for i := range actors {
		actors[i] = fmt.Sprintf("actor-%d", i)
	}
	// Probe every pair first (probes must come before charges: see
	// QuotaApart), then charge each pair in a fresh window of its own.
	type pair struct {
		a, b  string
		apart bool
	}
	// 120 actors all land apart in about one quota of 1,400 (a seed of its
	// own each): such a quota proves nothing here, so another is made.
	var pairs []pair
	for try := 0; ; try++ {
		pairs = pairs[:0]
		some := false
		for i := range actors {
			for j := i + 1; j < len(actors); j++ {
				apart := QuotaApart(q, T0, actors[i], actors[j])
				pairs = append(pairs, pair{actors[i], actors[j], apart})
				some = some || !apart
			}
		}
		if some || try == 4 {
			break
		}
		q, _ = ratelimit.NewQuota(1, time.Minute)
	}
	at, shared := T0, 0
	for _, p := range pairs {
		at = at.Add(time.Minute)
		qa := q.WithClock(func() time.Time { return at })
		if added, _ := qa.Add(context.Background(), p.a, "", 0); !added {
			t.Fatalf("%s refused in a fresh window: probing left a count behind", p.a)
		}
		if full, _, _ := qa.Exceeded(context.Background(), p.b); full == p.apart {
			t.Fatalf("%s and %s: apart %v, yet after charging one the other is exceeded: %v", p.a, p.b, p.apart, full)
		}
		if !p.apart {
			shared++
		}
	}
	if shared == 0 {
		t.Error("no pair of 120 actors shares a slot of 1,024: the test proves nothing")
	}
	// Apart as a whole: false when some pair shares a slot (a quota where
	// none does, as above, is made again).
	q2, _ := ratelimit.NewQuota(1, time.Minute)
	for try := 0; try < 4 && !sharesSome(q2, actors); try++ {
		q2, _ = ratelimit.NewQuota(1, time.Minute)
	}
	if QuotaApart(q2, T0, actors...) {
		t.Error("120 actors all apart, though some pairs share a slot")
	}
	if keys := ApartKeys(q2, T0, 3); len(keys) != 3 {
		t.Fatalf("ApartKeys: %d keys", len(keys))
	}
}

// sharesSome reports whether two of actors share a slot of q, by charging
// them one by one (q's budget is one event): an actor refused shares its
// slot with one charged before. It charges in a window older than every
// window QuotaApart probes in (2^21 windows before T0), which those probes
// then overwrite: a later window would take their counts and make every
// actor look shared.
func sharesSome(q *ratelimit.Quota, actors []string) bool {
	qa := q.WithClock(func() time.Time { return T0.Add(-(1 << 21) * q.Window()) })
	for _, a := range actors {
		if added, _ := qa.Add(context.Background(), a, "", 0); !added {
			return true
		}
	}
	return false
}
