package redisstore

import (
	"context"
	"errors"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/ratelimit"
)

// errClosed is wrapped (with ratelimit.ErrUnavailable) by Decide after Close.
var errClosed = errors.New("redisstore: store closed")

// ErrOverloaded is wrapped (with ratelimit.ErrUnavailable) by Decide for a
// decision whose caller's own deadline (its context's) passed before the
// decision was sent: the gate was too busy (or too starved of CPU) to ask
// Redis in time. It says nothing about Redis, and the breaker does not
// count it. (The store's Timeout runs from the sending, so it alone never
// expires a decision unsent.)
var ErrOverloaded = errors.New("redisstore: decision expired in the gate's queue, never sent")

// call is one decision of a batched Store.
type call struct {
	req      *request
	asked    time.Time       // when Decide was called
	until    time.Time       // the caller's own deadline (its context's); zero: none
	deadline time.Time       // its whole deadline, set when it is sent (see deadlineAt); zero: none
	br       *breaker        // the breaker of the node it goes to
	probe    bool            // br's half-open probe
	answered bool            // set by exec: Redis answered its part
	res      chan callResult // capacity 1: a leader never blocks on a caller who left
	state    callState       // under batcher.mu
	sent     atomic.Bool     // went out in a batch (its round trip reports a probe)
	directed bool            // went straight out (direct reported it)
}

type callState uint8

const (
	queued    callState = iota
	taken               // in a leader's batch: its result will come on res
	leading             // handed a lead token on res: it sends a batch
	abandoned           // its caller left while it was queued
)

type callResult struct {
	d    ratelimit.Decision
	err  error
	lead bool // not a result: the receiver leads the next round trip
}

// batcher groups the decisions of concurrent callers into shared round
// trips without goroutines of its own.
//
// A decision goes straight out from its caller's goroutine, alone, as long
// as nothing is queued and fewer than directFlight (directPerFlight ×
// flight) round trips are in flight, all of them straight out, and none has
// queued since (directCapLocked): at low
// concurrency there is nothing to batch, and a hand-off would only add
// latency (at 4 callers and 2 in flight, half of them queued into batches
// of two or three, and each such decision cost both sides more CPU than
// going alone: BenchmarkRedisConcurrency). Past that it queues, and each
// round trip that completes hands its slot to the oldest queued caller —
// at once while no batch is in flight, else only while at most flight are
// in flight — which takes up to max queued decisions (the queue built up
// during the round trip) and sends them as one pipeline, on a plain client
// as one script call (fewer than minCall: a lean call each, which costs
// Redis less). From then on decisions go straight out only below
// flight, until the last round trip in flight finishes with nothing
// queued. So at high concurrency decisions go in full batches, flight at a
// time.
//
// Each decision keeps its own whole deadline: the store's Timeout from the
// moment it is sent, or its caller's context's deadline if earlier (see
// deadlineAt). The Timeout bounds Redis: the time a decision waits in this
// queue, or for a CPU, is the gate's own load, and refusing a decision for
// it would answer "unavailable" while Redis answers every call in time (a
// gate whose CPU is saturated, at a few hundred publishing connections,
// did that for a share of its decisions). The wait is bounded all the
// same: a queued decision waits for a round trip to free up at most
// patience (a twentieth of the Timeout), after which another round trip is
// started for it beyond flight (up to hardFlight); past hardFlight it
// waits for one of them to end, which each does by its own deadline; and
// once its master's breaker is open it is failed unsent. A batch is cut
// where its decisions' deadlines spread by more than patience, and its
// pipeline carries the latest of them, so no decision is cut short by a
// neighbour's earlier deadline and none is answered later than its own by
// more than patience. A decision whose caller's deadline passed before it
// was sent is failed unsent, with ErrOverloaded.
type batcher struct {
	client       redis.UniversalClient
	shared       bool // decisions of any keys may share a script call (see exec)
	cluster      bool // a *redis.ClusterClient: decisions of one master may (see exec)
	max          int
	flight       int
	directFlight int
	hardFlight   int
	patience     time.Duration
	timeout      time.Duration                     // the store's Timeout, from a decision's sending; 0 or less: none
	margin       time.Duration                     // see Store.margin
	trip         func(br *breaker, probe, ok bool) // once per node a round trip reached for
	stop         chan struct{}
	timer        *time.Timer

	// nodeAt returns the breaker of the cluster master at addr (nil: none),
	// which a redirected decision was sent on to (see round).
	nodeAt func(addr string) *breaker

	mu       sync.Mutex
	q        []*call // q[head:] are queued (some abandoned)
	head     int
	live     int // queued, not abandoned
	inflight int
	leaders  int  // of inflight, the batched round trips
	busy     bool // a decision queued since the last time nothing was in flight
	armed    bool // timer set
	closed   bool

	scratch sync.Pool
	ctxs    callPool // the timers of batches (callCtx)

	// pipelines and calls count the batched round trips and the decisions
	// they carried, for the benchmarks' mean batch size; direct counts the
	// decisions that went straight out; expired those failed unsent;
	// splits the cluster calls a master refused whole, and redirected the
	// decisions a master answered MOVED or ASK, sent on alone (see round).
	pipelines, calls, direct, expired, splits, redirected atomic.Int64

	// known is the Store's: whether Redis has the scripts cached (EVAL
	// until it has; see Store.known).
	known *atomic.Bool

	// noCluster: the cluster's servers cannot run scripts.EWMACluster
	// (older than Redis 7.0): one decision per call.
	noCluster atomic.Bool
}

