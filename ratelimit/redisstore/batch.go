package redisstore

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrClosed is wrapped (with ratelimit.ErrUnavailable) by Decide after Close.
var ErrClosed = errors.New("redisstore: store closed")

// call is one decision waiting for a batch.
type call struct {
	req      *request
	deadline time.Time       // the store's Timeout from the call's start; zero: none
	res      chan callResult // capacity 1: a worker never blocks on a caller who left
}

type callResult struct {
	reply any
	err   error
}

// batcher sends the decisions of concurrent callers to Redis together, as
// one pipeline of EVALSHAs, so that a busy gate pays one write and one read
// system call per batch instead of per decision, on both sides.
//
// go-redis has an auto-pipeliner that does the same, but in v9.23 it does not
// bound a call by its context: against a hung Redis a decision waited for
// 35 s with a 100 ms deadline. Here every call is bounded by its own
// deadline without a timer of its own (a timer per call cost the client
// up to a quarter of its CPU per decision in BenchmarkRedis, noisily): calls
// are taken from the queue in order; one found past its deadline when taken
// is failed unsent; a pipeline carries the earliest deadline of its batch,
// so it never outlives a call in it; and since every call gets the same
// Timeout from its start, the calls queued ahead of a call (even while it
// waits for room in a full queue) have deadlines no later than its own, so
// no pipeline a worker is busy with outlives it either. A call is therefore
// answered by its deadline, up to scheduling delays. The caller's own ctx
// (a shorter deadline, a cancellation) is waited on as well.
type batcher struct {
	client redis.UniversalClient
	shared bool // decisions of any keys may share a script call (see exec)
	max    int
	queue  chan *call
	stop   chan struct{}
	spill  chan struct{} // a full batch is queued (capacity 1)
	once   sync.Once
	wg     sync.WaitGroup

	// pipelines and calls count what the workers sent, for the benchmarks'
	// mean batch size.
	pipelines, calls atomic.Int64
}

// newBatcher starts workers sending up to max decisions per round trip to
// client; shared says whether decisions of different clients may go in one
// script call (not on a cluster, where their keys are in different slots).
func newBatcher(client redis.UniversalClient, shared bool, max, workers int) *batcher {
	b := &batcher{
		client: client,
		shared: shared,
		max:    max,
		queue:  make(chan *call, max*workers),
		stop:   make(chan struct{}),
		spill:  make(chan struct{}, 1),
	}
	b.wg.Add(workers)
	for i := range workers {
		go b.work(i == 0)
	}
	return b
}

// do queues one script call and waits for its reply, for ctx, or (through
// the workers) for deadline; a zero deadline means none of the store's own.
func (b *batcher) do(ctx context.Context, deadline time.Time, req *request) (any, error) {
	c := &call{req: req, deadline: deadline, res: make(chan callResult, 1)}
	select {
	case b.queue <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.stop:
		return nil, ErrClosed
	}
	if len(b.queue) >= b.max {
		select {
		case b.spill <- struct{}{}:
		default:
		}
	}
	select {
	case r := <-c.res:
		return r.reply, r.err
	case <-ctx.Done():
		// The worker still delivers into the buffered channel; nobody reads
		// it, and it is garbage once the batch is done.
		return nil, ctx.Err()
	case <-b.stop:
		// The send above may have won its race with Close after the
		// workers had drained the queue and gone: nobody would answer.
		// (A call a worker is running is answered ErrClosed too; the
		// store is shutting down.)
		return nil, ErrClosed
	}
}

func (b *batcher) close() {
	b.once.Do(func() { close(b.stop) })
	b.wg.Wait()
}

// work is a worker's loop. The first worker sends whatever is queued as
// soon as its previous pipeline returns: while one pipeline is in flight
// the next batch gathers, so a moderate load goes in few, full script calls
// (Redis's thread pays per call and per read; a second pipeline of half a
// batch at 16 callers cost more than it overlapped, measured in
// BenchmarkRedisConcurrency). The others send only when a full batch is
// waiting (do signals spill), adding pipelines in flight under a load the
// first cannot keep up with.
func (b *batcher) work(first bool) {
	defer b.wg.Done()
	batch := make([]*call, 0, b.max)
	var sc scratch
	for {
		batch = batch[:0]
		if first {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			case <-b.stop:
				b.drain()
				return
			}
			if len(b.queue) < b.max/2 {
				runtime.Gosched() // let the callers about to queue join
			}
		} else {
			select {
			case <-b.spill:
			case <-b.stop:
				b.drain()
				return
			}
			if len(b.queue) < b.max {
				continue
			}
		}
		for len(batch) < b.max {
			c, ok := b.poll()
			if !ok {
				break
			}
			batch = append(batch, c)
		}
		if len(batch) > 0 {
			b.send(batch, &sc)
		}
		clear(batch)
	}
}

