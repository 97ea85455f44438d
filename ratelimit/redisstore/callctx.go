package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// callCtx is the context a round trip runs under: the caller's values and
// the call's own deadline, but not the caller's cancellation. go-redis
// reads only its deadline (for the socket) and its Done channel (waiting
// for a pooled connection, sleeping between retries), so a call whose
// caller gave up still ends by its own deadline, at most the store's
// Timeout later, and its result is dropped. The store judges a caller's
// cancellation on the caller's own context (see Store.direct).
//
// It is context.WithDeadline(context.WithoutCancel(parent), deadline)
// with the timer kept: context.WithDeadline makes a timer per call, and
// this runs for every decision. The timer is pooled (callTimer); the
// context itself is not, so it behaves as an ordinary context for as long
// as anyone holds it — a client hook may keep it past the call: its values
// stay the caller's, and once the call ends it is done (Canceled, or
// DeadlineExceeded if the deadline came first) and stays done.
type callCtx struct {
	parent   context.Context
	deadline time.Time
	start    time.Time
	extra    atomic.Int64 // nanoseconds the deadline was put off by (fire)
	timer    *callTimer   // the pooled timer; nil once the call ended

	mu   sync.Mutex
	done chan struct{} // made by the first Done; closed when err is set
	err  error
}

// callTimer is a pooled timer that ends the call it is lent to (cur) at
// that call's deadline.
type callTimer struct {
	t    *time.Timer
	pool *callPool

	mu  sync.Mutex
	cur *callCtx
}

// callPool keeps a store's idle timers (one pool per Store, not one per
// process: a timer belongs to the goroutines, and in tests to the
// testing/synctest bubble, that made it).
type callPool struct{ p sync.Pool }

// withDeadline returns a context for one round trip bounded by deadline
// (not zero); its release ends the call.
func (cp *callPool) withDeadline(parent context.Context, deadline time.Time) *callCtx {
	t, _ := cp.p.Get().(*callTimer)
	if t == nil {
		t = &callTimer{pool: cp}
		t.t = time.AfterFunc(time.Hour, t.fire)
		t.t.Stop()
	}
	now := time.Now()
	c := &callCtx{parent: parent, deadline: deadline, start: now, timer: t}
	t.mu.Lock()
	t.cur = c
	t.mu.Unlock()
	t.t.Reset(deadline.Sub(now))
	return c
}

// release ends the call: the context is done with Canceled unless its
// deadline came first. Its timer goes back to the pool unless it fired or
// is firing (its function may still be running). Call it once, from the
// goroutine that made the context.
func (c *callCtx) release() {
	t := c.timer
	c.timer = nil
	stopped := t.t.Stop()
	t.mu.Lock()
	t.cur = nil
	t.mu.Unlock()
	c.end(context.Canceled)
	if stopped {
		t.pool.p.Put(t)
	}
}

// fire ends the current call, if any, at its deadline — unless the
// process did not run for part of the call (stalls): then, once, the
// deadline is put off by the time lost, which was the gate's, not Redis's.
func (t *callTimer) fire() {
	t.mu.Lock()
	c := t.cur
	if c != nil && c.extra.Load() == 0 {
		if lost := stalls.since(c.start); lost > 0 {
			c.extra.Store(int64(lost))
			t.t.Reset(time.Until(c.deadline.Add(lost)))
			t.mu.Unlock()
			return
		}
	}
	t.mu.Unlock()
	if c != nil {
		c.end(context.DeadlineExceeded)
	}
}

// end makes the context done with err, unless it is done already.
func (c *callCtx) end(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		if c.done != nil {
			close(c.done)
		}
	}
	c.mu.Unlock()
}

func (c *callCtx) Deadline() (time.Time, bool) {
	return c.deadline.Add(time.Duration(c.extra.Load())), true
}
func (c *callCtx) Value(key any) any { return c.parent.Value(key) }

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