// directPerFlight × flight round trips may be in flight, each of a
// decision sent alone, before decisions queue (see batcher).
const directPerFlight = 2

// hardFlightPerFlight bounds the round trips started past flight for
// decisions that waited out their patience (Redis slow, not busy).
const hardFlightPerFlight = 16

func newBatcher(client redis.UniversalClient, shared bool, max, flight int, patience time.Duration, trip func(br *breaker, probe, ok bool)) *batcher {
	if patience <= 0 {
		patience = time.Millisecond
	}
	b := &batcher{
		client:       client,
		shared:       shared,
		max:          max,
		flight:       flight,
		directFlight: flight * directPerFlight,
		hardFlight:   flight * hardFlightPerFlight,
		patience:     patience,
		trip:         trip,
		stop:         make(chan struct{}),
	}
	if b.trip == nil {
		b.trip = func(*breaker, bool, bool) {}
	}
	b.timer = time.AfterFunc(time.Hour, b.sweep)
	b.timer.Stop()
	return b
}

// do decides req: straight out when nothing waits, else in a batch.
// direct runs req alone from this goroutine.
func (b *batcher) do(ctx context.Context, c *call, direct func() (ratelimit.Decision, error)) (ratelimit.Decision, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ratelimit.Decision{}, errClosed
	}
	if b.live == 0 && b.inflight < b.directCapLocked() {
		b.inflight++
		b.mu.Unlock()
		b.direct.Add(1)
		c.directed = true
		d, err := direct()
		b.finish(false)
		return d, err
	}
	return b.queueLocked(ctx, c)
}

// tryDirect takes a round trip slot for a decision to go straight out from
// its caller, if nothing is queued and one is free: the caller runs it and
// calls finish. Otherwise it returns with b.mu still held, for queueLocked:
// one lock per decision either way, and nothing allocated on the direct
// path (do allocates the call and its channel).
func (b *batcher) tryDirect() bool {
	b.mu.Lock()
	if !b.closed && b.live == 0 && b.inflight < b.directCapLocked() {
		b.inflight++
		b.mu.Unlock()
		b.direct.Add(1)
		return true
	}
	return false
}

// queue queues c for a shared round trip and waits for its result.
func (b *batcher) queue(ctx context.Context, c *call) (ratelimit.Decision, error) {
	b.mu.Lock()
	return b.queueLocked(ctx, c)
}

