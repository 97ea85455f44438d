package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/scripts"
	"github.com/sluice-relay/sluice/ratelimit"
)

// quotaScript is shared by every Quota: the SHA is a property of the source.
var quotaScript = redis.NewScript(scripts.Quota)

// Arguments boxed once (see the Store's).
var (
	argQuotaSHA    any = quotaScript.Hash()
	argQuotaSource any = scripts.Quota
	argOpExceeded  any = "x"
	argOpAdd       any = "a"
	argNoID        any = ""
)

// quotaRefusalPrefix starts the script's error for a stored value it will
// not read (see internal/scripts/quota.lua).
const quotaRefusalPrefix = "ERR sluice quota: "

// maxActorLen is the longest actor a Quota puts in a key as it is. A longer
// actor, or one with a brace (which would move the key's hash tag), is
// replaced in the key by "#" and the hex SHA-256 of it: the gate passes
// 64-hex pubkeys, and no client string makes a key longer than this.
const maxActorLen = 64

// Quota is the actor quota in Redis: ratelimit.Quota's fixed windows (at
// most Events validated events per actor in each window of Window, windows
// aligned on the unix epoch) with the counts in Redis, so every gate
// instance on one Redis, sentinel or cluster gives an actor one budget.
// The windows are numbered from Redis TIME inside the script, the one clock
// the instances share.
//
// Each actor has one key, "<prefix>{q:<actor>}:quota:<window ms>", holding
// the window it counts and the count (internal/scripts/quota.lua), with a TTL of the
// rest of that window plus a second (or the window, if shorter): Redis's
// memory for the quota is bounded by time, not by a table. Unlike the
// in-process Quota there are no shared slots: an actor never shares a
// budget with another, and a client rotating pubkeys costs Redis one key
// per event it gets accepted in a window (about 140 bytes each with the
// default prefix; see TestQuotaRotatingActors), which the EVENT limits
// bound, until the window ends.
//
// Every call is one script call (EVALSHA, EVAL on NOSCRIPT) with the
// Store's client, deadline (Options.Timeout), breaker, Observe and Close,
// never batched. Every error wraps ratelimit.ErrUnavailable: Exceeded's
// boolean is then meaningless and the caller refuses the event (fails
// closed); an Add that fails is most likely uncounted. An Add is
// idempotent across go-redis's retries (a request id, as Decide's), so a
// lost reply does not charge an actor twice.
//
// A Quota is safe for concurrent use. The zero Quota is not usable; use
// NewQuota.
type Quota struct {
	s      *Store
	events int
	window time.Duration
	tail   string // ":quota:<window ms>"
	args   [2]any // events and the window in ms, boxed once
}

var _ ratelimit.ActorQuota = (*Quota)(nil)

// NewQuota returns a quota of events per window kept in s's Redis.
//
// It takes a Store rather than a client and Options: the quota talks to the
// same Redis as the limits, so it shares the Store's client (and pool), key
// prefix, deadline and breaker — one breaker measuring one Redis, opened
// by either kind of call — and the Store's Close. The validation is
// ratelimit.NewQuota's (errors wrap ratelimit.ErrInvalidQuota), plus one
// of Redis's: the window must be a whole number of milliseconds, Redis
// TIME's resolution here. A nil s is an error.
func NewQuota(s *Store, events int, window time.Duration) (*Quota, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil store", errConfig)
	}
	if _, err := ratelimit.NewQuota(events, window); err != nil {
		return nil, err
	}
	if window%time.Millisecond != 0 {
		return nil, fmt.Errorf("%w: window %v must be a whole number of milliseconds", ratelimit.ErrInvalidQuota, window)
	}
	ms := strconv.FormatInt(window.Milliseconds(), 10)
	return &Quota{
		s:      s,
		events: events,
		window: window,
		tail:   "}:quota:" + ms,
		args:   [2]any{strconv.Itoa(events), ms},
	}, nil
}

// Events returns the events allowed per actor per window.
func (q *Quota) Events() int { return q.events }

// Window returns the window length.
func (q *Quota) Window() time.Duration { return q.window }

// Exceeded reports whether actor has used its quota in the current window
// (by Redis TIME) and, if so, how long until the next window. It counts
// nothing. An error wraps ratelimit.ErrUnavailable.
func (q *Quota) Exceeded(ctx context.Context, actor string) (bool, time.Duration, error) {
	return q.exceededAt(ctx, actor, time.Time{})
}

// exceededAt is Exceeded in the window containing now (at millisecond
// resolution); a zero now, or one at or before the unix epoch, means Redis
// TIME. For tests, which pass fixed instants rather than sleep.
func (q *Quota) exceededAt(ctx context.Context, actor string, now time.Time) (bool, time.Duration, error) {
	return q.call(ctx, argOpExceeded, actor, now)
}

// Add charges one accepted event to actor in the current window (by Redis
// TIME). It reports false, counting nothing, when actor was already at its
// limit. An error wraps ratelimit.ErrUnavailable; the event is then most
// likely uncounted (counted if the reply, not the call, was lost).
func (q *Quota) Add(ctx context.Context, actor string) (bool, error) {
	return q.addAt(ctx, actor, time.Time{})
}

// addAt is Add in the window containing now; a zero now means Redis TIME
// (see exceededAt).
func (q *Quota) addAt(ctx context.Context, actor string, now time.Time) (bool, error) {
	added, _, err := q.call(ctx, argOpAdd, actor, now)
	return added, err
}

