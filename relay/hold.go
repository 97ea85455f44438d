package relay

import (
	"time"

	"github.com/sluice-relay/sluice/relay/wire"
)

// This file holds shaping: a frame refused with a wait short enough is
// held rather than answered, and decided again, for real, once the wait is
// over; it is forwarded if its budget admits it then, and refused with its
// wait as any frame otherwise. Most clients do not read "retry in Ns": one
// that opens a page with a burst a little over its budget gets its
// subscriptions late instead of closed.
//
// The hold is the client reader's, in both modes (decideHeld wraps decide,
// the one decision of the bridge and the tap): while a frame is held the
// connection's reading stops, as it does while the client is behind on
// its answers, so a connection holds one frame at a time, its frames stay
// in order, and what the client sends meanwhile waits in its own socket.
// A held frame costs its buffer, within a per-gate bound (maxHeldBytes),
// and no goroutine: the reader that read it waits.
//
// What is bounded by policy.Limits.MaxDelay is the delay a client sees,
// not one frame's hold: the frames behind a held one wait in the socket
// too. So a run of held frames (frames refused one after the other, each
// held in turn) counts from the first hold, and a frame is held only when
// the run so far plus its own wait stays within MaxDelay; a frame decided
// with no wait at all ends the run (the client has caught up with its
// budget). Past MaxDelay the connection is over its bound: its frames are
// refused with their waits, as without shaping, until it has gone MaxDelay
// without a refusal. A client over its budget for longer than MaxDelay, a
// flooder, is thus refused as it would be without shaping (and cut for
// knocking alike); one whose burst fits in MaxDelay's worth of its budget
// is refused nothing.

// The decision at release is the real one: a held frame has been charged
// nothing (a refusal writes nothing) and is charged as any frame when it
// is decided again, so shaping never lets a client spend more than its
// budget; it only spares it the refusal.

const (
	// maxHeldFrame is the longest frame the gate holds: a filter, an AUTH
	// or an ordinary event; a larger one is refused with its wait. It
	// keeps what one held frame pins small next to maxHeldBytes.
	maxHeldFrame = 64 << 10
	// maxHeldBytes bounds the buffers of the frames held at once by every
	// connection of one gate, each counted by its buffer's capacity (at
	// least frameBufSize; a reused one up to maxKeptFrameBuf, a grown one
	// up to twice maxHeldFrame): 32 MiB, at least 256 held frames whatever
	// their buffers and 8,192 in new ones. A frame that would pass it is
	// refused with its wait, as it would be without shaping.
	maxHeldBytes = 32 << 20
)

// holdState is a connection's run of held frames and the frame it holds;
// the client reader's only.
type holdState struct {
	since   time.Time // when the run's first frame was held (monotonic); zero: no run
	over    bool      // the run passed MaxDelay: refuse until refused is MaxDelay old
	refused time.Time // the last refusal shape let through, while over
	last    time.Time // when the last decision ended, to see an idle reader
	asked   bool      // shape was asked during the decision under way

	held  time.Time     // when the frame now held was first held; zero: none
	t     wire.Type     // its type, for the observer
	bytes int           // its share of Gate.heldBytes
	wait  time.Duration // set by shape during a decision: hold this long, then decide again
}

// decideHeld is decide with shaping: a frame that decide holds (shape) is
// kept until its wait is over and decided again, as often as shape holds
// it, and the last decision is returned as decide returns it. It reports
// whether the frame was held at all: the caller's read deadline then
// starts again from now, since the hold was not the client's silence.
func (c *conn) decideHeld(buf []byte) (fwd []byte, ok, held bool) {
	h := &c.hold
	if !h.over && !h.since.IsZero() && time.Since(h.last) >= c.g.current().maxDelay {
		// The reader waited for this frame: it did not queue behind the
		// run's.
		h.since = time.Time{}
	}
	h.asked = false
	for {
		c.lockRelay()
		fwd, ok = c.decide(buf)
		c.unlockRelay()
		wait := h.wait
		if wait == 0 || !ok {
			held = !h.held.IsZero()
			if !h.asked && !h.over {
				// Decided with no wait: caught up with its budget.
				h.since = time.Time{}
			}
			c.letGo()
			h.last = time.Now()
			return fwd, ok, held
		}
		// Held: decide forwards nothing (no CLOSE follows a frame that
		// is not refused).
		h.wait = 0
		tm := time.NewTimer(wait)
		select {
		case <-tm.C:
		case <-c.closing:
			tm.Stop()
			c.letGo()
			return nil, false, true
		}
	}
}

// shape is asked by the decision (admit) before it refuses frame, of type
// t, with wait: it reports whether the frame is held instead. It is, when
// shaping is on, the run stays within the policy's MaxDelay with this wait
// (see above), the frame is no longer than maxHeldFrame, and the gate's
// held buffers stay within maxHeldBytes.
func (c *conn) shape(t wire.Type, frame []byte, wait time.Duration) bool {
	h := &c.hold
	h.asked = true
	limit := c.g.current().maxDelay
	if limit <= 0 || wait <= 0 {
		return false
	}
	now := time.Now()
	if h.over {
		if now.Sub(h.refused) < limit {
			h.refused = now
			return false
		}
		h.over, h.since = false, time.Time{}
	}
	if !h.since.IsZero() && now.Sub(h.since)+wait > limit {
		h.over, h.refused = true, now
		return false
	}
	if wait > limit {
		return false
	}
	if h.held.IsZero() {
		if len(frame) > maxHeldFrame {
			return false
		}
		n := max(cap(frame), frameBufSize)
		if c.g.heldBytes.Add(int64(n)) > maxHeldBytes {
			c.g.heldBytes.Add(-int64(n))
			return false
		}
		c.g.heldFrames.Add(1)
		h.held, h.t, h.bytes = now, t, n
	}
	if h.since.IsZero() {
		h.since = now
	}
	h.wait = wait
	return true
}

// shadowShape is asked by the decision of a frame that passes in shadow
// mode, which a window in shadow would have refused with wait: the
// observer hears of the frames that shaping would have held (on their own:
// shadow mode holds nothing, so has no runs).
func (c *conn) shadowShape(t wire.Type, wait time.Duration) {
	if limit := c.g.current().maxDelay; limit > 0 && wait > 0 && wait <= limit {
		if o := c.g.obs; o != nil && o.Held != nil {
			o.Held(t, wait, true)
		}
	}
}

// letGo ends the hold of the frame just decided, if it was held: its
// buffer leaves the gate's count and the observer hears how long it was
// held.
func (c *conn) letGo() {
	h := &c.hold
	if h.held.IsZero() {
		return
	}
	c.g.heldBytes.Add(-int64(h.bytes))
	c.g.heldFrames.Add(-1)
	if o := c.g.obs; o != nil && o.Held != nil {
		o.Held(h.t, time.Since(h.held), false)
	}
	h.held, h.bytes = time.Time{}, 0
}
