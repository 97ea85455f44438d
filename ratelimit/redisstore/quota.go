package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	argOpBatch     any = "A"
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
// Nothing of the quota is on an event's path to the relay. Add queues
// the charge and returns; one goroutine per Quota sends the queued charges
// in batches of up to 256, gathered for at most 2 ms after the first
// (quotaLinger), one round trip each: on one Redis (a plain or Sentinel
// client) the charges of events with an id as one script call, otherwise
// a call per charge in one pipeline. It uses the Store's client, breaker
// and Close and ten times its deadline (Options.Timeout: no caller waits
// for a batch); a batch that fails leaves its events uncounted (the relay
// has them already). Whether an actor has room is read with the frame's
// own decision when the gate's limiter decides on this Quota's Store, on
// one Redis or a Cluster (Room: a ratelimit.Room decided with the frame's
// windows, from the count every instance's charges write). The price, stated as a
// bound: an actor can get accepted, across instances, the events it sends
// between its count reaching Events and the charges of its accepted
// events reaching Redis (after the relay's OK: up to 2 ms of gathering,
// the batch already in flight if any, and its own round trip) (plus the events already forwarded and awaiting their OK, as without
// batching). Exceeded asks no one (the gate asks it first, and where
// there is no Room, on a Ring or when the limiter is on another store,
// only it): it
// answers from a bounded table of the actors this Quota's charges found
// at their limit (Redis's reply to a charge carries the actor's count in
// the shared window), until the end of that window; its bound is per
// instance (an instance that charged nothing since does not know), and an
// actor whose entry another actor's took (4,096 entries, hashed with a
// per-process seed) gets one such gap more. An Add is
// idempotent across go-redis's retries (a request id, as Decide's; in a
// batch of charges sent as one call, each event's seen key), so a lost
// reply does not charge an actor twice.
//
// A Quota is safe for concurrent use. The zero Quota is not usable; use
// NewQuota.
type Quota struct {
	s      *Store
	events int
	window time.Duration
	tail   string // ":quota:<window ms>"
	args   [2]any // events and the window in ms, boxed once

	room  ratelimit.Room // Events per Window, for Room's budgets
	full  *quotaFull     // actors known at their limit (Exceeded)
	adds  chan quotaAdd  // charges queued for the sender
	start sync.Once      // starts the sender on the first Add
}

// quotaAdd is one queued charge: the actor, or with done (tests) a marker
// closed once everything queued before it was sent.
type quotaAdd struct {
	actor, id string
	created   int64 // unix seconds; 0: unknown
	done      chan struct{}
}

// The sender's queue and batch. A charge that finds the queue full is sent
// by its caller, at once: the queue bounds memory, never the count.
const (
	quotaQueue = 4096
	quotaBatch = 256
)

// quotaLinger is how long the sender waits, after a charge, for others to
// send with it: at a few thousand events a second, the charges of
// several events in one call (one script run, one TIME, one round trip)
// instead of one each, for 2 ms more before a charge reaches Redis.
const quotaLinger = 2 * time.Millisecond

// quotaPatience is how many of the store's Timeouts a batch of charges may
// take (see sendBatch).
const quotaPatience = 10

// quotaFullSlots is the size of the table of actors known at their limit:
// 4,096 entries of 16 bytes behind a pointer each.
const quotaFullSlots = 1 << 12

// quotaFull is the bounded table Exceeded reads: per slot (an actor's
// keyed hash) the actor's fingerprint and the instant (unix ns, the host's
// clock) its window ends. An entry is replaced whole, so a reader never
// sees half of one; another actor's entry in the slot simply misses.
type quotaFull struct {
	seed  maphash.Seed
	slots [quotaFullSlots]atomic.Pointer[fullEntry]
}

type fullEntry struct {
	fp    uint64
	until int64
}

func (f *quotaFull) slot(actor string) (*atomic.Pointer[fullEntry], uint64) {
	h := maphash.String(f.seed, actor)
	return &f.slots[h&(quotaFullSlots-1)], h | 1
}

// until returns the instant (unix ns) actor's full window ends, if known.
func (f *quotaFull) until(actor string) (int64, bool) {
	p, fp := f.slot(actor)
	if e := p.Load(); e != nil && e.fp == fp {
		return e.until, true
	}
	return 0, false
}