// queueLocked is queue with b.mu held (it unlocks it).
func (b *batcher) queueLocked(ctx context.Context, c *call) (ratelimit.Decision, error) {
	if b.closed {
		b.mu.Unlock()
		return ratelimit.Decision{}, errClosed
	}
	c.res = make(chan callResult, 1)
	b.q = append(b.q, c)
	b.live++
	b.busy = true
	switch {
	case b.inflight < b.flight || (b.live >= b.max && b.inflight < b.hardFlight):
		// A slot is free (its holder is handing it over), or a full batch
		// waits: start a round trip now.
		b.startLocked()
	case !b.armed:
		b.armed = true
		b.timer.Reset(b.patience)
	}
	b.mu.Unlock()
	for {
		select {
		case r := <-c.res:
			if !r.lead {
				return r.d, r.err
			}
			b.lead(c)
			// lead delivered this call's own result on res.
		case <-ctx.Done():
			b.abandon(c)
			return ratelimit.Decision{}, ctx.Err()
		case <-b.stop:
			// A call that was queued when Close ran gets errClosed there;
			// one taken or leading is answered as the store shuts down.
			return ratelimit.Decision{}, errClosed
		}
	}
}

// startLocked hands a lead token to the oldest queued call, taking a
// round trip slot for it. b.mu is held.
func (b *batcher) startLocked() {
	c := b.popLocked()
	if c == nil {
		return
	}
	b.inflight++
	b.leaders++
	c.state = leading
	c.res <- callResult{lead: true}
}

// popLocked removes and returns the oldest live queued call, or nil.
func (b *batcher) popLocked() *call {
	for b.head < len(b.q) {
		c := b.q[b.head]
		b.q[b.head] = nil
		b.head++
		if c.state == abandoned {
			continue
		}
		b.live--
		if b.head == len(b.q) {
			b.q, b.head = b.q[:0], 0
		}
		return c
	}
	b.q, b.head = b.q[:0], 0
	return nil
}

// peekLocked returns the oldest live queued call without removing it.
func (b *batcher) peekLocked() *call {
	for i := b.head; i < len(b.q); i++ {
		if c := b.q[i]; c.state != abandoned {
			return c
		}
	}
	return nil
}

// finish hands a finished round trip's slot (a batch's when lead) to the
// oldest queued call, or frees it. A slot beyond flight is freed unless no
// batch is in flight (decisions queued behind round trips that all went
// straight out: the first batch starts at once) or the oldest call has
// already waited out its patience.
func (b *batcher) finish(lead bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if lead {
		b.leaders--
	}
	if b.live > 0 && !b.closed {
		if b.inflight <= b.flight || b.leaders == 0 || time.Since(b.peekLocked().asked) >= b.patience {
			b.inflight--
			b.startLocked()
			return
		}
	}
	if b.live == 0 && b.inflight == 1 {
		b.busy = false // the last round trip in flight, and nothing waits
	}
	b.inflight--
}

// sweep runs patience after a call was queued with every slot busy: if
// calls still wait, one more round trip is started for them (Redis is
// slow, not busy: the queue must not keep them), and calls past their
// caller's own deadline are failed if no round trip can be started.
func (b *batcher) sweep() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = false
	if b.closed || b.live == 0 {
		return
	}
	if b.inflight < b.hardFlight {
		b.startLocked()
	} else {
		now := time.Now()
		for i := b.head; i < len(b.q); i++ {
			if c := b.q[i]; c.state == queued && !c.until.IsZero() && !now.Before(c.until) {
				c.state = abandoned
				b.live--
				b.expired.Add(1)
				c.res <- callResult{err: ErrOverloaded}
			}
		}
	}
	if b.live > 0 {
		b.armed = true
		b.timer.Reset(b.patience)
	}
}

// abandon withdraws a call whose caller left. A lead token it was handed
// is passed on, so the slot is not lost.
func (b *batcher) abandon(c *call) {
	b.mu.Lock()
	switch c.state {
	case queued:
		c.state = abandoned
		b.live--
		b.mu.Unlock()
		return
	case leading:
		b.mu.Unlock()
		if r := <-c.res; !r.lead {
			return // cannot happen: a leading call's res holds only the token
		}
		b.finish(true)
		return
	}
	b.mu.Unlock()
}

// batchScratch is a leader's reusable slices.
type batchScratch struct {
	batch  []*call
	sorted []*call
	reqs   []*request
	groups []group
}