// key returns actor's key and, for an Add on a client that may resend, a
// fresh request id, in one allocation.
func (q *Quota) key(actor string, withID bool) (key, id string) {
	s := q.s
	var hashed [1 + 2*sha256.Size]byte
	name := actor
	if len(actor) > maxActorLen || strings.ContainsAny(actor, "{}") {
		h := sha256.Sum256([]byte(actor))
		hashed[0] = '#'
		hex.Encode(hashed[1:], h[:])
		name = "" // written from hashed below
	}
	var b strings.Builder
	b.Grow(len(s.prefix) + 3 + max(len(name), len(hashed)) + len(q.tail) + idLen)
	b.WriteString(s.prefix)
	b.WriteString("{q:")
	if hashed[0] != 0 {
		b.Write(hashed[:])
	} else {
		b.WriteString(name)
	}
	b.WriteString(q.tail)
	n := b.Len()
	if withID {
		var id [idLen]byte
		b.Write(s.appendRequestID(id[:0]))
	}
	all := b.String()
	return all[:n], all[n:]
}

// call runs the script once for op and reads its reply: for "x" whether
// actor is over and the wait, for "a" whether it was added. It bounds the
// call and reports it to the breaker exactly as Decide does a direct call.
func (q *Quota) call(ctx context.Context, op any, actor string, now time.Time) (bool, time.Duration, error) {
	s := q.s
	if s.closed.Load() {
		return false, 0, errClosedRefused
	}
	probe, ok := s.br.allow()
	if !ok {
		return false, 0, errOpenRefused
	}
	start := time.Now()
	var deadline time.Time
	if s.timeout > 0 {
		deadline = start.Add(s.timeout)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	if !deadline.IsZero() && !start.Before(deadline) {
		s.overloaded.Add(1)
		s.br.record(probe, outcomeIgnored)
		return false, 0, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ErrOverloaded)
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up before the call went out (its round trip
		// would not see it: callCtx).
		s.br.record(probe, outcomeIgnored)
		return false, 0, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
	}

	key, id := q.key(actor, op == argOpAdd && !s.lean)
	var nowMs, cut int64
	if !now.IsZero() {
		nowMs = max(now.UnixMilli(), 0)
	}
	cut = cutoff(deadline, s.margin)
	args := [...]any{argEvalSha, argQuotaSHA, 1, &key, op, q.args[0], q.args[1], &nowMs, &cut, argNoID}
	if id != "" {
		args[9] = &id
	}
	rctx := ctx
	if !deadline.IsZero() {
		cc := s.ctxs.withDeadline(ctx, deadline)
		defer cc.release()
		rctx = cc
	}
	cmd := newCmd(rctx, args[:])
	_ = s.client.Process(rctx, cmd)
	if isNoScript(cmd.Err()) {
		args[0], args[1] = argEval, argQuotaSource
		cmd = newCmd(rctx, args[:])
		_ = s.client.Process(rctx, cmd)
	}
	reply, err := cmd.Result()
	var flag bool
	var wait time.Duration
	if err == nil {
		flag, wait, err = parseQuotaReply(reply, op == argOpAdd)
	}

	s.trips.Add(1)
	refused := isQuotaRefusal(err)
	switch {
	case answered(err) || refused:
		// Redis answered, if only about this key (a stored value the script
		// will not read): not an outage.
		s.br.record(probe, outcomeOK)
	case errors.Is(ctx.Err(), context.Canceled):
		s.br.record(probe, outcomeIgnored)
	default:
		// Not in time, or not the script's reply (a bad reply is Redis or
		// something in between misbehaving, as for Decide).
		s.tripFailures.Add(1)
		s.br.record(probe, outcomeFailed)
	}
	if s.observe != nil {
		s.observe(time.Since(start), err)
	}
	switch {
	case err == nil:
		return flag, wait, nil
	case errors.Is(err, errBadReply):
		return false, 0, err
	case refused:
		return false, 0, fmt.Errorf("%w: %w: %w", ratelimit.ErrUnavailable, errBadReply, err)
	}
	return false, 0, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
}

// isQuotaRefusal reports whether err is the quota script refusing a stored
// value (or its arguments): Redis answered, about one key.
func isQuotaRefusal(err error) bool {
	if err == nil {
		return false
	}
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), quotaRefusalPrefix)
}

// parseQuotaReply reads the script's reply strictly: three integers, a
// flag of 0 or 1, a wait that is 1…2^40 ms with an Exceeded's "over" (1) or
// an Add's "refused" (0) and 0 otherwise, and a count of at least 0.
// Anything else wraps errBadReply and ratelimit.ErrUnavailable:
// never "not exceeded".
func parseQuotaReply(reply any, add bool) (bool, time.Duration, error) {
	arr, ok := reply.([]any)
	if !ok {
		return false, 0, badReply("quota reply is %T, not an array", reply)
	}
	if len(arr) != 3 {
		return false, 0, badReply("quota reply has %d elements, want 3", len(arr))
	}
	var v [3]int64
	for i, e := range arr {
		n, ok := e.(int64)
		if !ok {
			return false, 0, badReply("quota reply element %d is %#v, not an integer", i, e)
		}
		v[i] = n
	}
	flag, wait, count := v[0], v[1], v[2]
	waits := (flag == 1) != add // over (Exceeded), refused (Add)
	switch {
	case flag != 0 && flag != 1:
		return false, 0, badReply("quota flag is %d", flag)
	case waits && (wait < 1 || wait > maxWaitMs):
		return false, 0, badReply("quota flag %d with a wait of %d ms", flag, wait)
	case !waits && wait != 0:
		return false, 0, badReply("quota flag %d with a wait of %d ms", flag, wait)
	case count < 0:
		return false, 0, badReply("quota count is %d", count)
	}
	return flag == 1, time.Duration(wait) * time.Millisecond, nil
}
