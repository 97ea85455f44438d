package scripts_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/scripts"
)

func TestEmbedIsTheFile(t *testing.T) {
	src, err := os.ReadFile("ewma.lua")
	if err != nil {
		t.Fatal(err)
	}
	if string(src) != scripts.EWMA || !strings.Contains(scripts.EWMA, "redis.call('MGET'") {
		t.Fatal("scripts.EWMA is not ewma.lua")
	}
}

// servers runs f against miniredis and against a real redis-server (when
// there is one), so the script's behaviour is pinned on both.
func servers(t *testing.T, f func(t *testing.T, c *redis.Client)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		defer c.Close()
		f(t, c)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer c.Close()
		f(t, c)
	})
}

var ewma = redis.NewScript(scripts.EWMA)

const now = "1767322800000" // a fixed instant in unix ms

// one window of rate 2, half-life 1s, cost 1.
var keys = []string{"t:{c}:message:EVENT:1000"}

func run(t *testing.T, c *redis.Client, reqid string) []any {
	t.Helper()
	v, err := ewma.Run(context.Background(), c, keys, now, reqid, 2, 1000, 1).Slice()
	if err != nil {
		t.Fatalf("reqid %q: %v", reqid, err)
	}
	return v
}

// TestRequestIDChargesOnce: the same request id run twice (what a go-redis
// retry after a lost reply does) charges once and returns the same reply;
// without an id, the repeat charges again.
func TestRequestIDChargesOnce(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		first := run(t, c, "req-1")
		again := run(t, c, "req-1")
		if len(first) != 3 || first[0] != int64(1) || first[2] != "1" {
			t.Fatalf("first reply %v, want [1 0 \"1\"]", first)
		}
		if !equal(first, again) {
			t.Errorf("repeat of req-1 replied %v, first %v", again, first)
		}
		if v, _ := c.Get(context.Background(), keys[0]).Result(); v != "1 "+now+" req-1" {
			t.Errorf("stored %q after one request run twice, want score 1 and the id", v)
		}
		// Without an id the same call charges twice: the hazard the id removes.
		run(t, c, "")
		if v, _ := c.Get(context.Background(), keys[0]).Result(); !strings.HasPrefix(v, "2 ") {
			t.Errorf("stored %q, want score 2", v)
		}
	})
}

// TestRequestIDsKept: the first window keeps the last 4 admitted ids,
// newest first; a repeat of any of them charges nothing and answers with
// every window's stored score; an id pushed out of the list charges again
// (the documented limit of the guard).
func TestRequestIDsKept(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		two := []string{"t:{d}:message:EVENT:1000", "t:{d}:message:EVENT:60000"}
		call := func(id string) []any {
			v, err := ewma.Run(ctx, c, two, now, id, 100, 1000, 1, 1000, 60000, 1).Slice()
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return v
		}
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			call(id)
		}
		if v, _ := c.Get(ctx, two[0]).Result(); v != "5 "+now+" e d c b" {
			t.Errorf("first window %q, want score 5 and ids e d c b", v)
		}
		if v, _ := c.Get(ctx, two[1]).Result(); v != "5 "+now {
			t.Errorf("second window %q, want score 5 and no ids", v)
		}
		if r := call("b"); !equal(r, []any{int64(1), int64(0), "5", "5"}) {
			t.Errorf("repeat of b: %v, want [1 0 5 5]", r)
		}
		if v, _ := c.Get(ctx, two[0]).Result(); !strings.HasPrefix(v, "5 ") {
			t.Errorf("repeat of b charged: %q", v)
		}
		if r := call("a"); !equal(r, []any{int64(1), int64(0), "6", "6"}) {
			t.Errorf("a, pushed out of the list, is charged as new: got %v", r)
		}
	})
}

// TestRequestIDWholeMatch: a request id matches a kept id only whole, not
// as a part of a longer one.
func TestRequestIDWholeMatch(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		call := func(id string) []any {
			v, err := ewma.Run(ctx, c, keys, now, id, 100, 1000, 1).Slice()
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return v
		}
		call("xreq-12")
		call("ab")
		for i, id := range []string{"req-1", "req-12", "xreq-1", "a"} {
			if r := call(id); r[2] != strconv.Itoa(3+i) {
				t.Errorf("%q (not kept) was not charged: %v", id, r)
			}
		}
		if r := call("a"); r[2] != "6" {
			t.Errorf("a kept id was charged again: %v", r)
		}
	})
}

// TestRefusalWritesNothing: a refused request leaves the windows and the
// dedup key untouched.
func TestRefusalWritesNothing(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		run(t, c, "")
		run(t, c, "")
		before, _ := c.Get(ctx, keys[0]).Result()
		ttlBefore, _ := c.PTTL(ctx, keys[0]).Result()
		r := run(t, c, "req-1")
		if r[0] != int64(0) || r[1] != int64(1000) || r[2] != "2" {
			t.Fatalf("third at one instant: %v, want [0 1000 \"2\"]", r)
		}
		after, _ := c.Get(ctx, keys[0]).Result()
		if after != before {
			t.Errorf("refusal changed the window: %q → %q", before, after)
		}
		if ttl, _ := c.PTTL(ctx, keys[0]).Result(); ttl > ttlBefore {
			t.Errorf("refusal extended the TTL: %v → %v", ttlBefore, ttl)
		}
		if strings.Contains(after, "req-1") {
			t.Error("refusal recorded its request id")
		}
	})
}

func TestBadArgumentsAndValues(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		for name, args := range map[string][]any{
			"missing cost":  {now, "", 2, 1000},
			"extra window":  {now, "", 2, 1000, 1, 3, 2000, 1},
			"rate = cost":   {now, "", 1, 1000, 1},
			"zero period":   {now, "", 2, 0, 1},
			"not a number":  {now, "", "x", 1000, 1},
			"negative cost": {now, "", 2, 1000, -1},
		} {
			if err := ewma.Run(ctx, c, keys, args...).Err(); err == nil {
				t.Errorf("%s: no error", name)
			}
		}
		if err := ewma.Run(ctx, c, nil, now, "").Err(); err == nil {
			t.Error("no windows: no error")
		}
		c.Set(ctx, keys[0], "garbage", 0)
		if err := ewma.Run(ctx, c, keys, now, "", 2, 1000, 1).Err(); err == nil || !strings.Contains(err.Error(), "malformed") {
			t.Errorf("malformed stored value: err = %v", err)
		}
	})
}

// TestRedisTIME: a zero instant takes Redis TIME and writes it.
func TestRedisTIME(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		if err := ewma.Run(ctx, c, keys, "0", "", 2, 1000, 1).Err(); err != nil {
			t.Fatal(err)
		}
		v, _ := c.Get(ctx, keys[0]).Result()
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		_, atStr, _ := strings.Cut(v, " ")
		at, err := strconv.ParseInt(atStr, 10, 64)
		if d := tm.UnixMilli() - at; err != nil || d < 0 || d > 5000 {
			t.Errorf("stored instant %q, Redis TIME %d ms", atStr, tm.UnixMilli())
		}
	})
}

func equal(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
