package charge

import (
	"context"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// Event decides an EVENT of kind kind by author (nil: the event names
// none) from a connection whose NIP-42 pubkey is authed ("" for none). It
// is the one EVENT rule, the gate's and the hooks':
//
//  1. A free Subject (an allow-listed address or authenticated pubkey, a
//     Free tier's member) pays nothing.
//  2. The EVENT windows, its kind class's, the aggregates' and the actor
//     quota's room, when a quota applies (EventActor), are decided as one
//     (Charge): admitted only if all admit, written only then, the wait
//     the largest. A refusal, or a store that cannot decide, ends it
//     there, having charged nothing (on a Redis Cluster, the windows
//     charged and refunded: redisstore.Store.DecideAll). The quota is
//     asked first (Exceeded: the Redis quota from its memory of its
//     charges' replies, without a round trip): an actor known at its
//     limit is refused before anything is charged or sent, and the quota
//     failing refuses as unavailable. The Redis quota's room is then read
//     with the frame's budgets (redisstore.Quota.Room: on one Redis in the
//     frame's own script call; on a Cluster at the same time, the windows
//     refunded if it refuses), from the count every instance's charges
//     write; on a Ring, or on another store than the limiter's, the
//     memory alone answers. A forged author buys nothing: the quota counts only
//     events the relay validated, and a refusal by it writes nothing
//     anywhere.
//
// It returns the verdict and the actor to charge to the quota when the
// relay accepts the event ("" for none): the quota counts validated
// events only, so its charge is the caller's, on the relay's OK (the gate)
// or after the save (the hooks), to the actor returned here.
func (s *Subject) Event(ctx context.Context, lim *ratelimit.Limiter, kind int, authed string, author *scan.Hex32) (Verdict, string) {
	if s.free {
		return Verdict{Allowlisted: true}, ""
	}
	q, actor, exempt := s.EventActor(authed, author)
	var room *ratelimit.Budget
	if q != nil {
		over, wait, err := q.Exceeded(ctx, actor)
		switch {
		case err != nil:
			return Verdict{Err: err, Quota: true, Budget: "quota"}, ""
		case over:
			return Verdict{Refused: true, Wait: wait, Quota: true, Budget: "quota"}, ""
		}
		if rq, ok := q.(roomQuota); ok {
			if b, ok := rq.Room(actor, lim); ok {
				room = &b
			}
		}
	}
	v := s.chargeWith(ctx, lim, wire.TypeEVENT, 0, kind, room)
	if !v.Pass() {
		return v, ""
	}
	if exempt {
		v.Allowlisted = true
	}
	return v, actor
}

// roomQuota is an actor quota whose room is checked inside the frame's
// own decision when the limiter decides on the store that keeps its
// counts (redisstore.Quota.Room).
type roomQuota interface {
	Room(actor string, lim *ratelimit.Limiter) (ratelimit.Budget, bool)
}

// EventActor returns the actor quota that an EVENT by author (nil: none)
// from a connection whose NIP-42 pubkey is authed ("" for none) is asked
// and charged to, and its actor: authed when there is one, else the
// author. q is nil when nothing is asked or charged: no quota applies to s
// (it is free, or none is configured), there is no actor, or the author is
// allow-listed, which exempt then reports. An allow-listed author is
// exempt from the quota only, not from the windows (Event): forging its
// pubkey buys nothing, since the quota counts only events the relay
// validated.
func (s *Subject) EventActor(authed string, author *scan.Hex32) (q ratelimit.ActorQuota, actor string, exempt bool) {
	q = s.Quota()
	switch {
	case q == nil:
		return nil, "", false
	case authed != "":
		return q, authed, false
	case author == nil:
		return nil, "", false
	}
	if _, ok := s.p.allowPubkeys[*author]; ok {
		return nil, "", true
	}
	return q, author.String(), false
}

// Outcome is what an observer is told of v.
func (v Verdict) Outcome() policy.Outcome {
	switch {
	case v.Err != nil:
		return policy.Unavailable
	case v.Refused && v.Quota:
		return policy.QuotaExceeded
	case v.Refused:
		return policy.RateLimited
	case v.Allowlisted:
		return policy.Allowlisted
	case v.Shadow:
		return policy.Shadowed
	}
	return policy.Admitted
}
