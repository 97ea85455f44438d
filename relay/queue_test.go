package relay

import (
	"testing"
	"testing/synctest"
)

// TestOutQueueBound: a frame that would take the backlog (queued and being
// written) past the bound is refused at once, never waited for; the
// client reader's wait returns only once the backlog is down to
// backlogLow, which the writer's wrote brings about, and gives up when the
// connection ends.
func TestOutQueueBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const max = 4 * backlogLow
		q := newOutQueue(max)
		done := make(chan struct{})
		if !q.push(outFrame{data: make([]byte, 3*backlogLow)}) {
			t.Fatal("first frame refused")
		}
		if !q.push(outFrame{data: make([]byte, backlogLow)}) {
			t.Fatal("second frame (at the bound) refused")
		}
		if q.push(outFrame{data: make([]byte, 1)}) {
			t.Fatal("a frame was queued past the bound")
		}
		waited := make(chan bool)
		go func() { waited <- q.wait(done) }()
		synctest.Wait()
		select {
		case <-waited:
			t.Fatal("wait returned with the client behind")
		default:
		}
		if got := q.take(nil); len(got) != 2 {
			t.Fatalf("took %d frames, want 2", len(got))
		}
		// Taken is not written: still the client's backlog.
		if n := q.queued(); n != max {
			t.Fatalf("backlog %d bytes while the batch is written, want %d", n, max)
		}
		if q.push(outFrame{data: make([]byte, 1)}) {
			t.Fatal("a frame was queued past the bound while the batch is written")
		}
		synctest.Wait()
		select {
		case <-waited:
			t.Fatal("wait returned while the batch is being written")
		default:
		}
		q.wrote()
		if ok := <-waited; !ok {
			t.Fatal("wait failed after the batch was written")
		}
		// A frame larger than the bound fits an empty backlog only.
		if !q.push(outFrame{data: make([]byte, 2*max)}) {
			t.Fatal("a large frame refused by an empty backlog")
		}
		if q.push(outFrame{data: make([]byte, 1)}) {
			t.Fatal("a frame queued behind one larger than the bound")
		}
		go func() { waited <- q.wait(done) }()
		synctest.Wait()
		close(done)
		if ok := <-waited; ok {
			t.Fatal("wait succeeded after the connection ended, with the client behind")
		}
	})
}
