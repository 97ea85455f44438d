package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// connResult is what one connection measured.
type connResult struct {
	sent, replies, okTrue, events int
	lat                           []time.Duration
	prefixes                      map[string]int
	errors                        map[string]int
}

func newConnResult() *connResult {
	return &connResult{prefixes: map[string]int{}, errors: map[string]int{}}
}

func (r *connResult) into(rep *report) {
	rep.Sent += r.sent
	rep.Replies += r.replies
	rep.OKTrue += r.okTrue
	rep.Events += r.events
	for k, v := range r.prefixes {
		rep.Prefixes[k] += v
	}
	for k, v := range r.errors {
		rep.Errors[k] += v
	}
}

// readErr records err, the end of a connection with pending requests
// unanswered.
func (r *connResult) readErr(ctx context.Context, err error, pending int, what string) {
	k := errKey(err)
	if ctx.Err() != nil {
		k = "interrupted"
	}
	r.errors[what+": "+k]++
	if pending > 0 {
		r.errors["unanswered"] += pending
	}
}

// exchange is what a mode sends on a connection and how it reads the
// answers; pipeline does the rest.
type exchange struct {
	n           int           // requests to send
	inflight    int           // unanswered requests at most
	timeout     time.Duration // the longest wait for a reply
	stop        *atomic.Bool  // once set, no more requests are sent
	countEvents bool          // count EVENT messages in connResult.events

	// request returns request i: the id its answer names first, and the
	// frame to write.
	request func(i int) (id string, frame []byte)
	// answers reports whether a message labelled label answers a request.
	answers func(label string) bool
	// stray records an answer m that names no request in flight.
	stray func(r *connResult, m message)
	// answered records m, the answer to a request written lat before it
	// was read (already counted in r.replies); an error, from a write,
	// ends the connection.
	answered func(r *connResult, m message, lat time.Duration) error
}

// pipeline sends x's requests on c, keeping up to x.inflight unanswered
// and the next one written as soon as an answer frees a slot, and reads
// until every request written is answered (or c fails, or a reply takes
// longer than x.timeout).
func pipeline(ctx context.Context, c *websocket.Conn, x exchange) *connResult {
	r := newConnResult()
	r.lat = make([]time.Duration, 0, x.n)
	pending := make(map[string]time.Time, x.inflight)
	next := 0
	fill := func() error {
		for next < x.n && len(pending) < x.inflight && !x.stop.Load() {
			id, frame := x.request(next)
			next++
			pending[id] = time.Now()
			if err := c.WriteMessage(websocket.TextMessage, frame); err != nil {
				return err
			}
			r.sent++
		}
		return nil
	}
	if err := fill(); err != nil {
		r.readErr(ctx, err, len(pending), "write")
		return r
	}
	for len(pending) > 0 {
		_ = c.SetReadDeadline(time.Now().Add(x.timeout))
		_, b, err := c.ReadMessage()
		if err != nil {
			r.readErr(ctx, err, len(pending), "read")
			return r
		}
		now := time.Now()
		if isEvent(b) {
			if x.countEvents {
				r.events++
			}
			continue
		}
		m, err := parseMessage(b)
		if err != nil {
			r.errors["unparsable reply"]++
			continue
		}
		switch {
		case x.answers(m.label):
			id := m.str(0)
			t, ok := pending[id]
			if !ok {
				x.stray(r, m)
				continue
			}
			delete(pending, id)
			r.replies++
			err := x.answered(r, m, now.Sub(t))
			if err == nil {
				err = fill()
			}
			if err != nil {
				r.readErr(ctx, err, len(pending), "write")
				return r
			}
		case m.label == "NOTICE":
			// A NOTICE in answer to a request leaves it without an
			// answer: it ends up "unanswered" after -timeout.
			r.prefixes["NOTICE "+reasonPrefix(m.str(0))]++
		case m.label == "AUTH":
			// The relay's NIP-42 challenge: not answered.
		default:
			r.errors["unexpected "+m.label]++
		}
	}
	return r
}
