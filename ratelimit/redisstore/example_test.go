package redisstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
)

// Decide a burst against two windows at fixed instants. The store normally
// takes the instant from Redis TIME (pass the zero time); tests pass their
// own. miniredis stands in for Redis so the example needs no server.
func ExampleStore_Decide() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client, err := redisstore.NewClient("redis://" + m.Addr() + "/0")
	if err != nil {
		panic(err)
	}
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	limits := ratelimit.MustWindows(ratelimit.PerPeriod(3, time.Second), ratelimit.PerPeriod(100, time.Minute))
	key := ratelimit.MessageKey("203.0.113.7", "EVENT")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 4 {
		d, err := store.Decide(context.Background(), key, limits, t0)
		if err != nil {
			panic(err)
		}
		fmt.Printf("#%d allowed=%v wait=%v\n", i+1, d.Allowed, d.Wait)
	}
	d, _ := store.Decide(context.Background(), key, limits, t0.Add(585*time.Millisecond))
	fmt.Printf("after the wait: allowed=%v\n", d.Allowed)
	// Output:
	// #1 allowed=true wait=0s
	// #2 allowed=true wait=0s
	// #3 allowed=true wait=0s
	// #4 allowed=false wait=585ms
	// after the wait: allowed=true
}

// NewClient understands standalone, sentinel and cluster URLs; it does not
// dial, and its errors never show the password.
func ExampleNewClient() {
	for _, u := range []string{
		"redis://127.0.0.1:6379/0",
		"redis+sentinel://:secret@10.0.0.1:26379,10.0.0.2:26379/mymaster",
		"redis+cluster://10.0.0.1:7000,10.0.0.2:7000",
		"redis+cluster://:secret@10.0.0.1:7000/1",
	} {
		c, err := redisstore.NewClient(u)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Printf("%T\n", c)
		c.Close()
	}
	// Output:
	// *redis.Client
	// *redis.Client
	// *redis.ClusterClient
	// error: redisstore: invalid redis URL: redis+cluster://:xxxxx@10.0.0.1:7000/1: a cluster URL has no path (Redis Cluster has only database 0)
}
