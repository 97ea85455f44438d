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
// limit. It counts what the author really signed: id is the event's id
// ("" for none), charged once per window however often, and from however
// many connections and instances, it is accepted again (a bounded seen-set
// keyed by id); createdAt is the event's created_at in unix seconds (0:
// unknown), and an event created more than Window before now is not
// charged at all — copies of an author's old events cost their sender's
// own message budget only. Both report true, counting nothing. Events and Window describe the budget (0 and 0 for none). An
// implementation that cannot answer returns an error wrapping
// ErrUnavailable, and its boolean is then meaningless: a caller fails
// closed (refuses the event) on an error from Exceeded.
//
// Two implementations: the in-process *Quota (never an error; one
// process), and redisstore.Quota (one budget shared by every instance on
// one Redis). A nil ActorQuota is no quota.
type ActorQuota interface {
	Exceeded(ctx context.Context, actor string) (bool, time.Duration, error)
	Add(ctx context.Context, actor, id string, createdAt int64) (bool, error)
	Events() int
	Window() time.Duration
}
