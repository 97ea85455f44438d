package relay

import (
	"sync"
)

// DefaultQueueBytes bounds what may wait for one client, in bytes: relay
// frames and the gate's own replies. Past it, whoever queues waits for the
// client's writer to drain (see outQueue.push): the queue never holds more,
// and a client that reads, however slowly, is never cut for it.
const DefaultQueueBytes = 4 << 20

// outQueue is the queue of frames towards one client, bounded in bytes and
// drained whole by the client's writer, which writes everything queued in
// one go and flushes once. Safe for concurrent use.
type outQueue struct {
	mu     sync.Mutex
	frames []outFrame
	bytes  int
	max    int
	ready  chan struct{} // holds a token while frames are queued
	room   chan struct{} // made while a sender waits for room; closed by take
}

func newOutQueue(max int) *outQueue {
	return &outQueue{max: max, ready: make(chan struct{}, 1)}
}

// push queues f, waiting while the queue is at its bound, and reports
// whether it did: false, f unqueued, once done is closed. A frame larger
// than the bound fits an empty queue: the relay decides how large its
// frames are.
//
// The wait is the gate's backpressure. A client that reads more slowly
// than its relay answers holds up its own connection's sender — the relay
// reader, so that the relay's socket towards the gate fills and the relay
// slows down for this connection only, or the client reader, so that the
// client's own requests wait — instead of being cut while it still reads:
// a client pipelining requests whose answers pass the bound before it
// starts reading is answered in full. A client that stops reading is cut
// by the writer, when a write stays blocked past the write timeout.
func (q *outQueue) push(f outFrame, done <-chan struct{}) bool {
	for {
		q.mu.Lock()
		if len(q.frames) == 0 || q.bytes+len(f.data) <= q.max {
			q.frames = append(q.frames, f)
			q.bytes += len(f.data)
			q.mu.Unlock()
			select {
			case q.ready <- struct{}{}:
			default:
			}
			return true
		}
		if !q.awaitLocked(done) {
			return false
		}
	}
}

// wait returns once the queue is below its bound, true, or once done is
// closed, false. The client reader waits so before it forwards a frame:
// while the client is behind on the answers, its requests wait in its own
// socket, and the relay, whose answers would only add to the queue, is not
// handed more work.
func (q *outQueue) wait(done <-chan struct{}) bool {
	for {
		q.mu.Lock()
		if q.bytes < q.max {
			q.mu.Unlock()
			return true
		}
		if !q.awaitLocked(done) {
			return false
		}
	}
}

// awaitLocked waits, with q.mu held on entry and released, for the next
// take (true) or for done (false). The room channel is made under the lock
// that saw the queue full, so a take in between cannot be missed.
func (q *outQueue) awaitLocked(done <-chan struct{}) bool {
	if q.room == nil {
		q.room = make(chan struct{})
	}
	room := q.room
	q.mu.Unlock()
	select {
	case <-room:
		return true
	case <-done:
		return false
	}
}

// take returns everything queued, in order, and empties the queue, waking
// the senders waiting for room; spare is reused for the next batch.
func (q *outQueue) take(spare []outFrame) []outFrame {
	q.mu.Lock()
	out := q.frames
	q.frames, q.bytes = spare[:0], 0
	if q.room != nil {
		close(q.room)
		q.room = nil
	}
	q.mu.Unlock()
	return out
}

// queued returns the bytes waiting.
func (q *outQueue) queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes
}
