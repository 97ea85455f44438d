package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartCluster starts three redis-server nodes with cluster mode on, splits
// the 16384 slots between them (0–5460, 5461–10922, 10923–16383) and joins
// them, without redis-cli. It returns the masters, in that slot order,
// once every node reports cluster_state:ok. extra is passed to every node.
func StartCluster(tb testing.TB, extra ...string) []*Server {
	tb.Helper()
	ctx := context.Background()
	ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	var srvs []*Server
	var busPorts []string
	var nodes []*redis.Client
	for _, r := range ranges {
		bus := strconv.Itoa(FreePort(tb))
		srv := Start(tb, append([]string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			// The bus port defaults to port+10000, which may be taken or
			// past 65535; pick a free one.
			"--cluster-port", bus,
		}, extra...)...)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		tb.Cleanup(func() { _ = c.Close() })
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", r[0], r[1]).Err(); err != nil {
			tb.Fatalf("ADDSLOTSRANGE on %s: %v", srv.Addr(), err)
		}
		srvs = append(srvs, srv)
		busPorts = append(busPorts, bus)
		nodes = append(nodes, c)
	}
	for i, s := range srvs[1:] {
		if err := nodes[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", s.Port, busPorts[i+1]).Err(); err != nil {
			tb.Fatalf("CLUSTER MEET %s: %v", s.Addr(), err)
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
				tb.Fatalf("cluster not ok after 30s: %v %s", err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return srvs
}
