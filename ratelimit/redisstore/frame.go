package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/scripts"
	"github.com/sluice-relay/sluice/ratelimit"
)

// refund takes an admission back off a key (internal/scripts/refund.lua).
var refund = redis.NewScript(scripts.Refund)

// DecideAll decides budgets as one message (ratelimit.Limiter.AllowAll):
// admitted only if every budget admits, each budget written only then;
// refused, nothing stays written and the wait is the largest. A zero now
// means Redis TIME, as for Decide; errors are Decide's.
//
// On one Redis (standalone, or a sentinel's master) it is one script call:
// the budgets' keys are one group of internal/scripts/ewma.lua. On a
// Cluster the keys of one master go in one call (scripts.EWMACluster: keys
// in several slots of one master), so a message whose budgets share a hash
// tag, or whose tags one master serves, is decided in one call too (but
// for the usual EVENT below). A
// message whose budgets span masters (an aggregate shared by many clients,
// say) is decided by one call per master, sent at once (one round trip,
// each master deciding its part atomically); when any part refuses or
// fails, the parts that admitted are refunded (internal/scripts/refund.lua)
// before the message is answered. The bound on what another client can
// see: between a part's write and its refund (at most the refund's round
// trip, or the store's Timeout if that master stops answering), a budget
// weighs at most this message's cost more than it should, so a racing
// message on that budget may be refused that it would have been admitted;
// none is ever admitted that should not be. A refund that fails leaves
// that one cost charged, decaying as any charge does.
//
// A message of several budgets is sent on its own, never batched with
// other clients' decisions (Options.Batch batches single-budget ones),
// but for the usual EVENT with the quota on: one window budget and a
// quota's room (ratelimit.Room) go as one decision with a companion
// (request.with), batched like a single-budget one: joined as a group in
// a batch's call, or the lean call with the room as its second key when
// it goes out alone. Sent on their own, those frames took a call each,
// and at 256 connections some queued past their deadline. On a Cluster
// the two go as two decisions at once, each batched with its master's,
// the window refunded when the room refuses (decideApart).
func (s *Store) DecideAll(ctx context.Context, budgets []ratelimit.Budget, now time.Time) (ratelimit.Decision, error) {
	var only, n int
	win, room := -1, -1 // the last window budget and room
	for i, b := range budgets {
		if b.Room != nil {
			// Checked here: the script refuses a bad room for the whole
			// call, and a batch's call carries other clients' decisions.
			if r := b.Room; r.Events < 1 || r.Window < time.Millisecond || r.Window%time.Millisecond != 0 {
				return ratelimit.Decision{By: i}, fmt.Errorf("%w: a room of %d events per %v (want at least one, per a whole number of ms)", ratelimit.ErrUnavailable, r.Events, r.Window)
			}
			only, n, room = i, n+1, i
		} else if b.Windows.Len() > 0 {
			only, n, win = i, n+1, i
		}
	}
	switch {
	case n == 0:
		return ratelimit.Decision{Allowed: true}, nil
	case n == 1 && room < 0:
		d, err := s.decide(ctx, budgets[only].Key, budgets[only].Windows, now, nil)
		if !d.Allowed || err != nil {
			d.By = only
		}
		return d, err
	case n == 2 && room >= 0 && win >= 0:
		// One window budget and a quota's room (an EVENT with the quota
		// on and no other budget, the usual frame): one decision with a
		// companion, batched with other clients' decisions like any one
		// (on a cluster, two, each batched with its master's: decideApart).
		d, err := s.decideWith(ctx, budgets[win].Key, budgets[win].Windows, now, nil, &budgets[room])
		if !d.Allowed || err != nil {
			if d.By == 1 {
				d.By = room
			} else {
				d.By = win
			}
		}
		return d, err
	}
	if s.closed.Load() {
		return ratelimit.Decision{By: only}, errClosedRefused
	}
	start := time.Now()
	deadline := s.deadline(ctx, start)
	var reqBuf [8]*request
	var byBuf [8]int
	reqs, by := reqBuf[:0], byBuf[:0]
	for i, b := range budgets {
		switch {
		case b.Room != nil:
			reqs = append(reqs, s.roomRequest(b.Key, b.Room, now))
		case b.Windows.Len() > 0:
			reqs = append(reqs, s.request(b.Key, b.Windows, now))
		default:
			continue
		}
		by = append(by, i)
	}
	var d ratelimit.Decision
	var at int
	var err error
	if s.nodes == nil {
		probe, ok := s.br.allow()
		if !ok {
			return ratelimit.Decision{By: by[0]}, errOpenRefused
		}
		var replies []any
		replies, err = s.frameCall(ctx, s.deadline(ctx, time.Now()), s.br, probe, reqs, false)
		if probe, ok := s.again(err, start, s.br); ok {
			replies, err = s.frameCall(ctx, s.deadline(ctx, time.Now()), s.br, probe, reqs, false)
		}
		if err == nil {
			d, at, err = combine(reqs, replies)
		}
	} else {
		d, at, err = s.clusterFrame(ctx, deadline, start, reqs)
	}
	if s.observe != nil && !errors.Is(err, errBreakerOpen) {
		s.observe(time.Since(start), err)
	}
	if err != nil || !d.Allowed {
		d.By = by[at]
	}
	return d, unavailable(err)
}

