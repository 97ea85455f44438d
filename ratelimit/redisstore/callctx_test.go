package redisstore

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

type ctxKey struct{}

// A call's context carries the caller's values, is not cut short when the
// caller cancels, and ends exactly at its own deadline with
// DeadlineExceeded.
func TestCallCtxDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		var pool callPool
		deadline := time.Now().Add(100 * time.Millisecond)
		c := pool.withDeadline(parent, deadline)
		if d, ok := c.Deadline(); !ok || !d.Equal(deadline) {
			t.Fatalf("Deadline %v %v", d, ok)
		}
		if c.Value(ctxKey{}) != "v" {
			t.Fatal("parent's value lost")
		}
		cancel()
		time.Sleep(99 * time.Millisecond)
		synctest.Wait()
		if isDone(c) || c.Err() != nil {
			t.Fatalf("done before its deadline: %v", c.Err())
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if !isDone(c) || !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("not done at its deadline: %v", c.Err())
		}
		c.release()
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("release changed a fired context's error to %v", c.Err())
		}
	})
}

// A context kept past its call (a client hook's) stays an ordinary
// context: its values are the caller's, it is done with Canceled and stays
// so, and a Done channel taken before the end is closed by it. The pooled
// timer serves the next call without touching the kept context.
func TestCallCtxKeptPastTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent := context.WithValue(context.Background(), ctxKey{}, "v")
		var pool callPool
		kept := pool.withDeadline(parent, time.Now().Add(time.Second))
		done := kept.Done()
		ended := make(chan struct{})
		stop := context.AfterFunc(kept, func() { close(ended) })
		defer stop()
		kept.release()
		select {
		case <-done:
		default:
			t.Fatal("a Done channel taken during the call is not closed at its end")
		}
		synctest.Wait()
		select {
		case <-ended:
		default:
			t.Fatal("context.AfterFunc on the call's context never ran")
		}
		if !errors.Is(kept.Err(), context.Canceled) || kept.Value(ctxKey{}) != "v" {
			t.Fatalf("after the call: Err %v, Value %v", kept.Err(), kept.Value(ctxKey{}))
		}

		// The next call (on the same timer, if the pool kept it) ends at
		// its own deadline; the kept context is unchanged.
		next := pool.withDeadline(context.Background(), time.Now().Add(50*time.Millisecond))
		if isDone(next) {
			t.Fatal("a new call's context done at its start")
		}
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if !errors.Is(next.Err(), context.DeadlineExceeded) {
			t.Fatalf("next call: Err %v at its deadline", next.Err())
		}
		next.release()
		if !errors.Is(kept.Err(), context.Canceled) || kept.Value(ctxKey{}) != "v" {
			t.Fatalf("kept context changed by the next call: Err %v, Value %v", kept.Err(), kept.Value(ctxKey{}))
		}
	})
}

func isDone(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	default:
		return false
	}
}