func (f *quotaFull) mark(actor string, until int64) {
	p, fp := f.slot(actor)
	p.Store(&fullEntry{fp: fp, until: until})
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
		room:   ratelimit.Room{Events: events, Window: window},
		full:   &quotaFull{seed: maphash.MakeSeed()},
		adds:   make(chan quotaAdd, quotaQueue),
	}, nil
}

// Events returns the events allowed per actor per window.
func (q *Quota) Events() int { return q.events }

// Window returns the window length.
func (q *Quota) Window() time.Duration { return q.window }

// Exceeded reports whether actor is known to have used its quota in the
// current window and, if so, how long until the next window: what this
// Quota's charges were told by Redis (see Quota), without a round trip. It
// counts nothing, and its error is always nil.
func (q *Quota) Exceeded(_ context.Context, actor string) (bool, time.Duration, error) {
	until, ok := q.full.until(actor)
	if !ok {
		return false, 0, nil
	}
	if left := until - time.Now().UnixNano(); left > 0 {
		return true, time.Duration(left), nil
	}
	return false, 0, nil
}

// exceededAt is Exceeded in the window containing now (at millisecond
// resolution); a zero now, or one at or before the unix epoch, means Redis
// TIME. For tests, which pass fixed instants rather than sleep.
func (q *Quota) exceededAt(ctx context.Context, actor string, now time.Time) (bool, time.Duration, error) {
	over, wait, _, err := q.call(ctx, argOpExceeded, quotaAdd{actor: actor}, now)
	return over, wait, err
}

// Add queues the charge of one accepted event to actor in the current
// window (by Redis TIME) and reports true at once; the charge is sent with
// others (see Quota). When the queue is full it is sent at once, by the
// caller: then it reports false, counting nothing, when actor was already
// at its limit, and an error wrapping ratelimit.ErrUnavailable when Redis
// did not answer. After the Store's Close it fails at once.
//
// The event id ("" for none) is charged once per window across
// connections and instances: a key per id in the actor's slot
// ("<prefix>{q:<actor>}:seen:<id>", TTL the window), made by the charge
// that counts it. An event whose createdAt (unix seconds, 0: unknown) is
// more than Window before Redis TIME is not charged (ActorQuota).
func (q *Quota) Add(ctx context.Context, actor, id string, createdAt int64) (bool, error) {
	if q.s.closed.Load() {
		return false, errClosedRefused
	}
	q.start.Do(func() { go q.send() })
	select {
	case q.adds <- quotaAdd{actor: actor, id: id, created: createdAt}:
		return true, nil
	default:
		return q.addEventAt(ctx, actor, id, createdAt, time.Time{})
	}
}

// addAt charges actor at once, in the window containing now; a zero now
// means Redis TIME (see exceededAt).
func (q *Quota) addAt(ctx context.Context, actor string, now time.Time) (bool, error) {
	return q.addEventAt(ctx, actor, "", 0, now)
}

// addEventAt is addAt for event id created at createdAt (see Add).
func (q *Quota) addEventAt(ctx context.Context, actor, id string, createdAt int64, now time.Time) (bool, error) {
	added, wait, count, err := q.call(ctx, argOpAdd, quotaAdd{actor: actor, id: id, created: createdAt}, now)
	if err == nil {
		q.learn(actor, added, wait, count)
	}
	return added, err
}

// args returns the script call charging a (see quota.lua): its key, the
// event's seen key when it has an id, and the arguments, with the cutoff
// cut (unix ms; 0: none) and the instant nowMs (0: Redis TIME).
func (q *Quota) argsOf(op any, a quotaAdd, nowMs, cut int64) []any {
	key, reqID := q.key(a.actor, op == argOpAdd && !q.s.lean)
	if op != argOpAdd {
		return []any{argEvalSha, argQuotaSHA, 1, key, op, q.args[0], q.args[1], nowMs, cut, argNoID}
	}
	created := createdMs(a.created)
	if a.id == "" {
		return []any{argEvalSha, argQuotaSHA, 1, key, op, q.args[0], q.args[1], nowMs, cut, reqID, created}
	}
	return []any{argEvalSha, argQuotaSHA, 2, key, q.seen(key, a.id), op, q.args[0], q.args[1], nowMs, cut, reqID, created}
}