// lead sends first and the calls queued behind it (up to max, cut where
// deadlines spread by more than patience) as one round trip, answers
// them, and hands the slot on.
func (b *batcher) lead(first *call) {
	sc, _ := b.scratch.Get().(*batchScratch)
	if sc == nil {
		sc = &batchScratch{batch: make([]*call, 0, b.max)}
	}
	batch := append(sc.batch[:0], first)
	b.mu.Lock()
	if b.live < b.max/2 {
		// Let the callers about to queue join: a round trip costs Redis's
		// thread per call, so a fuller one is cheaper per decision.
		b.mu.Unlock()
		runtime.Gosched()
		b.mu.Lock()
	}
	first.state = taken
	now := time.Now()
	fd := b.deadlineAt(first, now)
	for len(batch) < b.max {
		c := b.peekLocked()
		if c == nil || (!fd.IsZero() && b.deadlineAt(c, now).Sub(fd) > b.patience) {
			break
		}
		b.popLocked()
		c.state = taken
		batch = append(batch, c)
	}
	b.mu.Unlock()
	b.send(batch, sc)
	clear(batch)
	sc.batch = batch[:0]
	b.scratch.Put(sc)
	b.finish(true)
}

// deadlineAt is c's whole deadline were it sent at now: the store's
// Timeout from now, or the caller's own deadline when that is earlier;
// zero for none.
func (b *batcher) deadlineAt(c *call, now time.Time) time.Time {
	var d time.Time
	if b.timeout > 0 {
		d = now.Add(b.timeout)
	}
	if !c.until.IsZero() && (d.IsZero() || c.until.Before(d)) {
		d = c.until
	}
	return d
}

// send gives each call its deadline from now, fails unsent those whose
// caller's deadline has passed and those whose master's breaker opened
// while they waited (Redis stopped answering: sent, they would only wait
// out their Timeout), and executes the rest with the latest of their
// deadlines.
func (b *batcher) send(batch []*call, sc *batchScratch) {
	var first, last time.Time
	none := false // a call without a deadline: the pipeline has none either
	now := time.Now()
	live := batch[:0]
	for _, c := range batch {
		if c.br != nil && !c.probe && c.br.state() == breakerOpen {
			c.res <- callResult{err: errOpenRefused}
			continue
		}
		c.deadline = b.deadlineAt(c, now)
		if c.deadline.IsZero() {
			none = true
		} else {
			if !now.Before(c.deadline) {
				b.expired.Add(1)
				c.res <- callResult{err: ErrOverloaded}
				continue
			}
			if c.deadline.After(last) {
				last = c.deadline
			}
			if first.IsZero() || c.deadline.Before(first) {
				first = c.deadline
			}
		}
		c.sent.Store(true)
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	if none {
		last = time.Time{}
	}
	b.pipelines.Add(1)
	b.calls.Add(int64(len(live)))
	b.exec(last, cutoff(first, b.margin), live, sc)
	// One report per node the round trip reached: one on a plain client,
	// one per master on a cluster (go-redis splits the pipeline by node,
	// and one node not answering says nothing of the others).
	var seen [8]*breaker
	done := seen[:0]
	for i, c := range live {
		if slices.Contains(done, c.br) {
			continue
		}
		done = append(done, c.br)
		probe, ok := false, true
		for _, d := range live[i:] {
			if d.br == c.br {
				probe = probe || d.probe
				ok = ok && d.answered
			}
		}
		b.trip(c.br, probe, ok)
	}
}

func (b *batcher) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	b.timer.Stop()
	for c := b.popLocked(); c != nil; c = b.popLocked() {
		c.res <- callResult{err: errClosed}
	}
	close(b.stop)
	b.mu.Unlock()
}

// maxCallKeys bounds the keys of one script call: the script unpacks them
// onto Lua's C stack for one MGET.
const maxCallKeys = 1024

// minCall and minClusterCall are the fewest decisions that share a script
// call, ewma.lua's and scripts.EWMACluster's: fewer go as lean calls (one
// each, in the same pipeline, so in the same order on the same
// connection), which cost Redis less: a shared call's fixed cost is only
// repaid from this many decisions (BenchmarkScriptInstructions measures
// it).
const (
	minCall        = 3
	minClusterCall = 4
)