// frameCall sends reqs, one message's budgets on one node, as one group
// of one script call (cluster: scripts.EWMACluster), bounded by deadline,
// and reports the round trip to br as Store.direct does. It returns each
// request's part of the reply.
func (s *Store) frameCall(ctx context.Context, deadline time.Time, br *breaker, probe bool, reqs []*request, cluster bool) ([]any, error) {
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		s.overloaded.Add(1)
		br.record(probe, outcomeIgnored)
		return nil, ErrOverloaded
	}
	if err := ctx.Err(); err != nil {
		br.record(probe, outcomeIgnored)
		return nil, err
	}
	for i, r := range reqs {
		r.joined = i < len(reqs)-1
	}
	cut := cutoff(deadline, s.margin)
	var args []any
	if cluster {
		args = clusterCommand(reqs, cut)
	} else {
		args = commandBy(reqs, cut)
	}
	cctx := ctx
	if !deadline.IsZero() {
		cc := s.ctxs.withDeadline(ctx, deadline)
		defer cc.release()
		cctx = cc
	}
	sent := time.Now()
	cmd := s.run(cctx, args)
	replies := make([]any, len(reqs))
	var err error
	split(cmd, reqs, func(i int, r any, e error) {
		replies[i] = r
		if e != nil {
			err = e
		}
	})
	s.callTrip(ctx, sent, br, probe, err)
	return replies, err
}

// combine reads one message's replies: the first error (and its
// request), else admitted when every request admitted, else refused with
// the largest wait and the request that has it.
func combine(reqs []*request, replies []any) (ratelimit.Decision, int, error) {
	out := ratelimit.Decision{Allowed: true}
	at := 0
	for i, r := range reqs {
		d, err := parseReply(replies[i], r.windows.Len(), r.scores)
		if err != nil {
			return ratelimit.Decision{}, i, err
		}
		if !d.Allowed && (out.Allowed || d.Wait > out.Wait) {
			out, at = d, i
		}
	}
	return out, at, nil
}