// seen returns the seen key of event id in the slot of the actor whose
// key is key (see Add).
func (q *Quota) seen(key, id string) string {
	if len(id) > maxActorLen || strings.ContainsAny(id, "{}") {
		h := sha256.Sum256([]byte(id))
		id = "#" + hex.EncodeToString(h[:])
	}
	return key[:len(key)-len(q.tail)] + "}:seen:" + id
}

// batchArgs returns the one script call charging every charge of adds (each
// with an event id) in order, the batch Add of quota.lua ("A"), with the
// cutoff cut: two keys per charge, then the created_at of each.
func (q *Quota) batchArgs(adds []quotaAdd, cut int64) []any {
	args := make([]any, 0, 3+2*len(adds)+5+len(adds))
	args = append(args, argEvalSha, argQuotaSHA, 2*len(adds))
	for _, a := range adds {
		key, _ := q.key(a.actor, false)
		args = append(args, key, q.seen(key, a.id))
	}
	args = append(args, argOpBatch, q.args[0], q.args[1], 0, cut)
	for _, a := range adds {
		args = append(args, createdMs(a.created))
	}
	return args
}

// createdMs is an event's created_at (unix seconds) in ms as quota.lua
// reads it, 0 (unknown: charged) for one that is not positive or whose ms
// would not fit an int64: a created_at of 18446744073709552 s, wrapped, read
// as 384 ms after the epoch, an old copy, and its author was never counted.
func createdMs(created int64) int64 {
	if created <= 0 || created > math.MaxInt64/1000 {
		return 0
	}
	return created * 1000
}

// learn enters actor in the table of actors at their limit when a charge's
// reply says it is: refused with wait, or added as the last of the window
// (count = Events; the window's end is then taken from the host's clock,
// windows being aligned on the unix epoch).
func (q *Quota) learn(actor string, added bool, wait time.Duration, count int64) {
	now := time.Now().UnixNano()
	switch {
	case !added && wait > 0:
		q.full.mark(actor, now+int64(wait))
	case added && count >= int64(q.events):
		w := int64(q.window)
		q.full.mark(actor, now-now%w+w)
	}
}

// send is the Quota's sender: it takes what is queued, up to quotaBatch at
// a time, gathered for up to quotaLinger, and sends it as one round trip
// (sendBatch), until the Store is closed. A batch gathered when Close
// comes is still sent (and fails if the client is closed already);
// charges still queued then may be sent or dropped, as the relay has
// their events either way.
func (q *Quota) send() {
	batch := make([]quotaAdd, 0, quotaBatch)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		select {
		case a := <-q.adds:
			batch = append(batch[:0], a)
		case <-q.s.done:
			return
		}
		// Wait up to quotaLinger for more charges, unless the batch is
		// full or a marker (tests) asks for it to go now.
		linger.Reset(quotaLinger)
	more:
		for len(batch) < quotaBatch && batch[len(batch)-1].done == nil {
			select {
			case a := <-q.adds:
				batch = append(batch, a)
			case <-linger.C:
				break more
			case <-q.s.done:
				break more
			}
		}
		linger.Stop()
		q.sendBatch(batch)
		for _, a := range batch {
			if a.done != nil {
				close(a.done)
			}
		}
		clear(batch)
	}
}

// flushed returns once every charge queued before it was sent (tests).
func (q *Quota) flushed() {
	q.start.Do(func() { go q.send() })
	done := make(chan struct{})
	q.adds <- quotaAdd{done: done}
	<-done
}