// group is one script call of a batch: the calls batch[start:end].
type group struct {
	start, end int
	args       []any
	cmd        *redis.Cmd
	again      bool // sent again as EVAL
	split      bool // refused whole by a cluster master: decided one by one
}

// exec decides the batch, bounded by deadline (zero: none) and, in the
// script, by the cutoff cut (unix ms, the earliest decision's deadline less
// the margin; 0: none), past which nothing is written: a decision refused
// as unavailable is not charged. It answers every
// call, and reports whether Redis answered (the breaker's outcome for the
// round trip). On a client where any keys may share a script call (one
// Redis, or a sentinel's master), consecutive calls at one instant go in
// one EVALSHA: Redis parses, dispatches and reads the time once for all of
// them, and reads every window with one MGET. On a cluster the batch is
// first grouped by master (byMaster), and consecutive calls for one master
// at one instant go in one EVALSHA of scripts.EWMACluster (one GET per
// key; see round for a master refusing it), unless the servers cannot run
// it (noCluster): then each decision is its own call. Fewer decisions than
// minCall (minClusterCall on a cluster) go as a lean call each (leanArgs). The EVALSHAs go in one pipeline (one per
// master on a cluster), and those that find the script missing (a
// restarted Redis, SCRIPT FLUSH) go again as EVAL, which also reloads it.
func (b *batcher) exec(deadline time.Time, cut int64, batch []*call, sc *batchScratch) bool {
	ctx := context.Background()
	if !deadline.IsZero() {
		cc := b.ctxs.withDeadline(ctx, deadline)
		defer cc.release()
		ctx = cc
	}
	cluster := b.cluster && !b.noCluster.Load()
	if cluster {
		sc.sorted = byMaster(batch, sc.sorted)
	}
	reqs := sc.reqs[:0]
	for _, c := range batch {
		reqs = append(reqs, c.req)
	}
	groups := sc.groups[:0]
	for start, keys, i := 0, 0, 0; i < len(reqs); i++ {
		keys += reqs[i].callKeys()
		next := i + 1
		if next == len(reqs) || reqs[next].now != reqs[start].now || keys+reqs[next].callKeys() > maxCallKeys ||
			(!b.shared && (!cluster || batch[next].br != batch[start].br)) {
			var args []any
			switch {
			case next-start < minCall || cluster && next-start < minClusterCall:
				// Too few to share a call: each decision its own lean
				// call, which costs Redis less (see minCall).
				for j := start; j < next; j++ {
					args = evalFirst(leanArgs(reqs[j], cut), b.known)
					groups = append(groups, group{start: j, end: j + 1, args: args, cmd: newCmd(ctx, args)})
				}
				start, keys = next, 0
				continue
			case cluster:
				args = clusterCommand(reqs[start:next], cut)
			default:
				args = commandBy(reqs[start:next], cut)
			}
			args = evalFirst(args, b.known)
			groups = append(groups, group{start: start, end: next, args: args, cmd: newCmd(ctx, args)})
			start, keys = next, 0
		}
	}
	var ok bool
	if nodes := b.byNode(batch, groups); nodes != nil {
		// A cluster batch for several masters: one pipeline per master, all
		// at once, each answered as soon as its master replies. In one
		// pipeline a hung master would hold the others' replies to the
		// deadline, and go-redis, failing its retry there, stamps the
		// deadline's error on every command of the pipeline, the answered
		// ones too: healthy masters' clients refused, and charged.
		var wg sync.WaitGroup
		var failed atomic.Bool
		for _, gs := range nodes[1:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !b.round(ctx, cut, reqs, batch, gs, b.master(ctx, reqs, gs)) {
					failed.Store(true)
				}
			}()
		}
		ok = b.round(ctx, cut, reqs, batch, nodes[0], b.master(ctx, reqs, nodes[0]))
		wg.Wait()
		ok = ok && !failed.Load()
	} else {
		ok = b.round(ctx, cut, reqs, batch, groups, b.master(ctx, reqs, groups))
	}
	clear(reqs)
	clear(groups)
	sc.reqs, sc.groups = reqs[:0], groups[:0]
	return ok
}

