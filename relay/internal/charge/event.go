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
//  2. The actor quota, when one applies (EventActor), is asked whether the
//     actor has room. Both quotas answer from memory, without a round trip
//     (redisstore.Quota from what its charges were told), so an actor at
//     its limit is refused before anything is charged; the quota failing
//     refuses as unavailable.
//  3. The EVENT windows, its kind class's and the aggregates' are decided
//     as one (Charge): a refusal, or a store that cannot decide, ends it
//     there, having charged nothing. A forged author buys nothing by this
//     order: the quota counts only events the relay validated, and a
//     refusal by it writes nothing anywhere.
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
	if q != nil {
		over, wait, err := q.Exceeded(ctx, actor)
		switch {
		case err != nil:
			return Verdict{Err: err, Quota: true, Budget: "quota"}, ""
		case over:
			return Verdict{Refused: true, Wait: wait, Quota: true, Budget: "quota"}, ""
		}
	}
	v := s.Charge(ctx, lim, wire.TypeEVENT, 0, kind)
	if !v.Pass() {
		return v, ""
	}
	if exempt {
		v.Allowlisted = true
	}
	return v, actor
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
