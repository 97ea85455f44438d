package ratelimit

import (
	"context"
	"time"
)

// Decision is the outcome of one message against all windows of its key.
// A refusal is a Decision, not an error.
type Decision struct {
	// Allowed reports whether every window admitted the message.
	Allowed bool
	// Wait is the exact time until the same message would be admitted: the
	// largest wait among the refusing windows, a whole number of
	// milliseconds (the resolution of decisions; see the package doc), at
	// least 1 ms. Zero when Allowed. A Limiter's local refusal reports the
	// part of the store's wait that remains.
	Wait time.Duration
	// Local reports a refusal a Limiter answered from its refused-until
	// table, without asking the store: the key was refused before, and
	// Wait is what is left of that wait. A caller that logs refusals logs
	// the ones that are not Local, one per key and wait, however often a
	// refused client knocks.
	Local bool
}

// Store decides all windows of one key in one atomic step. Key names the
// client and the kind of decision, such as "{203.0.113.7}:message:EVENT"
// (the client in braces, so that a store which shards by key can keep
// everything of one client together, as a Redis Cluster hash tag); a store tells the windows of one key apart by their
// periods however it keeps them. The windows were validated when they were
// prepared (NewWindows), so a store does not check them again; no windows
// admits without a call.
//
// now is the instant of the decision; the zero time means the store's own
// clock (Redis TIME for the Redis store). An error means the store could not
// decide and wraps ErrUnavailable.
type Store interface {
	Decide(ctx context.Context, key string, windows *Windows, now time.Time) (Decision, error)
}