// byNode splits a cluster batch's groups (one call each) by the node their
// calls go to, or returns nil when they all go to one node (or the client
// is not a cluster's).
func (b *batcher) byNode(batch []*call, groups []group) [][]group {
	if b.shared || len(groups) < 2 {
		return nil
	}
	first := batch[groups[0].start].br
	one := true
	for _, g := range groups[1:] {
		if batch[g.start].br != first {
			one = false
			break
		}
	}
	if one {
		return nil
	}
	var brs []*breaker
	var out [][]group
	for _, g := range groups {
		br := batch[g.start].br
		i := slices.Index(brs, br)
		if i < 0 {
			i = len(brs)
			brs = append(brs, br)
			out = append(out, nil)
		}
		out[i] = append(out[i], g)
	}
	return out
}

// master returns the client of the cluster master that groups, one
// master's calls, go to (the master of the first call's key in the
// client's slot map), or nil on a plain client or when the cluster client
// has no slot map: then they go through b.client.
func (b *batcher) master(ctx context.Context, reqs []*request, groups []group) *redis.Client {
	cc, ok := b.client.(*redis.ClusterClient)
	if !ok || b.shared || len(groups) == 0 {
		return nil
	}
	c, err := cc.MasterForKey(ctx, reqs[groups[0].start].keys[0])
	if err != nil {
		return nil
	}
	return c
}

// round sends groups as one round trip (EVAL again for those that found
// the script missing), answers their calls, and reports whether Redis
// answered every one; cut is the batch's cutoff (see exec), for the
// decisions of a refused cluster call sent again.
//
// On a cluster, via is the client of the master the groups go to, and the
// round trip goes through it rather than through the cluster client: a
// command answered MOVED or ASK (its slot moved, or is moving and its key
// is gone) comes back as that reply, and the others are answered at once.
// Through the cluster client's pipeline, go-redis would follow the
// redirect inside the pipeline after a retry backoff (10 ms or more,
// growing at each redirect) with every command of the pipeline waiting,
// and when the backoff outlasts the context it fails them all with the
// context's error, the answered ones too: a reshard refused clients whose
// slots did not move. A redirected decision is sent on alone through the
// cluster client, which follows MOVED and ASK without a backoff; the
// master that redirected it did answer, and the master it went on to is
// judged by that decision's round trip. A command that lost its
// connection before any reply goes again through the cluster client,
// which resends on a fresh connection (the request id makes a resent
// decision count once).
func (b *batcher) round(ctx context.Context, cut int64, reqs []*request, batch []*call, groups []group, via *redis.Client) bool {
	var to sender = b.client
	if via != nil {
		to = via
	}
	b.process(ctx, to, groups, false)
	if via != nil {
		lost := false
		for i := range groups {
			if lostConn(groups[i].cmd.Err()) && ctx.Err() == nil {
				groups[i].cmd = newCmd(ctx, groups[i].args)
				groups[i].again, lost = true, true
			}
		}
		if lost {
			b.process(ctx, b.client, groups, true)
			for i := range groups {
				groups[i].again = false
			}
		}
	}
	retry := false
	for i := range groups {
		if isNoScript(groups[i].cmd.Err()) {
			groups[i].cmd = newCmd(ctx, evalArgs(groups[i].args))
			groups[i].again, retry = true, true
		}
	}
	if retry {
		b.process(ctx, to, groups, true)
	}
	for i := range groups {
		learnScript(groups[i].cmd.Err(), b.known)
	}
	// A cluster call its master refused whole (a key it does not serve or
	// that is migrating away, a Redis without the shebang): nothing of it
	// was written; its decisions go again one per call, each to its key's
	// master (go-redis follows MOVED and ASK for one key).
	var singles []group
	var movedTo []string // for each of singles, the master it was redirected to ("": none)
	for i := range groups {
		g := &groups[i]
		if via != nil && g.end-g.start == 1 {
			if addr, ok := redirect(g.cmd.Err()); ok {
				g.split = true
				batch[g.start].answered = true // its master answered, with a redirect
				b.redirected.Add(1)
				singles = append(singles, group{start: g.start, end: g.end, args: g.args, cmd: newCmd(ctx, g.args)})
				movedTo = append(movedTo, addr)
				continue
			}
		}
		if g.end-g.start < 2 || (g.args[1] != argSHAX && g.args[1] != argSourceX) {
			continue
		}
		refused, unsupported := clusterRefusal(g.cmd.Err())
		if unsupported {
			b.noCluster.Store(true)
		}
		if !refused {
			continue
		}
		g.split = true
		b.splits.Add(1)
		for j := g.start; j < g.end; j++ {
			args := leanArgs(reqs[j], cut)
			singles = append(singles, group{start: j, end: j + 1, args: args, cmd: newCmd(ctx, args)})
			movedTo = append(movedTo, "")
		}
	}
	// The calls Redis answered are answered first: a moved key's
	// decisions, sent again below, must not hold the others'.
	ok := true
	for _, g := range groups {
		if g.split {
			continue
		}
		split(g.cmd, reqs[g.start:g.end], func(i int, reply any, err error) {
			r := reqs[g.start+i]
			d, err := decision(reply, err, r)
			c := batch[g.start+i]
			c.answered = heard(err, c.asked)
			if !c.answered {
				ok = false
			}
			c.res <- callResult{d: d, err: err}
		})
	}
	if len(singles) > 0 && !b.splitRound(ctx, cut, reqs, batch, singles, movedTo) {
		ok = false
	}
	return ok
}

