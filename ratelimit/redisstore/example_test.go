package redisstore_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
)

// Decide a burst against two windows at fixed instants. The store normally
// takes the instant from Redis TIME (pass the zero time); tests pass their
// own. It needs a Redis (or Valkey) server: the scripts pack their numbers
// with Redis's struct library, which miniredis does not have, so this
// example is compiled but not run (TestExampleDecide runs it on a
// redis-server of its own).
func ExampleStore_Decide() {
	decideBurst("redis://127.0.0.1:6379/0")
	// Prints:
	// #1 allowed=true wait=0s
	// #2 allowed=true wait=0s
	// #3 allowed=true wait=0s
	// #4 allowed=false wait=585ms
	// after the wait: allowed=true
}

func decideBurst(url string) {
	client, err := redisstore.NewClient(url)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	limits, err := ratelimit.NewWindows(ratelimit.PerPeriod(3, time.Second), ratelimit.PerPeriod(100, time.Minute))
	if err != nil {
		panic(err)
	}
	key := "{203.0.113.7}:message:EVENT" // the client in braces: one Redis Cluster slot
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

// TestExampleDecide runs ExampleStore_Decide's code on a redis-server of
// its own and checks what it prints.
func TestExampleDecide(t *testing.T) {
	srv := redistest.Start(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	decideBurst("redis://" + srv.Addr() + "/0")
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	want := "#1 allowed=true wait=0s\n#2 allowed=true wait=0s\n#3 allowed=true wait=0s\n#4 allowed=false wait=585ms\nafter the wait: allowed=true\n"
	if string(out) != want {
		t.Errorf("printed\n%s\nwant\n%s", out, want)
	}
}
