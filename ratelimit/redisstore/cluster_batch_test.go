package redisstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/scripts"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// clusterBatch is a cluster, a batched store on it and its masters'
// clients (for their command statistics).
type clusterBatch struct {
	s       *Store
	masters []*redis.Client
}

func newClusterBatch(t *testing.T) *clusterBatch {
	addrs := startCluster(t)
	c, err := NewClient("redis+cluster://" + strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cb := &clusterBatch{s: newStore(t, c, Options{Timeout: slow.Timeout, Batch: 32})}
	t.Cleanup(func() { _ = cb.s.Close() })
	for _, a := range addrs {
		m := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = m.Close() })
		cb.masters = append(cb.masters, m)
	}
	return cb
}

// calls builds one queued call per key at instant now, each judged by the
// breaker of the master that serves its key, or by the first key's
// master's for every call when wrongMaster (a slot map gone stale).
func (cb *clusterBatch) calls(t *testing.T, keys []string, ws *ratelimit.Windows, now time.Time, wrongMaster bool) []*call {
	ctx := context.Background()
	var out []*call
	for _, k := range keys {
		req := cb.s.request(k, ws, now)
		req.scores = make([]float64, ws.Len())
		nd, err := cb.s.nodes.of(ctx, time.Now().Add(time.Second), routeKey(k), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		br := nd.br
		if wrongMaster && len(out) > 0 {
			br = out[0].br
		}
		out = append(out, &call{req: req, asked: time.Now(), deadline: time.Now().Add(slow.Timeout), br: br, res: make(chan callResult, 1)})
	}
	return out
}

// sendAndCompare sends batch (one call per key of keys, in order) as one
// round trip and checks every decision, and its scores, against the
// memory store ref deciding the same keys at the same instant.
func (cb *clusterBatch) sendAndCompare(t *testing.T, round int, batch []*call, keys []string, ws *ratelimit.Windows, now time.Time, ref storetest.Scorer) {
	t.Helper()
	orig := slices.Clone(batch) // send groups the batch by master, in place
	cb.s.batch.send(batch, &batchScratch{})
	for i, c := range orig {
		r := <-c.res
		wd, wscores, err := ref(context.Background(), keys[i], ws, now)
		if err != nil {
			t.Fatalf("round %d, %s: the reference: %v", round, keys[i], err)
		}
		if r.err != nil || r.d != wd || !slices.Equal(c.req.scores, wscores) {
			t.Errorf("round %d, %s: got %+v %v %v, memory store %+v %v", round, keys[i], r.d, r.err, c.req.scores, wd, wscores)
		}
	}
}

// scriptCalls is the number of script calls each master ran since the
// last reset.
func (cb *clusterBatch) scriptCalls(t *testing.T) []int {
	var out []int
	for _, m := range cb.masters {
		info, err := m.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(info, "\n") {
			for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
					v, _, _ := strings.Cut(rest, ",")
					k, _ := strconv.Atoi(v)
					n += k
				}
			}
		}
		out = append(out, n)
	}
	return out
}

