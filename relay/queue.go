package relay

import (
	"sync"
	"time"
)

// defaultQueueBytes bounds what may wait for one client, in bytes: relay
// frames and the gate's own replies that its socket has not taken. A
// client whose backlog would pass it is cut (1008): the relay's writer
// never waits for one client, so one slow reader cannot hold up the relay
// or anyone else. 4 MiB is four 1,000-event REQ results of 1 KiB events
// waiting at once; a client that reads, however slowly, while its backlog
// stays under it is never cut (the gate stops reading its requests while
// it is behind, so its backlog grows only by what it asked for before and
// by live events). strfry cuts at 32 MiB pending; 4 MiB keeps what one
// address can make the gate hold (connections × this) in hundreds of MB.
const defaultQueueBytes = 4 << 20

// backlogLow is the backlog below which a client's next request is read:
// above it the client is behind, and its requests wait in its own socket
// (outQueue.wait, tapConn.waitBacklog).
const backlogLow = maxCoalesce

// outQueue is the queue of frames towards one client behind Proxy, bounded
// in bytes and drained whole by the client's writer, which writes
// everything queued in one go and flushes once. Safe for concurrent use.
type outQueue struct {
	mu     sync.Mutex
	frames []outFrame
	bytes  int // queued
	flying int // taken by the writer, not yet written
	max    int
	ready  chan struct{} // holds a token while frames are queued
	room   chan struct{} // made while the client reader waits; closed by wrote
}

func newOutQueue(max int) *outQueue {
	return &outQueue{max: max, ready: make(chan struct{}, 1)}
}

// push queues f without waiting and reports whether it did: false when
// the client's backlog (queued and being written) would pass the bound,
// and the caller cuts the client. A frame larger than the bound fits an
// empty backlog: the relay decides how large its frames are.
func (q *outQueue) push(f outFrame) bool {
	q.mu.Lock()
	if q.bytes+q.flying > 0 && q.bytes+q.flying+len(f.data) > q.max {
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

// wait returns once the backlog is at most backlogLow, true, or once done
// is closed, false. The client reader waits so before it forwards a frame:
// while the client is behind on the answers, its requests wait in its own
// socket, and the relay, whose answers would only add to the backlog, is
// not handed more work.
func (q *outQueue) wait(done <-chan struct{}) bool {
	for {
		q.mu.Lock()
		if q.bytes+q.flying <= backlogLow {
			q.mu.Unlock()
			return true
		}
		if q.room == nil {
			q.room = make(chan struct{})
		}
		room := q.room
		q.mu.Unlock()
		select {
		case <-room:
		case <-done:
			return false
		}
	}
}

// take returns everything queued, in order, as the writer's batch (flying
// until wrote); spare is reused for the next batch.
func (q *outQueue) take(spare []outFrame) []outFrame {
	q.mu.Lock()
	out := q.frames
	q.frames = spare[:0]
	q.flying, q.bytes = q.bytes, 0
	q.mu.Unlock()
	return out
}

// wrote records the writer's batch written, waking the client reader if
// it waits.
func (q *outQueue) wrote() {
	q.mu.Lock()
	q.flying = 0
	if q.room != nil {
		close(q.room)
		q.room = nil
	}
	q.mu.Unlock()
}

// queued returns the bytes waiting, queued or being written.
func (q *outQueue) queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes + q.flying
}

// maxOwed is how many of a client's requests (EVENT, REQ, COUNT, AUTH,
// NEG-OPEN, NEG-MSG) may be with the relay unanswered before the gate
// stops reading the client: while the relay is still handling them, its
// next requests wait in its own socket. It bounds what the relay works on
// for one connection at once, and what it may still owe the client when
// the gate sees it fall behind: a client that pipelines a thousand REQs
// has eight answered at a time instead of a thousand at once.
const maxOwed = 8

// owedWait is the longest the gate stops reading a client for answers the
// relay owes it: a relay that answers some requests with silence costs
// its client this much per maxOwed of them, and no more.
const owedWait = 2 * time.Second

// owed counts a connection's requests forwarded and not yet answered by
// the relay (OK, EOSE, CLOSED, COUNT, NEG-MSG, NEG-ERR). Relays do not
// answer everything (a NOTICE, or silence), so a reader that waits for
// answers waits owedWait at most, and then forgets the count. Safe
// for concurrent use (the client reader adds and waits, the relay reader
// answers).
type owed struct {
	mu   sync.Mutex
	n    int
	wake chan struct{} // made while the client reader waits; closed by answered
}

// add counts one request forwarded.
func (o *owed) add() {
	o.mu.Lock()
	o.n++
	o.mu.Unlock()
}

// answered counts one answer from the relay.
func (o *owed) answered() {
	o.mu.Lock()
	if o.n > 0 {
		o.n--
	}
	if o.wake != nil && o.n < maxOwed {
		close(o.wake)
		o.wake = nil
	}
	o.mu.Unlock()
}

// poke wakes a wait under way, for it to look at its stop again.
func (o *owed) poke() {
	o.mu.Lock()
	if o.wake != nil {
		close(o.wake)
		o.wake = nil
	}
	o.mu.Unlock()
}

// wait returns once fewer than maxOwed requests are unanswered, or stop
// (nil: never) reports true when it starts or after a poke, or timeout
// after it started waiting (the count is then forgotten), with ok true;
// or once done is closed, ok false. waited says whether it waited.
func (o *owed) wait(done <-chan struct{}, timeout time.Duration, stop func() bool) (waited, ok bool) {
	var tm *time.Timer
	defer func() {
		if tm != nil {
			tm.Stop()
		}
	}()
	for {
		o.mu.Lock()
		if o.n < maxOwed || (stop != nil && stop()) {
			o.mu.Unlock()
			return waited, true
		}
		if o.wake == nil {
			o.wake = make(chan struct{})
		}
		wake := o.wake
		o.mu.Unlock()
		if tm == nil {
			tm = time.NewTimer(timeout)
		}
		waited = true
		select {
		case <-wake:
		case <-tm.C:
			o.mu.Lock()
			o.n = 0
			o.mu.Unlock()
			return true, true
		case <-done:
			return true, false
		}
	}
}
