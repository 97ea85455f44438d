package relay

import (
	"sync"
)

// DefaultQueueBytes bounds what may wait for one client, in bytes: relay
// frames and the gate's own replies. 4 MiB holds the answer to a REQ of a
// thousand 3 KB events with room to spare, so a client that reads is
// never cut for the gate's own slowness (a CPU-starved writer), while a
// client that does not read costs at most this much before it is cut.
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
}

func newOutQueue(max int) *outQueue {
	return &outQueue{max: max, ready: make(chan struct{}, 1)}
}

// push queues f and reports whether it fit. A frame larger than the bound
// fits an empty queue: the relay decides how large its frames are.
func (q *outQueue) push(f outFrame) bool {
	q.mu.Lock()
	if len(q.frames) > 0 && q.bytes+len(f.data) > q.max {
		q.mu.Unlock()
		return false
	}
	q.frames = append(q.frames, f)
	q.bytes += len(f.data)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return true
}

// take returns everything queued, in order, and empties the queue; spare
// is reused for the next batch.
func (q *outQueue) take(spare []outFrame) []outFrame {
	q.mu.Lock()
	out := q.frames
	q.frames, q.bytes = spare[:0], 0
	q.mu.Unlock()
	return out
}

// queued returns the bytes waiting.
func (q *outQueue) queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes
}
