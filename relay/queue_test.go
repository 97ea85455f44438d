package relay

import (
	"testing"
	"testing/synctest"
)

// TestOutQueueBackpressure: a sender waits while the queue is at its bound
// (no frame is dropped, none is queued past it), is let through by the
// writer's take, and gives up, unqueued, when the connection ends.
func TestOutQueueBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newOutQueue(100)
		done := make(chan struct{})
		if !q.push(outFrame{data: make([]byte, 60)}, done) {
			t.Fatal("first frame refused")
		}
		if !q.push(outFrame{data: make([]byte, 40)}, done) {
			t.Fatal("second frame (at the bound) refused")
		}
		pushed := make(chan bool)
		go func() { pushed <- q.push(outFrame{data: make([]byte, 10)}, done) }()
		waited := make(chan bool)
		go func() { waited <- q.wait(done) }()
		synctest.Wait()
		select {
		case <-pushed:
			t.Fatal("a frame was queued past the bound")
		case <-waited:
			t.Fatal("wait returned with the queue at its bound")
		default:
		}
		if n := q.queued(); n != 100 {
			t.Fatalf("queued %d bytes, want 100", n)
		}
		if got := q.take(nil); len(got) != 2 {
			t.Fatalf("took %d frames, want 2", len(got))
		}
		synctest.Wait()
		if ok := <-pushed; !ok {
			t.Fatal("the waiting frame was dropped after take")
		}
		if ok := <-waited; !ok {
			t.Fatal("wait failed after take")
		}
		if n := q.queued(); n != 10 {
			t.Fatalf("queued %d bytes after take, want the waiting frame's 10", n)
		}
		// A frame larger than the bound fits an empty queue only.
		q.take(nil)
		if !q.push(outFrame{data: make([]byte, 500)}, done) {
			t.Fatal("a large frame refused by an empty queue")
		}
		go func() { pushed <- q.push(outFrame{data: make([]byte, 1)}, done) }()
		synctest.Wait()
		close(done)
		if ok := <-pushed; ok {
			t.Fatal("a frame was queued after the connection ended")
		}
		if q.wait(done) {
			t.Fatal("wait succeeded after the connection ended, with the queue full")
		}
	})
}
