package scripts_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/scripts"
)

func TestQuotaEmbedIsTheFile(t *testing.T) {
	src, err := os.ReadFile("quota.lua")
	if err != nil {
		t.Fatal(err)
	}
	if string(src) != scripts.Quota || !strings.Contains(scripts.Quota, "redis.call('TIME')") {
		t.Fatal("scripts.Quota is not quota.lua")
	}
}

var quota = redis.NewScript(scripts.Quota)

// TestQuotaScript pins the stored value, its TTL and the replies of
// quota.lua on miniredis and redis-server: at an instant 10 s into a
// minute, events 2.
func TestQuotaScript(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		key := []string{"t:{q:alice}:quota:60000"}
		at := "1767322810000" // 10 s past a whole minute (now is one)
		run := func(op, id string) []any {
			t.Helper()
			r, err := quota.Run(ctx, c, key, op, 2, 60000, at, 0, id).Result()
			if err != nil {
				t.Fatal(err)
			}
			return r.([]any)
		}
		eq := func(got []any, want ...int64) {
			t.Helper()
			if len(got) != len(want) {
				t.Fatalf("reply %v, want %v", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("reply %v, want %v", got, want)
				}
			}
		}
		eq(run("x", ""), 0, 0, 0)
		eq(run("a", ""), 1, 0, 1)
		if v, _ := c.Get(ctx, key[0]).Result(); v != "29455380 1" {
			t.Errorf("stored %q, want \"29455380 1\"", v)
		}
		if ttl, _ := c.PTTL(ctx, key[0]).Result(); ttl <= 0 || ttl > 51*time.Second {
			t.Errorf("PTTL %v, want (0, 51 s]", ttl)
		}
		eq(run("a", "00000000000000ff"), 1, 0, 2)
		if v, _ := c.Get(ctx, key[0]).Result(); v != "29455380 2 00000000000000ff" {
			t.Errorf("stored %q", v)
		}
		eq(run("a", ""), 0, 50000, 2)
		eq(run("x", ""), 1, 50000, 2)
		// Arguments it refuses, and a late call.
		for _, args := range [][]any{
			{"z", 2, 60000, at, 0, ""},
			{"x", 0, 60000, at, 0, ""},
			{"x", 2, 0, at, 0, ""},
			{"x", 2, 60000, at, 0},
		} {
			if err := quota.Run(ctx, c, key, args...).Err(); err == nil || !strings.HasPrefix(err.Error(), "ERR sluice quota: ") {
				t.Errorf("args %v: %v", args, err)
			}
		}
		if err := quota.Run(ctx, c, key, "a", 2, 60000, at, 1, "").Err(); err == nil || !strings.HasPrefix(err.Error(), "ERR sluice late") {
			t.Errorf("past the cutoff: %v", err)
		}
	})
}