// sendBatch charges batch (markers aside) in one round trip (one call of
// the batch Add on one Redis, else a pipeline of calls), bounded by
// quotaPatience of the store's Timeouts, and learns from each reply. It
// is one round trip for the breaker; an open breaker drops the batch
// uncounted.
func (q *Quota) sendBatch(batch []quotaAdd) {
	s := q.s
	n := 0
	for _, a := range batch {
		if a.done == nil {
			n++
		}
	}
	if n == 0 {
		return
	}
	probe, ok := s.br.allow()
	if !ok {
		return
	}
	start := time.Now()
	ctx := context.Background()
	var deadline time.Time
	if s.timeout > 0 {
		// Off the events' path, a batch has no caller waiting: it may
		// take ten Timeouts before it counts as Redis failing (and
		// against the breaker every decision shares).
		deadline = start.Add(quotaPatience * s.timeout)
		cc := s.ctxs.withDeadline(ctx, deadline)
		defer cc.release()
		ctx = cc
	}
	cut := cutoff(deadline, s.margin)
	// On one Redis the charges of events with an id go as one call of the
	// batch Add (its keys may be any); the rest, and every charge on a
	// Cluster or a Ring, go as a call each, in one pipeline.
	type one struct {
		adds  []quotaAdd // what this call charges, in order
		batch bool       // a batch Add ("A")
		args  []any
		cmd   *redis.Cmd
	}
	ones := make([]one, 0, n)
	var together []quotaAdd
	for i, a := range batch {
		switch {
		case a.done != nil:
		case s.one && a.id != "":
			together = append(together, a)
		default:
			args := q.argsOf(argOpAdd, a, 0, cut)
			ones = append(ones, one{adds: batch[i : i+1 : i+1], args: args, cmd: newCmd(ctx, args)})
		}
	}
	if len(together) > 0 {
		args := q.batchArgs(together, cut)
		ones = append(ones, one{adds: together, batch: true, args: args, cmd: newCmd(ctx, args)})
	}
	exec := func(again bool) {
		pl := s.nodesOrClient()
		if len(ones) == 1 || pl == nil {
			for _, o := range ones {
				if !again || o.args[0] == argEval {
					_ = s.client.Process(ctx, o.cmd)
				}
			}
			return
		}
		pipe := pl.Pipeline()
		for _, o := range ones {
			if !again || o.args[0] == argEval {
				_ = pipe.Process(ctx, o.cmd)
			}
		}
		_, _ = pipe.Exec(ctx)
	}
	exec(false)
	retry := false
	for i := range ones {
		if isNoScript(ones[i].cmd.Err()) {
			ones[i].args[0], ones[i].args[1] = argEval, argQuotaSource
			ones[i].cmd = newCmd(ctx, ones[i].args)
			retry = true
		}
	}
	if retry {
		exec(true)
	}
	failed := false
	var lastErr error
	for _, o := range ones {
		reply, err := o.cmd.Result()
		if err == nil && o.batch {
			err = q.learnBatch(o.adds, reply)
		} else if err == nil {
			var added bool
			var wait time.Duration
			var count int64
			if added, wait, count, err = parseQuotaReply(reply, true); err == nil {
				q.learn(o.adds[0].actor, added, wait, count)
			}
		}
		if err == nil {
			continue
		}
		if !answered(err) && !isQuotaRefusal(err) && err != errQuotaMalformed {
			failed = true
		}
		lastErr = err
	}
	s.trips.Add(1)
	if failed {
		s.tripFailures.Add(1)
		s.br.record(probe, outcomeFailed)
		s.reloadSlots()
	} else {
		s.br.record(probe, outcomeOK)
	}
	if s.observe != nil {
		s.observe(time.Since(start), lastErr)
	}
}

// errQuotaMalformed is a batch Add's report of an actor whose stored
// value the script would not read (nothing charged): Redis answered,
// about that key, as a single Add's 'ERR sluice quota: malformed value'.
var errQuotaMalformed = errors.New("redisstore: quota: malformed value in a batch of charges")

// learnBatch reads the reply of a batch Add of adds: three integers per
// charge, each an Add's reply, or -1, 0, 0 for an actor whose stored value
// the script would not read (then errQuotaMalformed, once every charge is
// read). A wrong reply is the error; every charge read before it is
// learnt.
func (q *Quota) learnBatch(adds []quotaAdd, reply any) error {
	arr, ok := reply.([]any)
	if !ok || len(arr) != 3*len(adds) {
		return badReply("batch quota reply %#v, want 3 integers for each of %d charges", reply, len(adds))
	}
	var bad error
	for i, a := range adds {
		part := arr[3*i : 3*i+3]
		if f, ok := part[0].(int64); ok && f == -1 {
			bad = errQuotaMalformed
			continue
		}
		added, wait, count, err := parseQuotaReply(part, true)
		if err != nil {
			return err
		}
		q.learn(a.actor, added, wait, count)
	}
	return bad
}

