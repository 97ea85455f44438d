package redisstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// slowRedis is a client hook that holds every script call, and every
// pipeline of them, for rtt before it goes out (Redis answering each
// decision's round trip rtt late), or until its context ends. Other
// commands (a new connection's handshake) pass at once.
type slowRedis struct{ rtt time.Duration }

func isScript(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

func (h slowRedis) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slowRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isScript(cmd) {
			return next(ctx, cmd)
		}
		if err := h.wait(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h slowRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, isScript) {
			return next(ctx, cmds)
		}
		if err := h.wait(ctx); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

func (h slowRedis) wait(ctx context.Context) error {
	t := time.NewTimer(h.rtt)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestQueueWaitSpendsNoDeadline: every round trip is answered within the
// Timeout (600 ms of 1 s: Redis slow, not down), and more decisions arrive
// at once than the round trips in flight carry (16 batches of 32, with one
// batch worker), so the rest queue until those come back. None may be
// refused: the time a decision waits in the gate's own queue, or for a
// CPU, says nothing about Redis, which is what the Timeout bounds. (With
// the Timeout counted from Decide, the queued decisions went out 600 ms
// into their second, their round trips were cut at its end, and every one
// was answered "unavailable" while Redis answered every call in time; a
// gate on a starved CPU meets the same, its own wait eating the deadline.)
//
// On a real redis-server (the scripts need its struct library, which
// miniredis lacks, and its TIME, which a synctest bubble's clock is not),
// with the slowness a client hook's: a queued decision is sent when the
// first round trips come back, 600 ms in, and answered 600 ms later,
// 200 ms past the deadline it had from Decide and 400 ms before the one
// it has from its sending, both wide of what a loaded machine adds.
func TestQueueWaitSpendsNoDeadline(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{
		Addr:                  srv.Addr(),
		ContextTimeoutEnabled: true,
		PoolSize:              64, // the pool never makes a round trip wait
	})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, Options{Timeout: time.Second, Batch: 32, batchWorkers: 1})
	t.Cleanup(func() { _ = s.Close() })
	// A decision first, at full speed (a connection made, the store
	// knows the scripts are there), and both scripts loaded: a NOSCRIPT
	// would cost a second round trip.
	limits := storetest.MustWindows(ratelimit.PerPeriod(1000, time.Minute))
	if _, err := s.Decide(context.Background(), "{warm}:message:EVENT", limits, time.Time{}); err != nil {
		t.Fatalf("first decision: %v", err)
	}
	for _, sc := range []*redis.Script{ewma, ewma1} {
		if err := sc.Load(context.Background(), c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c.AddHook(slowRedis{rtt: 600 * time.Millisecond})
	const callers = 2 + 16*32 + 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused := map[string]int{}
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "{client-" + itoa(int64(i)) + "}:message:EVENT"
			d, err := s.Decide(context.Background(), key, limits, time.Time{})
			if err == nil && !d.Allowed {
				err = errors.New("refused by its budget")
			}
			if err != nil {
				mu.Lock()
				refused[err.Error()]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	batched, decided := s.batch.pipelines.Load(), s.batch.calls.Load()
	t.Logf("%d decisions at once: %d batched round trips carried %d, %d went alone", callers, batched, decided, s.batch.direct.Load())
	if len(refused) > 0 {
		t.Errorf("refused while every round trip was answered within the Timeout: %v", refused)
	}
	if batched <= 16 {
		t.Errorf("%d batched round trips, want more than the 16 in flight at once: the test queued no decision behind them", batched)
	}
}