// sender is what a round trip needs of a client: the cluster client, or
// one master's.
type sender interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
}

// redirect reads a MOVED or ASK reply: the address it names.
func redirect(err error) (addr string, ok bool) {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return "", false
	}
	msg := re.Error()
	if !strings.HasPrefix(msg, "MOVED ") && !strings.HasPrefix(msg, "ASK ") {
		return "", false
	}
	f := strings.Fields(msg)
	if len(f) != 3 {
		return "", false
	}
	return f[2], true
}

// lostConn reports whether err is a command's connection failing before
// any reply (a reset or closed connection, a closed pool), not a reply and
// not a deadline: the command may go again on a fresh connection.
func lostConn(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		return false
	}
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// splitRound decides the decisions of cluster calls a master refused whole
// (one call each, see round) at once, each in a round trip of its own,
// routed by go-redis by its key: as exec keeps one pipeline per master, so
// that a hung master's timeout cannot reach the others' decisions (a shared
// cluster pipeline did that once in TestClusterMasterHung's runs). It is
// the rare path of a stale slot map or a slot on the move, so a goroutine
// per decision is cheap enough.
//
// A decision redirected by its master (movedTo[i] names where to) is
// judged, for the breakers, against the master it was redirected to: the
// one that redirected it answered.
func (b *batcher) splitRound(ctx context.Context, cut int64, reqs []*request, batch []*call, singles []group, movedTo []string) bool {
	var wg sync.WaitGroup
	var failed atomic.Bool
	for i := range singles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := b.round(ctx, cut, reqs, batch, singles[i:i+1], nil)
			if movedTo[i] == "" {
				if !ok {
					failed.Store(true)
				}
				return
			}
			c := batch[singles[i].start]
			c.answered = true
			if b.nodeAt != nil {
				if br := b.nodeAt(movedTo[i]); br != nil {
					b.trip(br, false, ok)
				}
			}
		}()
	}
	wg.Wait()
	return !failed.Load()
}

// answered reports whether a call's error (nil: none) means Redis answered
// as the script would: a success, the script refusing a value, or Cluster
// refusing a key's slots. Anything else — a timeout, a refused or reset
// connection, a reply that is not the script's — counts against Redis.
func answered(err error) bool {
	return err == nil || isScriptRefusal(err) || isCrossSlot(err)
}

