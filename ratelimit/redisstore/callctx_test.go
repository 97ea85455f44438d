package redisstore

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

type ctxKey struct{}

// A call's context carries the caller's values, ends exactly at its own
// deadline with DeadlineExceeded, is not cut short when the caller
// cancels, and stays readable after the call ended (a client hook may keep
// it).
func TestCallContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		deadline := time.Now().Add(100 * time.Millisecond)
		c, cancel := callContext(parent, deadline)
		if d, ok := c.Deadline(); !ok || !d.Equal(deadline) {
			t.Fatalf("Deadline %v %v", d, ok)
		}
		if c.Value(ctxKey{}) != "v" {
			t.Fatal("parent's value lost")
		}
		cancelParent()
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
		cancel()
		if c.Value(ctxKey{}) != "v" {
			t.Fatal("value lost after the call ended")
		}

		// A second call's context is its own: the first one's end does
		// not end it.
		c2, cancel2 := callContext(parent, time.Now().Add(50*time.Millisecond))
		defer cancel2()
		if isDone(c2) {
			t.Fatal("a new call's context done by an earlier one")
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