// Room returns actor's room check as a budget of a message decided by lim
// (ratelimit.Room), and true, when lim decides on this Quota's Store and
// that Store is on one Redis (a plain or Sentinel client) or a Cluster:
// the count is then read with the message's other budgets, from the key
// every instance's charges write, so a message of an actor at its limit is
// refused however recently another instance counted it. On one Redis it is
// read in the message's own script call, and nothing of a refused message
// is written; on a Cluster, where the actor's key is in a slot of its own,
// it is a decision of its own at the same time as the message's (batched
// with its master's), and a message the room refuses has its windows
// refunded (Store.DecideAll). A Ring routes a call by its first key and
// would read the count on the wrong shard: there, and on any other store
// (false), ask Exceeded.
func (q *Quota) Room(actor string, lim *ratelimit.Limiter) (ratelimit.Budget, bool) {
	if lim == nil {
		return ratelimit.Budget{}, false
	}
	if !q.s.one && q.s.nodes == nil {
		// A Ring, which routes a call by its first key and would read
		// the actor's count on the wrong shard.
		return ratelimit.Budget{}, false
	}
	if st, ok := lim.Store().(*Store); !ok || st != q.s {
		return ratelimit.Budget{}, false
	}
	key, _ := q.key(actor, false)
	return ratelimit.Budget{Key: key[len(q.s.prefix):], Room: &q.room}, true
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
func (q *Quota) call(ctx context.Context, op any, a quotaAdd, now time.Time) (bool, time.Duration, int64, error) {
	s := q.s
	if s.closed.Load() {
		return false, 0, 0, errClosedRefused
	}
	probe, ok := s.br.allow()
	if !ok {
		return false, 0, 0, errOpenRefused
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
		return false, 0, 0, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, ErrOverloaded)
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up before the call went out (its round trip
		// would not see it: callCtx).
		s.br.record(probe, outcomeIgnored)
		return false, 0, 0, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
	}

	var nowMs int64
	if !now.IsZero() {
		nowMs = max(now.UnixMilli(), 0)
	}
	args := q.argsOf(op, a, nowMs, cutoff(deadline, s.margin))
	rctx := ctx
	if !deadline.IsZero() {
		cc := s.ctxs.withDeadline(ctx, deadline)
		defer cc.release()
		rctx = cc
	}
	cmd := newCmd(rctx, args)
	_ = s.client.Process(rctx, cmd)
	if isNoScript(cmd.Err()) {
		args[0], args[1] = argEval, argQuotaSource
		cmd = newCmd(rctx, args)
		_ = s.client.Process(rctx, cmd)
	}
	reply, err := cmd.Result()
	var flag bool
	var wait time.Duration
	var count int64
	if err == nil {
		flag, wait, count, err = parseQuotaReply(reply, op == argOpAdd)
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
		return flag, wait, count, nil
	case errors.Is(err, errBadReply):
		return false, 0, 0, err
	case refused:
		return false, 0, 0, fmt.Errorf("%w: %w: %w", ratelimit.ErrUnavailable, errBadReply, err)
	}
	return false, 0, 0, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
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
func parseQuotaReply(reply any, add bool) (bool, time.Duration, int64, error) {
	arr, ok := reply.([]any)
	if !ok {
		return false, 0, 0, badReply("quota reply is %T, not an array", reply)
	}
	if len(arr) != 3 {
		return false, 0, 0, badReply("quota reply has %d elements, want 3", len(arr))
	}
	var v [3]int64
	for i, e := range arr {
		n, ok := e.(int64)
		if !ok {
			return false, 0, 0, badReply("quota reply element %d is %#v, not an integer", i, e)
		}
		v[i] = n
	}
	flag, wait, count := v[0], v[1], v[2]
	waits := (flag == 1) != add // over (Exceeded), refused (Add)
	switch {
	case flag != 0 && flag != 1:
		return false, 0, 0, badReply("quota flag is %d", flag)
	case waits && (wait < 1 || wait > maxWaitMs):
		return false, 0, 0, badReply("quota flag %d with a wait of %d ms", flag, wait)
	case !waits && wait != 0:
		return false, 0, 0, badReply("quota flag %d with a wait of %d ms", flag, wait)
	case count < 0:
		return false, 0, 0, badReply("quota count is %d", count)
	}
	return flag == 1, time.Duration(wait) * time.Millisecond, count, nil
}
