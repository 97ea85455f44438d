package redisstore

import (
	"context"
	"errors"
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
// about a third of its CPU per decision, measured in BenchmarkRedis): calls
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
	max    int
	queue  chan *call
	stop   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	// pipelines and calls count what the workers sent, for the benchmarks'
	// mean batch size.
	pipelines, calls atomic.Int64
}

func newBatcher(client redis.UniversalClient, max, workers int) *batcher {
	b := &batcher{
		client: client,
		max:    max,
		queue:  make(chan *call, max*workers),
		stop:   make(chan struct{}),
	}
	b.wg.Add(workers)
	for range workers {
		go b.work()
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

func (b *batcher) work() {
	defer b.wg.Done()
	batch := make([]*call, 0, b.max)
	cmds := make([]*redis.Cmd, 0, b.max)
	for {
		batch = batch[:0]
		select {
		case c := <-b.queue:
			batch = append(batch, c)
		case <-b.stop:
			b.drain()
			return
		}
	fill:
		for len(batch) < b.max {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		// Fail the calls already past their deadline, unsent; the pipeline
		// gets the earliest deadline of the rest.
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
		clear(batch[len(live):])
		batch = live
		if len(batch) == 0 {
			continue
		}
		b.pipelines.Add(1)
		b.calls.Add(int64(len(batch)))
		cmds = b.exec(first, batch, cmds[:0])
		for i, c := range batch {
			c.res <- callResult{cmds[i].Val(), cmds[i].Err()}
			batch[i] = nil
		}
	}
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

// exec runs the batch, bounded by deadline (zero: none), as one pipeline of EVALSHA and, for any that found the
// script missing (a restarted Redis, SCRIPT FLUSH), a second one of EVAL,
// which also reloads it.
func (b *batcher) exec(deadline time.Time, batch []*call, cmds []*redis.Cmd) []*redis.Cmd {
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	pipe := b.client.Pipeline()
	for _, c := range batch {
		cmd := redis.NewCmd(ctx, c.req.args...)
		cmd.SetFirstKeyPos(3) // a cluster pipeline is split by the first key's node
		_ = pipe.Process(ctx, cmd)
		cmds = append(cmds, cmd)
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	var again redis.Pipeliner
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			if again == nil {
				again = b.client.Pipeline()
			}
			cmd := redis.NewCmd(ctx, batch[i].req.eval()...)
			cmd.SetFirstKeyPos(3)
			_ = again.Process(ctx, cmd)
			cmds[i] = cmd
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	return cmds
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