func (cb *clusterBatch) reset(t *testing.T) {
	for _, m := range cb.masters {
		if err := m.ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClusterBatchOneCallPerMaster: on a cluster, the decisions of a batch
// whose clients' keys are in different slots of one master go to that
// master as one script call, and decide exactly what the memory store
// decides for the same instants (admissions, waits, scores to the bit).
// Before, every decision on a cluster was its own call.
func TestClusterBatchOneCallPerMaster(t *testing.T) {
	cb := newClusterBatch(t)
	ws := storetest.MustWindows(ratelimit.PerPeriod(3, time.Second), ratelimit.PerPeriod(20, time.Minute))
	var keys []string
	for i := range 40 {
		keys = append(keys, messageKey("10.1.0."+strconv.Itoa(i), "EVENT"))
	}
	// Two messages of one client in one batch: the second must see the first.
	keys = append(keys, keys[0], keys[7])
	// Every master has the script already: a first EVALSHA answered
	// NOSCRIPT and sent again as EVAL would count two calls.
	for _, m := range cb.masters {
		for _, src := range []string{scripts.EWMACluster, scripts.EWMA1} {
			if err := m.ScriptLoad(context.Background(), src).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	ref := memory()
	for round, at := range []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 400 * time.Millisecond, 3 * time.Second} {
		now := storetest.T0.Add(at)
		batch := cb.calls(t, keys, ws, now, false)
		cb.reset(t)
		cb.sendAndCompare(t, round, batch, keys, ws, now, ref)
		calls := cb.scriptCalls(t)
		total := 0
		for _, n := range calls {
			if n > 1 {
				t.Errorf("round %d: a master ran %d script calls for one batch (%v), want one each", round, n, calls)
			}
			total += n
		}
		if total < 2 || total > len(cb.masters) {
			t.Errorf("round %d: %v script calls for %d decisions on 3 masters", round, calls, len(keys))
		}
	}
	if n := cb.s.batch.splits.Load(); n != 0 {
		t.Errorf("%d calls split with a fresh slot map, want 0", n)
	}

	// Fewer than minClusterCall decisions for one master go to it as a
	// lean call each (cheaper for Redis than one call of them); that many
	// in one call.
	var same []string
	var first *node
	for i := 0; len(same) < minClusterCall; i++ {
		k := messageKey("10.2.0."+strconv.Itoa(i), "EVENT")
		nd, err := cb.s.nodes.of(context.Background(), time.Now().Add(time.Second), routeKey(k), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = nd
		}
		if nd == first {
			same = append(same, k)
		}
	}
	for n := 1; n <= minClusterCall; n++ {
		now := storetest.T0.Add(time.Duration(10+n) * time.Second)
		cb.reset(t)
		cb.sendAndCompare(t, 10+n, cb.calls(t, same[:n], ws, now, false), same[:n], ws, now, ref)
		want := n
		if n >= minClusterCall {
			want = 1
		}
		if calls := cb.scriptCalls(t); slices.Max(calls) != want || total(calls) != want {
			t.Errorf("%d decisions for one master: script calls %v, want %d on it", n, calls, want)
		}
	}
}

func total(ns []int) int {
	t := 0
	for _, n := range ns {
		t += n
	}
	return t
}

// TestClusterBatchSplitsWhatAMasterRefuses: a batch grouped by a stale
// slot map (every call filed under the first key's master) reaches a
// master that serves only some of its keys. The master refuses the call
// before writing anything, and each decision is made again on its own
// master: every client charged exactly once, as the memory store says.
func TestClusterBatchSplitsWhatAMasterRefuses(t *testing.T) {
	cb := newClusterBatch(t)
	ws := storetest.MustWindows(ratelimit.PerPeriod(2, time.Second))
	var keys []string
	for i := range 12 {
		keys = append(keys, messageKey("10.2.0."+strconv.Itoa(i), "REQ"))
	}
	ref := memory()
	for round := range 3 {
		now := storetest.T0.Add(time.Duration(round) * 100 * time.Millisecond)
		batch := cb.calls(t, keys, ws, now, true)
		cb.sendAndCompare(t, round, batch, keys, ws, now, ref)
	}
	if n := cb.s.batch.splits.Load(); n != 3 {
		t.Errorf("%d calls split, want 3 (one per round)", n)
	}
}

// TestClusterRefusal: which errors of a cluster call mean its master
// declined it whole (decided again one by one) and which mean the server
// cannot run it at all (one decision per call from then on). A timeout or
// a script's own refusal is neither.
func TestClusterRefusal(t *testing.T) {
	for _, tc := range []struct {
		err                  error
		refused, unsupported bool
	}{
		{redis.ErrClosed, false, false},
		{context.DeadlineExceeded, false, false},
		{errors.New("ERR Script attempted to access a non local key in a cluster node"), false, false}, // not a Redis error reply
		{replyErr("ERR Script attempted to access a non local key in a cluster node script: abc, on @user_script:12."), true, false},
		{replyErr("MOVED 3999 127.0.0.1:6381"), true, false},
		{replyErr("ASK 3999 127.0.0.1:6381"), true, false},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), true, false},
		{replyErr("CROSSSLOT Keys in request don't hash to the same slot"), true, false},
		{replyErr("ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'"), true, true},
		{replyErr("ERR sluice ewma: malformed value at x"), false, false},
		{replyErr("ERR sluice late: past the cutoff, nothing decided"), false, false},
		{replyErr("CLUSTERDOWN The cluster is down"), false, false},
	} {
		refused, unsupported := clusterRefusal(tc.err)
		if refused != tc.refused || unsupported != tc.unsupported {
			t.Errorf("%v: refused %v unsupported %v, want %v %v", tc.err, refused, unsupported, tc.refused, tc.unsupported)
		}
	}
}

// TestRingBatchOneCallPerDecision: a go-redis Ring shards keys by its own
// hashing, not by slots a script could be told about, so a batch on a ring
// stays one call per decision, each on its key's shard. A batch sent as
// one call would leave some clients' values on the wrong shard, where
// their next decisions (routed by the ring) would not find them.
func TestRingBatchOneCallPerDecision(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr(), "b": b.Addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = ring.Close() })
	s := newStore(t, ring, Options{Timeout: slow.Timeout, Batch: 32})
	t.Cleanup(func() { _ = s.Close() })
	ws := storetest.MustWindows(ratelimit.PerPeriod(3, time.Second))
	var keys []string
	for i := range 24 {
		keys = append(keys, messageKey("10.3.0."+strconv.Itoa(i), "EVENT"))
	}
	ref := memory()
	ctx := context.Background()
	for round := range 3 {
		now := storetest.T0.Add(time.Duration(round) * 10 * time.Millisecond)
		var batch []*call
		for _, k := range keys {
			req := s.request(k, ws, now)
			req.scores = make([]float64, ws.Len())
			batch = append(batch, &call{req: req, asked: time.Now(), deadline: time.Now().Add(slow.Timeout), br: s.br, res: make(chan callResult, 1)})
		}
		cb := &clusterBatch{s: s}
		cb.sendAndCompare(t, round, batch, keys, ws, now, ref)
	}
	// Decided alone, as the ring routes each key: the batches' state is
	// where the ring looks for it.
	now := storetest.T0.Add(30 * time.Millisecond)
	for _, k := range keys {
		wd, _, err := ref(ctx, k, ws, now)
		if err != nil {
			t.Fatalf("%s: the reference: %v", k, err)
		}
		if d, err := s.Decide(ctx, k, ws, now); err != nil || d != wd {
			t.Errorf("%s alone after the batches: %+v %v, memory store %+v", k, d, err, wd)
		}
	}
	na, _ := redis.NewClient(&redis.Options{Addr: a.Addr()}).DBSize(ctx).Result()
	nb, _ := redis.NewClient(&redis.Options{Addr: b.Addr()}).DBSize(ctx).Result()
	if na == 0 || nb == 0 || na+nb != int64(len(keys)) {
		t.Errorf("keys on the shards: %d and %d, want all %d spread over both", na, nb, len(keys))
	}
}

