package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/storetest"
)

// startCluster starts three redis-server nodes with cluster mode on, splits
// the 16384 slots between them and joins them, without redis-cli. It
// returns the nodes' addresses once every node reports cluster_state:ok.
func startCluster(t testing.TB) []string {
	t.Helper()
	ctx := context.Background()
	ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	var addrs, busPorts []string
	var nodes []*redis.Client
	for _, r := range ranges {
		bus := strconv.Itoa(redistest.FreePort(t))
		srv := redistest.Start(t,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			// The bus port defaults to port+10000, which may be taken or
			// past 65535; pick a free one.
			"--cluster-port", bus,
		)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", r[0], r[1]).Err(); err != nil {
			t.Fatalf("ADDSLOTSRANGE on %s: %v", srv.Addr(), err)
		}
		addrs = append(addrs, srv.Addr())
		busPorts = append(busPorts, bus)
		nodes = append(nodes, c)
	}
	for i, a := range addrs[1:] {
		host, port, _ := strings.Cut(a, ":")
		if err := nodes[0].Do(ctx, "CLUSTER", "MEET", host, port, busPorts[i+1]).Err(); err != nil {
			t.Fatalf("CLUSTER MEET %s: %v", a, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range nodes {
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok after 30s: %v %s", err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
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
	limits := ratelimit.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(100, time.Minute))
	for _, key := range []string{"notag:message:EVENT", "{notag}:message:EVENT", ratelimit.MessageKey("", "EVENT")} {
		if d, err := s.Decide(ctx, key, limits, storetest.T0); err != nil || !d.Allowed {
			t.Errorf("%s on a cluster: %+v %v, want admitted", key, d, err)
		}
	}
	// Control: keys of different slots in one call are still refused with
	// CROSSSLOT, and that is classed as Redis answering about one key.
	k1, k2 := DefaultPrefix+"notag:message:EVENT:1000", DefaultPrefix+"notag:message:EVENT:60000"
	s1, _ := cc.ClusterKeySlot(ctx, k1).Result()
	s2, _ := cc.ClusterKeySlot(ctx, k2).Result()
	if s1 == s2 {
		t.Fatalf("control keys share slot %d; pick others", s1)
	}
	if err := cc.Eval(ctx, "return 1", []string{k1, k2}).Err(); !isCrossSlot(err) || !IsPerKey(err) || !answered(err) {
		t.Errorf("two slots in one call: %v, want a per-key CROSSSLOT", err)
	}
}
