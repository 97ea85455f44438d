package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// startCluster starts a three-master cluster (redistest.StartCluster) and
// returns the masters' addresses.
func startCluster(t testing.TB) []string {
	t.Helper()
	var addrs []string
	for _, s := range redistest.StartCluster(t) {
		addrs = append(addrs, s.Addr())
	}
	return addrs
}

// TestConformanceCluster runs the suite through a ClusterClient on a real
// three-node cluster. Every multi-window script is legal only because the
// {client} hash tag puts all of a key's windows in one slot; the control at
// the end shows the same call without a tag refused with CROSSSLOT.
func TestConformanceCluster(t *testing.T) {
	addrs := startCluster(t)
	c, err := NewClient("redis+cluster://" + strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cc := c.(*redis.ClusterClient)
	s := newStore(t, cc, slow)
	storetest.Run(t, func(t *testing.T) storetest.Scorer { return scorer(s) })
	storetest.Agree(t, memory, scorer(s), 11, 40)
	t.Run("batch", func(t *testing.T) {
		// A cluster pipeline is split by node; every decision must still
		// find its own reply.
		bs := newStore(t, cc, Options{Timeout: slow.Timeout, Batch: 16})
		defer bs.Close()
		storetest.Run(t, func(t *testing.T) storetest.Scorer { return scorer(bs) })
	})

	ctx := context.Background()
	// The suite's keys landed on more than one node: routing was exercised.
	serial := 0
	for _, a := range addrs {
		n := redis.NewClient(&redis.Options{Addr: a})
		if k, _ := n.DBSize(ctx).Result(); k > 0 {
			serial++
		}
		_ = n.Close()
	}
	if serial < 2 {
		t.Errorf("keys on %d of 3 nodes; the suite did not exercise routing", serial)
	}

	// Every window of a decision is in one key, so no decision can span
	// slots: a key without a hash tag, and the empty tag "{}" of a client
	// whose identity came out empty (which Redis ignores), are decided like
	// any other.
	limits := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(100, time.Minute))
	for _, key := range []string{"notag:message:EVENT", "{notag}:message:EVENT", messageKey("", "EVENT")} {
		if d, err := s.Decide(ctx, key, limits, storetest.T0); err != nil || !d.Allowed {
			t.Errorf("%s on a cluster: %+v %v, want admitted", key, d, err)
		}
	}
	// Control: keys of different slots in one call are still refused with
	// CROSSSLOT, and that is classed as Redis answering about one key.
	k1, k2 := defaultPrefix+"notag:message:EVENT:1000", defaultPrefix+"notag:message:EVENT:60000"
	s1, _ := cc.ClusterKeySlot(ctx, k1).Result()
	s2, _ := cc.ClusterKeySlot(ctx, k2).Result()
	if s1 == s2 {
		t.Fatalf("control keys share slot %d; pick others", s1)
	}
	if err := cc.Eval(ctx, "return 1", []string{k1, k2}).Err(); !isCrossSlot(err) || !IsPerKey(err) || !answered(err) {
		t.Errorf("two slots in one call: %v, want a per-key CROSSSLOT", err)
	}
}