// TestClusterSplitHungMaster: a call refused whole by its master (a stale
// slot map) is decided again one decision per call; with another master
// hung meanwhile, its clients' decisions fail at their deadline as
// unavailable, and every other client's is decided and charged as the
// memory store says. (The split's decisions sent as one cluster pipeline
// passed this too, in the one run tried: go-redis v9.23 kept the nodes'
// errors apart there.)
func TestClusterSplitHungMaster(t *testing.T) {
	srvs := redistest.StartCluster(t)
	var addrs []string
	for _, s := range srvs {
		addrs = append(addrs, s.Addr())
	}
	c, err := NewClient("redis+cluster://" + strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cb := &clusterBatch{s: newStore(t, c, Options{Timeout: time.Second, Batch: 32})}
	t.Cleanup(func() { _ = cb.s.Close() })
	ctx := context.Background()
	ws := storetest.MustWindows(ratelimit.PerPeriod(2, time.Second))
	var keys []string
	for i := range 12 {
		keys = append(keys, messageKey("10.4.0."+strconv.Itoa(i), "EVENT"))
	}
	masterOf := func(k string) string {
		m, err := c.(*redis.ClusterClient).MasterForKey(ctx, cb.s.prefix+k)
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	// Hang a master that serves some keys but not the first: the call goes
	// to the first key's master, which refuses it (the others' keys are
	// not its own), and the split decides each key on its own master.
	first := masterOf(keys[0])
	var hung *redistest.Server
	for _, s := range srvs {
		if s.Addr() == first {
			continue
		}
		for _, k := range keys {
			if masterOf(k) == s.Addr() {
				hung = s
			}
		}
		if hung != nil {
			break
		}
	}
	if hung == nil {
		t.Fatal("every key on one master; pick others")
	}
	ref := memory()
	now := storetest.T0
	batch := cb.calls(t, keys, ws, now, true)
	orig := slices.Clone(batch)
	hung.Pause()
	defer hung.Resume()
	cb.s.batch.send(batch, &batchScratch{})
	decided, refused := 0, 0
	for i, call := range orig {
		r := <-call.res
		if masterOf(keys[i]) == hung.Addr() {
			if r.err == nil {
				t.Errorf("%s on the hung master: %+v, want it unavailable", keys[i], r.d)
			}
			refused++
			continue
		}
		wd, wscores, err := ref(ctx, keys[i], ws, now)
		if err != nil {
			t.Fatalf("%s: the reference: %v", keys[i], err)
		}
		if r.err != nil || r.d != wd || !slices.Equal(call.req.scores, wscores) {
			t.Errorf("%s on a healthy master: %+v %v %v, memory store %+v %v", keys[i], r.d, r.err, call.req.scores, wd, wscores)
		}
		decided++
	}
	if decided == 0 || refused == 0 || cb.s.batch.splits.Load() != 1 {
		t.Errorf("%d decided, %d on the hung master, %d splits: the test wants both and one split", decided, refused, cb.s.batch.splits.Load())
	}
}

// TestClusterColdClientHungMaster: the first decision a new cluster client
// routes by its key (a split, a redirect, a resend) is answered by its
// healthy master while another master hangs. go-redis's cluster client,
// with its routing policies on, first asks a random node for COMMAND and
// holds the call meanwhile; each of the eight clients here picks the hung
// master with one chance in three, so the test fails without NewClient
// turning the policies off in all but about 4 % of runs.
func TestClusterColdClientHungMaster(t *testing.T) {
	srvs := redistest.StartCluster(t)
	var addrs []string
	for _, s := range srvs {
		addrs = append(addrs, s.Addr())
	}
	ctx := context.Background()
	key := messageKey("10.5.0.1", "EVENT")
	ws := storetest.MustWindows(ratelimit.PerPeriod(2, time.Second))
	var clients []*redis.ClusterClient
	for range 8 {
		c, err := NewClient("redis+cluster://" + strings.Join(addrs, ","))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		cc := c.(*redis.ClusterClient)
		// The slot map is loaded before the hang: a client that has none
		// yet is not what this test is about.
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() }); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, cc)
	}
	s := newStore(t, clients[0], Options{Timeout: time.Second})
	m, err := clients[0].MasterForKey(ctx, s.prefix+key)
	if err != nil {
		t.Fatal(err)
	}
	var hung *redistest.Server
	for _, srv := range srvs {
		if srv.Addr() != m.Options().Addr {
			hung = srv
			break
		}
	}
	hung.Pause()
	defer hung.Resume()
	for i, c := range clients {
		req := s.request(key, ws, storetest.T0.Add(time.Duration(i)*time.Minute))
		req.scores = make([]float64, ws.Len())
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := run(cctx, c, req)
		cancel()
		if err != nil {
			t.Errorf("client %d: a decision on a healthy master, %s hung: %v", i, hung.Addr(), err)
		}
	}
}