// clusterFrame is DecideAll's part on a Cluster: the requests grouped by
// their master, a call per master at once, and the parts that admitted
// refunded when another did not.
func (s *Store) clusterFrame(ctx context.Context, deadline, start time.Time, reqs []*request) (ratelimit.Decision, int, error) {
	probe, ok := s.br.allow()
	if !ok {
		return ratelimit.Decision{}, 0, errOpenRefused
	}
	nds := make([]*node, len(reqs))
	for i, r := range reqs {
		nd, err := s.nodes.of(ctx, deadline, r.keys[0], start)
		if err != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				s.br.record(probe, outcomeIgnored)
			} else {
				s.br.record(probe, outcomeFailed)
			}
			return ratelimit.Decision{}, i, err
		}
		nds[i] = nd
	}
	if probe {
		s.br.record(true, outcomeOK)
	}
	// One part per master, in the order the masters first appear; a
	// request's order within its part is kept.
	type part struct {
		nd      *node
		probe   bool
		reqs    []*request
		at      []int // each request's index in reqs
		replies []any
		err     error
	}
	var parts []part
	for i, nd := range nds {
		j := 0
		for j < len(parts) && parts[j].nd != nd {
			j++
		}
		if j == len(parts) {
			parts = append(parts, part{nd: nd})
		}
		parts[j].reqs = append(parts[j].reqs, reqs[i])
		parts[j].at = append(parts[j].at, i)
	}
	for i := range parts {
		p, ok := parts[i].nd.br.allow()
		if !ok {
			for _, q := range parts[:i] {
				q.nd.br.record(q.probe, outcomeIgnored) // nothing sent: hand the probes back
			}
			return ratelimit.Decision{}, parts[i].at[0], parts[i].nd.errOpen
		}
		parts[i].probe = p
	}
	if len(parts) == 1 {
		replies, err := s.frameCall(ctx, s.deadline(ctx, time.Now()), parts[0].nd.br, parts[0].probe, reqs, true)
		if err != nil {
			return ratelimit.Decision{}, 0, err
		}
		return combine(reqs, replies)
	}
	// Several masters: every admission is replied with the value written
	// (its instant, for a refund).
	for _, r := range reqs {
		if r.room == nil { // a room writes nothing to refund
			r.scores = make([]float64, r.windows.Len())
		}
	}
	var wg sync.WaitGroup
	for i := range parts[1:] {
		p := &parts[1+i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.replies, p.err = s.frameCall(ctx, s.deadline(ctx, time.Now()), p.nd.br, p.probe, p.reqs, true)
		}()
	}
	parts[0].replies, parts[0].err = s.frameCall(ctx, s.deadline(ctx, time.Now()), parts[0].nd.br, parts[0].probe, parts[0].reqs, true)
	wg.Wait()

	out := ratelimit.Decision{Allowed: true}
	at := 0
	var err error
	var admitted []int // parts whose every request admitted: written
	for pi, p := range parts {
		if p.err != nil {
			if err == nil {
				err, at = p.err, p.at[0]
			}
			continue
		}
		d, j, e := combine(p.reqs, p.replies)
		switch {
		case e != nil:
			if err == nil {
				err, at = e, p.at[j]
			}
		case d.Allowed:
			admitted = append(admitted, pi)
		case out.Allowed || d.Wait > out.Wait:
			out, at = d, p.at[j]
		}
	}
	if err == nil && out.Allowed {
		return out, 0, nil
	}
	for _, pi := range admitted {
		s.refund(ctx, parts[pi].reqs, written(parts[pi].replies))
	}
	if err != nil {
		return ratelimit.Decision{}, at, err
	}
	return out, at, nil
}

// written returns the value each admission of replies (a call's parts,
// asked with their values) wrote, "" for a room's or a request's that
// wrote none.
func written(replies []any) []string {
	out := make([]string, len(replies))
	for i, r := range replies {
		if arr, ok := r.([]any); ok && len(arr) == 2 {
			out[i], _ = arr[1].(string)
		}
	}
	return out
}

// refund takes back the admissions of reqs, one master's part of a
// message on a Cluster, from the values they wrote (values[i], "" for
// none), in one pipeline, bounded by the store's Timeout from now: the
// message was refused elsewhere, and its caller may have given up.
func (s *Store) refund(ctx context.Context, reqs []*request, values []string) {
	rctx := context.WithoutCancel(ctx)
	if s.timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(rctx, s.timeout)
		defer cancel()
	}
	pipe := s.nodes.cc.Pipeline() // each call routed by its key
	for i, r := range reqs {
		v := values[i]
		if r.room != nil || len(v) < 8 {
			continue // a room writes nothing; no value written to take back from
		}
		b := make([]byte, 0, 8+16*r.windows.Len())
		b = append(b, v[:8]...)
		for j := range r.windows.Len() {
			l := r.windows.Limit(j)
			b = appendFloat(b, float64(l.Period/time.Millisecond))
			b = appendFloat(b, l.EffectiveCost())
		}
		if len(reqs) == 1 {
			// The usual EVENT's window, refused by the quota's room
			// (decideApart): EVALSHA, and EVAL only when Redis has
			// lost the script, since an actor past its quota is
			// refunded at each of its events that reaches Redis.
			_ = refund.Run(rctx, s.nodes.cc, []string{r.keys[0]}, string(b)).Err()
			return
		}
		// EVAL, not EVALSHA: a message spanning masters is refunded
		// rarely, and in a pipeline a missing script could not be sent
		// again before the reply.
		refund.Eval(rctx, pipe, []string{r.keys[0]}, string(b))
	}
	_, _ = pipe.Exec(rctx)
}
