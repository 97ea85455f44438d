package ratelimit

import (
	"context"
	"time"
)

// ActorQuota is a per-actor budget on validated events, checked before an
// event is forwarded and charged when the relay accepts it.
//
// Exceeded reports whether actor has used its budget for the current
// window and, if so, how long until the next one. Add charges one accepted
// event and reports false, counting nothing, when actor was already at its
// limit. Events and Window describe the budget (0 and 0 for none). An
// implementation that cannot answer returns an error wrapping
// ErrUnavailable, and its boolean is then meaningless: a caller fails
// closed (refuses the event) on an error from Exceeded.
//
// Two implementations: the in-process *Quota through Quota.Local (never an
// error; one process), and redisstore.Quota (one budget shared by every
// instance on one Redis).
type ActorQuota interface {
	Exceeded(ctx context.Context, actor string) (bool, time.Duration, error)
	Add(ctx context.Context, actor string) (bool, error)
	Events() int
	Window() time.Duration
}

var _ ActorQuota = (*LocalQuota)(nil)

// LocalQuota is an in-process *Quota seen as an ActorQuota: each call reads
// its clock and asks the Quota, which never fails; the context is not
// consulted. A LocalQuota whose Quota is nil or Unlimited admits
// everything. It is safe for concurrent use when its clock is.
type LocalQuota struct {
	q     *Quota
	clock Clock
}

// Local returns q as an ActorQuota reading the time from clock: pass the
// Limiter's (Limiter.Now), so that the quota runs on the one clock; nil
// means the real Clock. q keeps its own methods: callers that pass
// instants themselves go on using them.
func (q *Quota) Local(clock Clock) *LocalQuota {
	return &LocalQuota{q: q, clock: clock}
}

// Exceeded is Quota.Exceeded at the clock's now; the error is always nil.
func (l *LocalQuota) Exceeded(_ context.Context, actor string) (bool, time.Duration, error) {
	over, wait := l.q.Exceeded(actor, l.clock.Now())
	return over, wait, nil
}

// Add is Quota.Add at the clock's now; the error is always nil.
func (l *LocalQuota) Add(_ context.Context, actor string) (bool, error) {
	return l.q.Add(actor, l.clock.Now()), nil
}

// Events returns the Quota's events per window; 0 when unlimited.
func (l *LocalQuota) Events() int { return l.q.Events() }

// Window returns the Quota's window; 0 when unlimited.
func (l *LocalQuota) Window() time.Duration { return l.q.Window() }
