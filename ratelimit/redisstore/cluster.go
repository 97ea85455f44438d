package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/ratelimit"
)

// slotReloadEvery is the least time between two slot-map reloads a Store
// asks of a *redis.ClusterClient (see nodes.reload).
const slotReloadEvery = 250 * time.Millisecond

// nodeIdle is how long a node no decision was routed to is still reported
// by breakerState and NodeBreakers: a master that lost its slots in a
// failover stops counting after it.
const nodeIdle = 3 * time.Second

// nodes is a cluster Store's health, one breaker per master: a decision is
// judged by the breaker of the master its key's slot routes to in the
// client's slot map, so one node's trouble refuses only the clients whose
// slots it serves. Round trips that fail towards a node (timeouts, refused
// or reset connections, CLUSTERDOWN) also ask the client to reload its
// slot map, at most once per slotReloadEvery: go-redis would otherwise keep
// sending to a dead master's address until a MOVED reply or its periodic
// reload (a minute by default), long after a replica took its slots over.
type nodes struct {
	cc   *redis.ClusterClient
	opts breakerOptions

	mu  sync.Mutex                       // held to add or forget a node
	all atomic.Pointer[map[string]*node] // copied on write: read without a lock

	loaded     atomic.Bool  // the client has a slot map
	lastReload atomic.Int64 // unix ns of the last reload asked
	reloads    atomic.Uint64
}

// node is one master's health.
type node struct {
	addr    string
	br      *breaker
	errOpen error        // errBreakerOpen naming the node, built once
	used    atomic.Int64 // unix ns, updated at most every 100 ms
}

func newNodes(cc *redis.ClusterClient, opts breakerOptions) *nodes {
	n := &nodes{cc: cc, opts: opts}
	empty := map[string]*node{}
	n.all.Store(&empty)
	return n
}

// routeKey returns a key that the cluster places in the same slot as the
// first window of key: key itself when it has a non-empty {hash tag} (the
// prefix has no braces, so the tag decides every window's slot), or "" when
// the full window key must be hashed.
func routeKey(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key
		}
	}
	return ""
}

// of returns the health of the master that key's slot routes to now.
// Until the client has loaded a slot map once, finding the master may
// load one, bounded by deadline (zero: none); after that it is a lookup.
func (n *nodes) of(ctx context.Context, deadline time.Time, key string, now time.Time) (*node, error) {
	if !n.loaded.Load() && !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	c, err := n.cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	if !n.loaded.Load() {
		n.loaded.Store(true) // go-redis keeps a loaded slot map until a newer one loads
	}
	addr := c.Options().Addr
	nd := (*n.all.Load())[addr]
	if nd == nil {
		var err error
		if nd, err = n.add(addr); err != nil {
			return nil, err
		}
	}
	t := ratelimit.Clock(nil).Now().UnixNano() // the clock live() reads
	if t-nd.used.Load() > int64(100*time.Millisecond) {
		nd.used.Store(t)
	}
	return nd, nil
}

func (n *nodes) add(addr string) (*node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	old := *n.all.Load()
	if nd := old[addr]; nd != nil {
		return nd, nil
	}
	br, err := newBreaker(n.opts)
	if err != nil {
		return nil, err
	}
	nd := &node{addr: addr, br: br, errOpen: fmt.Errorf("%w: %w (cluster node %s)", ratelimit.ErrUnavailable, errBreakerOpen, addr)}
	m := make(map[string]*node, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[addr] = nd
	n.all.Store(&m)
	return nd, nil
}

// reload asks the client for a fresh slot map, unless one was asked within
// slotReloadEvery. go-redis reloads in the background and coalesces
// requests; a reload that reaches a dead node first moves on to the next.
func (n *nodes) reload() {
	now := ratelimit.Clock(nil).Now().UnixNano() // monotonic: a stepped host clock moves no interval
	last := n.lastReload.Load()
	if now-last < int64(slotReloadEvery) || !n.lastReload.CompareAndSwap(last, now) {
		return
	}
	n.reloads.Add(1)
	n.cc.ReloadState(context.Background())
}

// live returns the nodes a decision was routed to within nodeIdle, sorted
// by address, and forgets the others.
func (n *nodes) live() []*node {
	now := ratelimit.Clock(nil).Now().UnixNano() // monotonic: a stepped host clock moves no interval
	all := *n.all.Load()
	out := make([]*node, 0, len(all))
	stale := false
	for _, nd := range all {
		if now-nd.used.Load() > int64(nodeIdle) {
			stale = true
			continue
		}
		out = append(out, nd)
	}
	if stale {
		n.mu.Lock()
		cur := *n.all.Load()
		m := make(map[string]*node, len(cur))
		for k, v := range cur {
			if now-v.used.Load() <= int64(nodeIdle) {
				m[k] = v
			}
		}
		n.all.Store(&m)
		n.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b *node) int { return strings.Compare(a.addr, b.addr) })
	return out
}

// worse orders breaker states for a summary: open, then half-open, then
// closed.
func worse(a, b breakerState) breakerState {
	rank := func(s breakerState) int {
		switch s {
		case breakerOpen:
			return 2
		case breakerHalfOpen:
			return 1
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}

// KeyPerMaster returns, on a cluster, one key for each master of the
// client's slot map, by the master's address: key(i) for the first
// i = 0, 1, … whose slot that master serves (key must give each i a {hash
// tag} of its own). Readiness uses it to ask every master for a decision.
// Nil on a standalone or Sentinel store (one node).
func (s *Store) KeyPerMaster(ctx context.Context, key func(i int) string) (map[string]string, error) {
	if s.nodes == nil {
		return nil, nil
	}
	var mu sync.Mutex
	want := map[string]bool{}
	err := s.nodes.cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		want[c.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(want))
	for i := 0; len(out) < len(want) && i < 1<<16; i++ {
		k := key(i)
		c, err := s.nodes.cc.MasterForKey(ctx, k)
		if err != nil {
			return nil, err
		}
		if a := c.Options().Addr; want[a] && out[a] == "" {
			out[a] = k
		}
	}
	return out, nil
}