// decision reads the reply of request r (or its call's error): with a
// companion, both parts (By 1: the companion's refusal or error).
func decision(reply any, err error, r *request) (ratelimit.Decision, error) {
	if err != nil {
		return ratelimit.Decision{}, err
	}
	if _, bare := reply.(int64); r.with == nil || bare {
		// Alone, or the lean script's bare admission of the message and
		// its room together.
		d, err := parseReply(reply, r.windows.Len(), r.scores)
		if err == nil && d.Allowed && r.scores != nil {
			r.value = reply.([]any)[1].(string) // parseReply read it
		}
		return d, err
	}
	arr, ok := reply.([]any)
	if !ok || len(arr) != 4 {
		return ratelimit.Decision{}, badReply("reply of a decision with a room is %#v, want 4 elements", reply)
	}
	d, err := parseReply(arr[:2:2], r.windows.Len(), r.scores)
	if err != nil {
		return d, err
	}
	w, err := parseReply(arr[2:4:4], 0, nil)
	if err != nil {
		w.By = 1
		return w, err
	}
	if !w.Allowed && (d.Allowed || w.Wait > d.Wait) {
		w.By = 1
		return w, nil
	}
	return d, nil
}

// process sends the groups' commands (only those marked again when retry)
// through to, one directly, several as one pipeline; errors are per
// command.
func (b *batcher) process(ctx context.Context, to sender, groups []group, retry bool) {
	if len(groups) == 1 {
		_ = to.Process(ctx, groups[0].cmd)
		return
	}
	pipe := to.Pipeline()
	for _, g := range groups {
		if !retry || g.again {
			_ = pipe.Process(ctx, g.cmd)
		}
	}
	_, _ = pipe.Exec(ctx)
}

// byMaster reorders batch, stably, so that the calls for one master (one
// breaker) are consecutive, masters in the order they first appear: the
// order of one client's decisions, which share a master, is kept. tmp is
// scratch space, returned for reuse.
func byMaster(batch, tmp []*call) []*call {
	var seen [8]*breaker
	brs := seen[:0]
	for _, c := range batch {
		if !slices.Contains(brs, c.br) {
			brs = append(brs, c.br)
		}
	}
	if len(brs) < 2 {
		return tmp
	}
	tmp = tmp[:0]
	for _, br := range brs {
		for _, c := range batch {
			if c.br == br {
				tmp = append(tmp, c)
			}
		}
	}
	copy(batch, tmp)
	clear(tmp)
	return tmp[:0]
}

// clusterRefusal reads the error of a cluster call (scripts.EWMACluster):
// refused when its master declined the call as a whole before running it
// (a key it does not serve, or a missing key of a slot migrating away; a
// redirect go-redis could not complete; the script not compiled), so that
// nothing was written and its decisions can go again one by one;
// unsupported when the server cannot run the script at all (Redis older
// than 7.0 does not know the shebang).
func clusterRefusal(err error) (refused, unsupported bool) {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return false, false
	}
	msg := re.Error()
	switch {
	case strings.Contains(msg, "Error compiling script"), strings.Contains(msg, "shebang"):
		return true, true
	case strings.Contains(msg, "non local key"), strings.Contains(msg, "do not hash to the same slot"),
		strings.HasPrefix(msg, "MOVED "), strings.HasPrefix(msg, "ASK "),
		strings.HasPrefix(msg, "TRYAGAIN"), strings.HasPrefix(msg, "CROSSSLOT"):
		return true, false
	}
	return false, false
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// directCapLocked is how many round trips may be in flight for a decision
// to go straight out: directFlight while decisions have gone straight out
// without queueing, flight from the first that queued until the last round
// trip in flight finishes with nothing queued. So more than directFlight
// callers deciding at once go in batches, flight at a time, exactly as
// they would with no directFlight at all: ending that on a moment with no
// batch in flight, which high concurrency has often, let decisions go
// alone there, each a call of its own for Redis and fewer for the next
// batch (at 16 goroutines batches of 9.6 instead of 11.7, and 0.1 less of
// redis_rate's rate). b.mu is held.
func (b *batcher) directCapLocked() int {
	if b.busy { // also whenever a batch is in flight: its calls queued
		return b.flight
	}
	return b.directFlight
}
