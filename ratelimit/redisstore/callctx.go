package redisstore

import (
	"context"
	"sync"
	"time"
)

// callCtx is the context a decision's round trip runs under: the caller's
// values, the call's own deadline, and a Done channel closed when that
// deadline passes. context.WithDeadline costs a decision alone five
// allocations and a new timer (a third of the store's allocations per
// decision, about 1.7 µs of its CPU at 4 callers: BenchmarkRedisConcurrency
// with -cpuprofile and -memprofile); a callCtx is pooled with its timer and
// its channel, and costs a Reset and a Stop.
//
// It is not cancelled with the caller's context: go-redis reads only its
// deadline (for the socket) and its Done channel (waiting for a pooled
// connection, sleeping between retries), so a call whose caller gave up
// still ends by its own deadline, at most the store's Timeout later, and
// its result is dropped as before. The store judges a caller's
// cancellation on the caller's own context (see Store.direct).
//
// One call at a time: a callPool hands it out, release takes it back.
// One whose timer fired (or is firing) is never reused: its channel is
// closed for good, and its timer's function may still be running.
type callCtx struct {
	parent   context.Context
	deadline time.Time
	timer    *time.Timer
	done     chan struct{}
	pool     *callPool

	mu  sync.Mutex
	err error
}

// callPool keeps a store's idle callCtxs (one pool per Store, not one per
// process: a timer belongs to the goroutines, and in tests to the
// testing/synctest bubble, that made it).
type callPool struct{ p sync.Pool }

// withDeadline returns a context for one round trip bounded by deadline
// (not zero); its release ends that use.
func (cp *callPool) withDeadline(parent context.Context, deadline time.Time) *callCtx {
	c, _ := cp.p.Get().(*callCtx)
	if c == nil {
		c = &callCtx{done: make(chan struct{}), pool: cp}
		c.timer = time.AfterFunc(time.Hour, c.fire)
		c.timer.Stop()
	}
	c.parent, c.deadline = parent, deadline
	c.timer.Reset(time.Until(deadline))
	return c
}

// release ends the context's use, and reports whether it went back to the
// pool: not when its deadline fired.
func (c *callCtx) release() bool {
	if !c.timer.Stop() {
		return false
	}
	c.parent = nil
	c.pool.p.Put(c)
	return true
}

func (c *callCtx) fire() {
	c.mu.Lock()
	c.err = context.DeadlineExceeded
	c.mu.Unlock()
	close(c.done)
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *callCtx) Done() <-chan struct{}       { return c.done }
func (c *callCtx) Value(key any) any           { return c.parent.Value(key) }

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
