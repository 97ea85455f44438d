package redisstore

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

type ctxKey struct{}

// A callCtx is done exactly at its deadline, with DeadlineExceeded, and
// carries its parent's values; released before its deadline it is not
// done and may be used again, with a new deadline; once fired it is
// never reused (its channel stays closed).
func TestCallCtxDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent := context.WithValue(context.Background(), ctxKey{}, "v")
		var pool callPool
		deadline := time.Now().Add(100 * time.Millisecond)
		c := pool.withDeadline(parent, deadline)
		if d, ok := c.Deadline(); !ok || !d.Equal(deadline) {
			t.Fatalf("Deadline %v %v", d, ok)
		}
		if c.Value(ctxKey{}) != "v" {
			t.Fatal("parent's value lost")
		}
		time.Sleep(99 * time.Millisecond)
		synctest.Wait()
		if isDone(c) || c.Err() != nil {
			t.Fatal("done before its deadline")
		}
		if !c.release() {
			t.Fatal("released before its deadline, not kept")
		}

		// Used again (the pool hands back the same one, unless it dropped
		// it): the old deadline is gone, the new one holds.
		c = pool.withDeadline(parent, time.Now().Add(50*time.Millisecond))
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if isDone(c) {
			t.Fatal("a reused context done by its earlier deadline")
		}
		time.Sleep(40 * time.Millisecond)
		synctest.Wait()
		if !isDone(c) || !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("not done at its deadline: %v", c.Err())
		}
		if c.release() {
			t.Fatal("a fired context went back to the pool")
		}
	})
}

// Its Done channel closes at the deadline itself, for whoever waits on it
// (go-redis waiting for a pooled connection, or between retries).
func TestCallCtxDoneAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var pool callPool
		c := pool.withDeadline(context.Background(), time.Now().Add(20*time.Millisecond))
		select {
		case <-c.Done():
		case <-time.After(time.Second):
			t.Fatal("Done not closed by the deadline")
		}
		if d, _ := c.Deadline(); time.Since(d) != 0 {
			got := time.Since(d)
			t.Fatalf("closed %v after the deadline", got)
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
