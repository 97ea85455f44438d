// Package hint is the client's side of docs/hints.md: it reads the wait
// a relay's rate-limit refusal asks for ("rate-limited: …; retry in 18s",
// from any OK, CLOSED, NEG-ERR or NOTICE) and waits it out for go-nostr
// programs, so that a publish or a query refused as rate-limited is sent
// again once, when the wait is over, and nothing is sent in between.
//
// It works with any relay: one that refuses as rate-limited without a
// hint is retried after a capped exponential backoff (1 s, 2 s, 4 s, … up
// to a minute). Every other refusal ("blocked:", "invalid:", "error:", a
// limiter that cannot decide) is returned at once: waiting would not make
// it succeed. A context bounds the whole: cancel it to give up.
//
// With a go-nostr SimplePool, take the relay from the pool
// (pool.EnsureRelay(url)) and pass it to Publish or Query.
package hint

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nbd-wtf/go-nostr"
)

// Backoff bounds for a rate-limited refusal without a hint: the first
// retry waits firstBackoff, each next one twice as long, at most
// maxBackoff.
const (
	firstBackoff = time.Second
	maxBackoff   = time.Minute
)

// maxHintSeconds bounds the number Parse reads: a day, past which a hint
// is not one a client would wait for in one go (and no overflow is
// possible).
const maxHintSeconds = 24 * 60 * 60

// Parse reads a refusal's reason (the message of an OK false, a CLOSED or
// a NEG-ERR) or a NOTICE's message. limited reports whether it is a
// rate-limit refusal: it starts with NIP-01's "rate-limited:" prefix
// (after spaces, and after the "msg: " that go-nostr's Relay.Publish puts
// in front of an OK's reason). wait is the last "retry in Ns" in it, N
// whole seconds from 1 to a day; 0 when it has none.
func Parse(msg string) (wait time.Duration, limited bool) {
	msg = strings.TrimSpace(msg)
	msg = strings.TrimPrefix(msg, "msg: ")
	if !strings.HasPrefix(msg, "rate-limited:") {
		return 0, false
	}
	const key = "retry in "
	for end := len(msg); ; {
		i := strings.LastIndex(msg[:end], key)
		if i < 0 {
			return 0, true
		}
		end = i
		rest := msg[i+len(key):]
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 0 || rest[0] == '0' || n >= len(rest) || rest[n] != 's' || (n+1 < len(rest) && isWordByte(rest[n+1])) {
			continue
		}
		secs, err := strconv.Atoi(rest[:n])
		if err != nil || secs > maxHintSeconds {
			continue
		}
		return time.Duration(secs) * time.Second, true
	}
}

// isWordByte reports whether b continues a word ("retry in 5seconds" is
// not a hint).
func isWordByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// Publish is r.Publish(ctx, ev) that waits out rate limits: refused as
// rate-limited, ev is sent again once the hinted wait (or, without a hint,
// the backoff) is over, and so on until the relay answers otherwise or ctx
// ends. It returns nil once the relay accepts ev, the last refusal's error
// for any other refusal, and when ctx ends during a wait the refusal
// joined with ctx's error. Each attempt without a deadline of ctx's own
// waits up to go-nostr's 7 s for its OK.
func Publish(ctx context.Context, r *nostr.Relay, ev nostr.Event) error {
	var w waiter
	for {
		err := r.Publish(ctx, ev)
		if err == nil {
			return nil
		}
		wait, limited := Parse(err.Error())
		if !limited {
			return err
		}
		if err := w.wait(ctx, wait, err); err != nil {
			return err
		}
	}
}

// Query is r.QuerySync(ctx, filter) that waits out rate limits: a
// subscription the relay closes as rate-limited before its EOSE is opened
// again, with the same filter, once the hinted wait (or the backoff) is
// over. It returns the stored events once the relay sends EOSE; an error
// when the relay closes the subscription for another reason, and when ctx
// ends (with the events received so far). Unlike QuerySync it sets no
// timeout of its own: give ctx one.
func Query(ctx context.Context, r *nostr.Relay, filter nostr.Filter) ([]*nostr.Event, error) {
	var w waiter
	for {
		evs, reason, err := queryOnce(ctx, r, filter)
		if err != nil || reason == "" {
			return evs, err
		}
		refusal := fmt.Errorf("hint: subscription closed by %s: %s", r.URL, reason)
		wait, limited := Parse(reason)
		if !limited {
			return evs, refusal
		}
		if err := w.wait(ctx, wait, refusal); err != nil {
			return nil, err
		}
	}
}

// queryOnce opens one subscription for filter and reads it to its EOSE
// (reason "") or to the relay's CLOSED (its reason), closing it either way.
func queryOnce(ctx context.Context, r *nostr.Relay, filter nostr.Filter) (evs []*nostr.Event, reason string, err error) {
	sub, err := r.Subscribe(ctx, nostr.Filters{filter})
	if err != nil {
		return nil, "", err
	}
	defer sub.Unsub()
	for {
		select {
		case ev, ok := <-sub.Events:
			if !ok {
				// Closed: by a CLOSED (its reason was sent first), by ctx,
				// or by the connection.
				select {
				case reason := <-sub.ClosedReason:
					return evs, reason, nil
				default:
				}
				if ctx.Err() != nil {
					return evs, "", ctx.Err()
				}
				return evs, "", fmt.Errorf("hint: subscription to %s ended before its EOSE: %w", r.URL, context.Cause(sub.Context))
			}
			evs = append(evs, ev)
		case <-sub.EndOfStoredEvents:
			return evs, "", nil
		case reason := <-sub.ClosedReason:
			return evs, reason, nil
		case <-ctx.Done():
			return evs, "", ctx.Err()
		}
	}
}

// waiter is the wait before one call's next attempt.
type waiter struct {
	backoff time.Duration // the last backoff waited; 0 before any
}

// wait waits out a rate-limited refusal, err: wait when the relay gave a
// hint, else the next backoff. It returns err joined with ctx's error when
// ctx ends first.
func (w *waiter) wait(ctx context.Context, wait time.Duration, err error) error {
	if wait <= 0 {
		w.backoff = nextBackoff(w.backoff)
		wait = w.backoff
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w (gave up waiting %v: %w)", err, wait, ctx.Err())
	}
}

// nextBackoff returns the backoff after last (0: none yet).
func nextBackoff(last time.Duration) time.Duration {
	if last <= 0 {
		return firstBackoff
	}
	return min(2*last, maxBackoff)
}
