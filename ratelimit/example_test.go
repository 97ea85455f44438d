package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

func ExampleLimiter_Allow() {
	// Tests and examples pass the clock; a server passes nil.
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), func() time.Time { return now })
	// Prepared once, at start-up: validated, and ready for every decision.
	events, err := ratelimit.NewWindows(ratelimit.PerPeriod(3, time.Second))
	if err != nil {
		panic(err)
	}
	key := "{203.0.113.7}:message:EVENT" // the client in braces: one Redis Cluster slot

	for i := 1; i <= 4; i++ {
		d, err := lim.Allow(context.Background(), key, events)
		if err != nil {
			fmt.Println("error: rate limiter unavailable")
			continue
		}
		if d.Allowed {
			fmt.Printf("EVENT %d: admitted\n", i)
		} else {
			fmt.Printf("EVENT %d: refused, wait %v\n", i, d.Wait)
		}
	}
	now = now.Add(585 * time.Millisecond) // the client obeys the wait
	d, _ := lim.Allow(context.Background(), key, events)
	fmt.Println("after the wait, admitted:", d.Allowed)
	// Output:
	// EVENT 1: admitted
	// EVENT 2: admitted
	// EVENT 3: admitted
	// EVENT 4: refused, wait 585ms
	// after the wait, admitted: true
}

func ExampleLimit_Burst() {
	for _, l := range []ratelimit.Limit{
		ratelimit.PerPeriod(10, time.Second),
		ratelimit.PerPeriod(240, time.Minute),
	} {
		fmt.Printf("%v: burst %d, then one every %v (%.2f/s)\n",
			l, l.Burst(), l.Interval().Round(time.Millisecond), l.Sustained())
	}
	// Output:
	// 10/1s: burst 10, then one every 152ms (6.58/s)
	// 240/1m0s: burst 240, then one every 361ms (2.77/s)
}

func ExampleQuota() {
	// 2 validated events per actor per minute (the default is 600).
	q, err := ratelimit.NewQuota(2, time.Minute)
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 15, 0, time.UTC)
	q = q.WithClock(func() time.Time { return now }) // a Limiter's Now, in a gate
	ctx := context.Background()
	alice := "a1b2c3…" // the event's pubkey
	for i := 1; i <= 3; i++ {
		if over, wait, _ := q.Exceeded(ctx, alice); over {
			fmt.Printf("event %d: over quota, next window in %v\n", i, wait)
			continue
		}
		q.Add(ctx, alice, "", 0) // once the relay has accepted the event
		fmt.Printf("event %d: accepted\n", i)
	}
	now = now.Add(45 * time.Second)
	over, _, _ := q.Exceeded(ctx, alice)
	fmt.Println("next minute, over quota:", over)
	// Output:
	// event 1: accepted
	// event 2: accepted
	// event 3: over quota, next window in 45s
	// next minute, over quota: false
}
