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

// Migration moves one slot from one master of a cluster to another by
// hand, in redis-cli --cluster reshard's order: the target marked
// importing before the source migrating (so that an ASK from the source
// always finds the target ready), the keys carried by MIGRATE, then the
// slot given to the target on the target first, the source next, the
// other masters last. Between its steps a test decides under load: keys
// already moved are answered ASK by the source, and after End a client
// with the old slot map is answered MOVED.
type Migration struct {
	tb       testing.TB
	slot     int
	from, to *Server
	masters  []*Server
	ids      map[*Server]string
}

// BeginMigration marks slot, which from serves, as importing on to and
// migrating on from. masters are every master of the cluster (End tells
// each the slot's new owner).
func BeginMigration(tb testing.TB, masters []*Server, from, to *Server, slot int) *Migration {
	tb.Helper()
	m := &Migration{tb: tb, slot: slot, from: from, to: to, masters: masters, ids: map[*Server]string{}}
	for _, s := range masters {
		id, err := m.do(s, "CLUSTER", "MYID").Text()
		if err != nil {
			tb.Fatalf("CLUSTER MYID on %s: %v", s.Addr(), err)
		}
		m.ids[s] = id
	}
	m.must(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.ids[from])
	m.must(from, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.ids[to])
	return m
}

// Keys returns the keys of the slot still on the source.
func (m *Migration) Keys() []string {
	m.tb.Helper()
	keys, err := m.do(m.from, "CLUSTER", "GETKEYSINSLOT", m.slot, 100000).StringSlice()
	if err != nil {
		m.tb.Fatalf("CLUSTER GETKEYSINSLOT %d on %s: %v", m.slot, m.from.Addr(), err)
	}
	return keys
}

// Move carries keys of the slot from the source to the target with one
// MIGRATE; none means every key still on the source.
func (m *Migration) Move(keys ...string) {
	m.tb.Helper()
	if len(keys) == 0 {
		keys = m.Keys()
	}
	if len(keys) == 0 {
		return
	}
	args := []any{"MIGRATE", "127.0.0.1", m.to.Port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	m.must(m.from, args...)
}

// End moves what keys are left and gives the slot to the target: on the
// target, then the source, then the other masters.
func (m *Migration) End() {
	m.tb.Helper()
	m.Move()
	order := []*Server{m.to, m.from}
	for _, s := range m.masters {
		if s != m.to && s != m.from {
			order = append(order, s)
		}
	}
	for _, s := range order {
		m.must(s, "CLUSTER", "SETSLOT", m.slot, "NODE", m.ids[m.to])
	}
}

func (m *Migration) do(s *Server, args ...any) *redis.Cmd {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	return c.Do(context.Background(), args...)
}

func (m *Migration) must(s *Server, args ...any) {
	m.tb.Helper()
	if err := m.do(s, args...).Err(); err != nil {
		m.tb.Fatalf("slot %d: %v on %s: %v", m.slot, args, s.Addr(), err)
	}
}