// poll takes a queued call, if there is one.
func (b *batcher) poll() (*call, bool) {
	select {
	case c := <-b.queue:
		return c, true
	default:
		return nil, false
	}
}

// send fails the calls already past their deadline, unsent, and executes
// the rest with the earliest of their deadlines.
func (b *batcher) send(batch []*call, sc *scratch) {
	var first time.Time
	now := time.Now()
	live := batch[:0]
	for _, c := range batch {
		if !c.deadline.IsZero() {
			if !now.Before(c.deadline) {
				c.res <- callResult{nil, context.DeadlineExceeded}
				continue
			}
			if first.IsZero() || c.deadline.Before(first) {
				first = c.deadline
			}
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	b.pipelines.Add(1)
	b.calls.Add(int64(len(live)))
	b.exec(first, live, sc)
}

// drain fails the calls still queued when the store closes.
func (b *batcher) drain() {
	for {
		select {
		case c := <-b.queue:
			c.res <- callResult{nil, ErrClosed}
		default:
			return
		}
	}
}

// maxCallKeys bounds the keys of one script call: the script unpacks them
// onto Lua's C stack for one MGET.
const maxCallKeys = 1024

// group is one script call of a batch: the calls batch[start:end].
type group struct {
	start, end int
	args       []any
	cmd        *redis.Cmd
	again      bool // sent again as EVAL
}

// scratch is a worker's reusable slices.
type scratch struct {
	reqs   []*request
	groups []group
}

// exec decides the batch, bounded by deadline (zero: none), and answers
// every call. On a client where any keys may share a script call (one
// Redis, or a sentinel's master), consecutive calls at one instant go in
// one EVALSHA: Redis parses, dispatches and reads the time once for all of
// them, and reads every window with one MGET. On a cluster, a call's keys
// must share a slot, so each decision is its own EVALSHA; either way the
// EVALSHAs go in one pipeline, and those that find the script missing (a
// restarted Redis, SCRIPT FLUSH) go again as EVAL, which also reloads it.
func (b *batcher) exec(deadline time.Time, batch []*call, sc *scratch) {
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	reqs := sc.reqs[:0]
	for _, c := range batch {
		reqs = append(reqs, c.req)
	}
	groups := sc.groups[:0]
	for start, keys, i := 0, 0, 0; i < len(reqs); i++ {
		keys += len(reqs[i].keys)
		if next := i + 1; next == len(reqs) || !b.shared || reqs[next].now != reqs[start].now || keys+len(reqs[next].keys) > maxCallKeys {
			args := command(reqs[start:next])
			groups = append(groups, group{start: start, end: next, args: args, cmd: newCmd(ctx, args)})
			start, keys = next, 0
		}
	}
	b.process(ctx, groups, false)
	retry := false
	for i := range groups {
		if isNoScript(groups[i].cmd.Err()) {
			groups[i].cmd = newCmd(ctx, evalArgs(groups[i].args))
			groups[i].again, retry = true, true
		}
	}
	if retry {
		b.process(ctx, groups, true)
	}
	for _, g := range groups {
		split(g.cmd, reqs[g.start:g.end], func(i int, reply any, err error) {
			batch[g.start+i].res <- callResult{reply, err}
		})
	}
	clear(reqs)
	clear(groups)
	sc.reqs, sc.groups = reqs[:0], groups[:0]
}

// process sends the groups' commands (only the EVAL retries when retry),
// one directly, several as one pipeline; errors are per command.
func (b *batcher) process(ctx context.Context, groups []group, retry bool) {
	if len(groups) == 1 {
		_ = b.client.Process(ctx, groups[0].cmd)
		return
	}
	pipe := b.client.Pipeline()
	for _, g := range groups {
		if !retry || g.again {
			_ = pipe.Process(ctx, g.cmd)
		}
	}
	_, _ = pipe.Exec(ctx)
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
