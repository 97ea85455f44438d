package ratelimit

import (
	"context"
	"fmt"
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
	// By is the index, among the budgets decided together (DecideAll,
	// Limiter.AllowAll), of the one whose wait Wait is; 0 for one key and
	// for an admission.
	By int
}

// Budget is one of the budgets a message pays: a key (as for Decide) and
// the windows it is decided against. A message that pays several budgets
// (its type's windows, a class's, an aggregate's) is decided on all of them
// at once (Limiter.AllowAll): admitted only if every one admits, written
// only then. A caller that prices one message above another (a read that
// asks more) passes windows prepared with that cost (Limit.Cost).
type Budget struct {
	Key     string
	Windows *Windows
	// Room, when not nil, makes this budget a room check instead of
	// windows (Windows is then ignored): see Room.
	Room *Room
}

// Room is a budget that is checked and never charged: an actor quota's
// room, decided with the message's other budgets. Its budget's Key holds
// the quota's count of the current window (at most Events in each fixed
// window of Window, aligned on the unix epoch), kept by the quota that
// made the budget; the message is refused while that count is Events or
// more, with the wait until the window ends, and admitted otherwise, with
// nothing written at Key: the quota counts what it is told afterwards.
// Only the store that keeps the counts decides a Room
// (redisstore.Quota.Room makes one for its own Store); any other store
// answers a Room as unavailable.
type Room struct {
	Events int
	Window time.Duration
}

// errNoRoom is a store's answer to a Room it does not keep the counts of.
var errNoRoom = fmt.Errorf("%w: this store keeps no quota counts to check a room against", ErrUnavailable)

// multiStore is a Store that decides several budgets in one atomic step:
// both of sluice's stores. The Limiter asks one that is not, budget by
// budget, in order, stopping at the first refusal (a budget refused late
// has then been charged to the earlier ones).
type multiStore interface {
	// DecideAll decides budgets as one message: admitted only if every
	// budget's windows admit, each budget written only then; refused, it
	// writes nothing, and Wait is the largest of the refusing budgets'
	// waits (By names that budget). Budgets with no windows are skipped.
	DecideAll(ctx context.Context, budgets []Budget, now time.Time) (Decision, error)
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
