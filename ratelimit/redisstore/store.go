package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/scripts"
	"github.com/sluice-relay/sluice/ratelimit"
)

// Defaults applied by New for zero Options fields.
const (
	defaultPrefix  = "sluice:"
	defaultTimeout = 100 * time.Millisecond
)

// The largest Options.Batch and Options.batchWorkers New accepts. Beyond a
// few dozen decisions per call nothing is gained (see the package
// benchmarks), and the queue is allocated up front.
const (
	maxBatch        = 1024
	maxBatchWorkers = 64
)

// Errors of New, and of Decide wrapped with ratelimit.ErrUnavailable.
var (
	// errBreakerOpen means the breaker is open and Redis was not called.
	errBreakerOpen = errors.New("redisstore: breaker open")
	// errConfig is wrapped by New for options or clients it cannot work with.
	errConfig = errors.New("redisstore: invalid configuration")
	// errBadReply means Redis answered with something that is not the
	// script's reply, or the script refused a stored value: a protocol
	// disagreement about one key, never read as a score. It is always
	// wrapped together with ratelimit.ErrUnavailable.
	errBadReply = errors.New("redisstore: malformed reply")
)

// Prebuilt so that refusing a flood while Redis is down allocates nothing.
var (
	errOpenRefused   = fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, errBreakerOpen)
	errClosedRefused = fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, errClosed)
)

// ewma is shared by every Store: the SHA is a property of the source.
var ewma = redis.NewScript(scripts.EWMA)

// ewma1 is the lean call for one decision of one or two windows sent
// alone: every direct call, with a request id unless the client never
// retries (see Store.lean); see leanArgs.
var ewma1 = redis.NewScript(scripts.EWMA1)

// ewmaCluster decides the messages of several clients on one master of a
// cluster in one call (see scripts.EWMACluster).
var ewmaCluster = redis.NewScript(scripts.EWMACluster)

// Options configures a Store. The zero value is usable.
//
// Every Store has a circuit breaker, which measures Redis in round trips
// (a batch of 32 decisions that timed out is one failure; a decision that
// expired in the store's own queue, ErrOverloaded, is none). It opens when,
// within the last second, at least 5 round trips failed and they were at
// least half of the round trips: decisions then fail at once, as
// unavailable, without reaching for Redis. It lets one probe through after
// 10 ms, then after twice as long at each failed probe, up to 100 ms, so
// decisions resume within about that of Redis answering again while an
// outage costs a few dial attempts a second. On a cluster each master has
// a breaker of its own.
type Options struct {
	// Prefix is prepended to every key; "" means "sluice:". It must not
	// contain '{' or '}': the client part of the key carries the Redis
	// Cluster hash tag, and a brace in the prefix would become the tag.
	Prefix string
	// Timeout bounds each decision's round trip, from the moment the
	// decision is sent to Redis (the caller's context's deadline when that
	// is earlier); 0 means 100 ms, a negative value means no deadline of
	// the store's own (the caller's context's deadline still applies).
	// What it bounds is Redis: a decision that waited in the store's own
	// queue (with Batch) or for a CPU before it was sent is not refused
	// for that wait, which is the gate's load, not Redis's; that wait is
	// itself bounded (see Batch). A caller's context cancelled before the
	// call goes out refuses it; one cancelled during the round trip does
	// not cut it short: it ends by its deadline at the latest.
	Timeout time.Duration
	// Observe, when not nil, is called after every call that reached for
	// Redis with its duration and error (nil on success), for a latency
	// histogram. Decisions refused by the open breaker are not observed.
	// It must be safe for concurrent use and fast.
	Observe func(d time.Duration, err error)
	// Batch, when positive, sends the decisions of concurrent callers to
	// Redis together, up to Batch per round trip (and, on a plain client,
	// per script call; docs/redis.md, "Batching"): one write and one read
	// per batch instead of per decision, on both sides. Four round trips
	// may be in flight before decisions queue for a shared one (eight
	// while none has queued since nothing was in flight); decisions that
	// waited a twentieth of the Timeout start more (up to 64), so a slow
	// Redis does not keep them in the queue; past 64 a queued decision
	// waits for one of them to end (each does by its own deadline), and
	// one whose node's breaker opened meanwhile is refused unsent. Each
	// decision returns by its own deadline from its sending. 0 means every decision is its
	// own round trip; at most 1024. With Batch the Store owns no
	// goroutines; Close fails what is queued.
	Batch int

	// breaker tunes the circuit breaker; the zero value is the one
	// described above. Tests set it.
	breaker breakerOptions
	// batchWorkers is the round trips in flight before decisions queue
	// (the four above); 0 means 4, at most 64. Tests and benchmarks set it.
	batchWorkers int
}

// Store is a ratelimit.Store on Redis. It is safe for concurrent use. The
// client stays the caller's: closing it is the caller's business.
type Store struct {
	client  processor
	batch   *batcher // nil unless Options.Batch > 0
	closed  atomic.Bool
	prefix  string
	timeout time.Duration
	margin  time.Duration // before a deadline, the script writes nothing
	observe func(time.Duration, error)
	// br is the breaker of the one node behind a plain or failover
	// client. On a cluster each master has its own (nodes), and br counts
	// only failures to find a key's master at all (no slot map loaded).
	br    *breaker
	nodes *nodes // nil unless the client is a *redis.ClusterClient

	// trips counts the round trips that reached for Redis, tripFailures
	// those Redis did not answer (see Stats).
	trips, tripFailures atomic.Uint64
	overloaded          atomic.Uint64 // expired before a direct call was sent

	// lean: the client never resends a command (a *redis.Client with
	// go-redis retries off), so decisions carry no request id. (One sent
	// alone is the lean single-decision script, scripts.EWMA1, on every
	// client.)
	lean bool

	// one: the client is a plain one (one Redis, or a sentinel's
	// master), where one script call may touch any keys: decisions of
	// different clients, a message and its quota's room, many quota
	// charges. A cluster's or a ring's keys live on different nodes.
	one bool

	ctxs callPool // the timers of direct and quota calls (callCtx)

	done chan struct{} // closed by Close: stops the quotas' senders

	unstall func() // releases the heartbeat (stalls), once
	resent  atomic.Uint64

	// known: Redis has answered a script call of this store, so the
	// scripts are cached there and calls go as EVALSHA. Until then (a
	// new store, or after a NOSCRIPT) they go as EVAL with the source: a
	// NOSCRIPT and a second call would cost a decision two round trips,
	// past its deadline when Redis is slow.
	known atomic.Bool

	idBase string // 6 random hex digits per Store, so gates rarely share ids
	idSeq  atomic.Uint64
}

var _ ratelimit.Store = (*Store)(nil)

// processor is what Decide needs of a client: a *redis.Client,
// *redis.ClusterClient, a failover client, or (in benchmarks) go-redis's
// auto-pipeliner.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// optionsClient and clusterOptionsClient are implemented by the concrete
// go-redis clients; they let New see whether socket deadlines follow the
// context.
type optionsClient interface{ Options() *redis.Options }
type clusterOptionsClient interface{ Options() *redis.ClusterOptions }

// New returns a Store deciding on client with opts.
//
// The client must follow context deadlines (ContextTimeoutEnabled: true;
// NewClient sets it): otherwise go-redis ignores the per-call deadline for
// socket reads and a hung Redis would hold every decision for the client's
// ReadTimeout. New refuses a *redis.Client or *redis.ClusterClient built
// without it; other UniversalClient implementations are
// taken on trust. A caller-built *redis.ClusterClient should also set
// DisableRoutingPolicies, as NewClient does: with the policies on, its
// first routed call waits for COMMAND from a random node, a hung one too.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", errConfig)
	}
	switch c := client.(type) {
	case optionsClient:
		if !c.Options().ContextTimeoutEnabled {
			return nil, fmt.Errorf("%w: client must be built with ContextTimeoutEnabled: true, or Timeout cannot bound a call", errConfig)
		}
	case clusterOptionsClient:
		if !c.Options().ContextTimeoutEnabled {
			return nil, fmt.Errorf("%w: cluster client must be built with ContextTimeoutEnabled: true, or Timeout cannot bound a call", errConfig)
		}
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = defaultPrefix
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("%w: prefix %q must not contain '{' or '}' (the hash tag belongs to the client)", errConfig, prefix)
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = defaultTimeout
	}
	br, err := newBreaker(opts.breaker)
	if err != nil {
		return nil, err
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:]) // crypto/rand.Read never fails on supported platforms
	st := &Store{
		client:  client,
		prefix:  prefix,
		timeout: timeout,
		margin:  max(timeout/10, 0),
		observe: opts.Observe,
		br:      br,
		idBase:  hex.EncodeToString(seed[:3]),
		done:    make(chan struct{}),
	}
	if cc, ok := client.(*redis.ClusterClient); ok {
		st.nodes = newNodes(cc, opts.breaker)
	}
	if c, ok := client.(*redis.Client); ok {
		st.one = true
		st.lean = c.Options().MaxRetries == 0
	}
	// The counter starts at a random point too: two gates (or one restarted)
	// whose 24-bit bases collide would otherwise count 1, 2, 3… in step, and
	// an id repeated within a key's last 4 admissions is admitted free.
	st.idSeq.Store(binary.LittleEndian.Uint64(seed[:]) >> 24)
	switch {
	case opts.Batch < 0 || opts.batchWorkers < 0:
		return nil, fmt.Errorf("%w: Batch %d and batchWorkers %d must not be negative", errConfig, opts.Batch, opts.batchWorkers)
	case opts.Batch > maxBatch || opts.batchWorkers > maxBatchWorkers:
		// The queue holds Batch × batchWorkers calls, allocated up front.
		return nil, fmt.Errorf("%w: Batch %d and batchWorkers %d must be at most %d and %d", errConfig, opts.Batch, opts.batchWorkers, maxBatch, maxBatchWorkers)
	case opts.Batch > 0:
		workers := opts.batchWorkers
		if workers == 0 {
			workers = 4
		}
		// Decisions of different clients share a script call only on a
		// plain client (one).
		st.batch = newBatcher(client, st.one, opts.Batch, workers, timeout/20, st.batchTrip)
		st.batch.timeout = timeout
		// On a cluster, decisions whose keys one master serves may share a
		// call too (scripts.EWMACluster); not on a ring, whose shards are
		// not slots a script may be told about.
		st.batch.cluster = st.nodes != nil
		if st.nodes != nil {
			st.batch.nodeAt = func(addr string) *breaker {
				nd, err := st.nodes.add(addr)
				if err != nil {
					return nil
				}
				return nd.br
			}
		}
		st.batch.known = &st.known
		st.batch.margin = st.margin
	}
	st.unstall = stalls.hold() // last: a New that fails holds nothing
	return st, nil
}

// Close stops the batch workers, if any; decisions after Close fail with
// ratelimit.ErrUnavailable (the store is closed). It does not close the
// client. It is safe to call more than once and concurrently with Decide.
func (s *Store) Close() error {
	if !s.closed.Swap(true) {
		close(s.done)
		s.unstall()
	}
	if s.batch != nil {
		s.batch.close()
	}
	return nil
}

// batchTrip is the batcher's report of one round trip to the node whose
// breaker is br (on a cluster, a batch reports once per node it reached).
func (s *Store) batchTrip(br *breaker, probe, ok bool) {
	s.trips.Add(1)
	if ok {
		br.record(probe, outcomeOK)
		return
	}
	s.tripFailures.Add(1)
	br.record(probe, outcomeFailed)
	s.reloadSlots()
}

// callTrip is a direct call's report of its round trip, sent at sent,
// which ended in err: a call its caller gave up on (a canceled context)
// says nothing of the node.
func (s *Store) callTrip(ctx context.Context, sent time.Time, br *breaker, probe bool, err error) {
	ok := heard(err, sent)
	if !ok && errors.Is(ctx.Err(), context.Canceled) {
		s.trips.Add(1)
		br.record(probe, outcomeIgnored)
		return
	}
	s.batchTrip(br, probe, ok)
}

// nodesOrClient is the client a pipeline of several keys goes through:
// the cluster client splits it by node.
func (s *Store) nodesOrClient() pipeliner {
	if s.nodes != nil {
		return s.nodes.cc
	}
	p, _ := s.client.(pipeliner) // nil only for a benchmark's processor
	return p
}

// pipeliner is what a pipeline of several keys needs of a client.
type pipeliner interface{ Pipeline() redis.Pipeliner }

// reloadSlots asks a cluster client for a fresh slot map (rate-limited):
// a round trip towards a node failed, and the node may have lost its
// slots to a replica.
func (s *Store) reloadSlots() {
	if s.nodes != nil {
		s.nodes.reload()
	}
}

// Stats are a Store's counters since New, for metrics and an outage log.
type Stats struct {
	// RoundTrips is how many calls reached for Redis (a batch is one; on a
	// cluster, one per master it went to), and RoundTripFailures how many
	// of them Redis did not answer in time or answered with something
	// other than the script's reply: what the breakers measure.
	RoundTrips, RoundTripFailures uint64
	// Overloaded is how many decisions expired in the store's own queue,
	// never sent (ErrOverloaded): the gate's overload, not Redis's.
	Overloaded uint64
	// Stalls is how many Redis answers were saved after the gate itself
	// did not run for a while (its machine paused, its CPU taken): replies
	// read in the time given back past their deadline, by any connection
	// NewClient dialled in this process, and this store's decisions Redis
	// had refused as late sent once more (see the package docs).
	Stalls uint64
}

// Stats returns the store's counters now.
func (s *Store) Stats() Stats {
	st := Stats{RoundTrips: s.trips.Load(), RoundTripFailures: s.tripFailures.Load(), Overloaded: s.overloaded.Load(),
		Stalls: stallGraces.Load() + s.resent.Load()}
	if s.batch != nil {
		st.Overloaded += uint64(s.batch.expired.Load())
	}
	return st
}

// BreakerState reports the breaker's state now, for metrics: "closed"
// (calls go to Redis), "open" (calls fail at once, as unavailable, without
// reaching Redis) or "half-open" (the cool-down has passed; the next call
// is a probe). On a cluster it is the worst of the masters' breakers
// (open, then half-open, then closed) among the masters decisions were
// routed to in the last 3 s, and of the breaker that refuses decisions
// while no slot map can be loaded at all: "open" then means some clients
// are refused, not all (see NodeBreakers for which node).
func (s *Store) BreakerState() string { return s.breakerNow().String() }

// breakerNow is BreakerState as a breakerState.
func (s *Store) breakerNow() breakerState {
	st := s.br.state()
	if s.nodes != nil {
		for _, nd := range s.nodes.live() {
			st = worse(st, nd.br.state())
		}
	}
	return st
}

// NodeBreakers reports, on a cluster, the state of the breaker of each
// master decisions were routed to in the last 3 s (as BreakerState words
// it), by the master's address as the client's slot map names it; nil on
// a plain or failover client, whose one breaker is BreakerState.
func (s *Store) NodeBreakers() map[string]string {
	if s.nodes == nil {
		return nil
	}
	live := s.nodes.live()
	out := make(map[string]string, len(live))
	for _, nd := range live {
		out[nd.addr] = nd.br.state().String()
	}
	return out
}

// Decide implements ratelimit.Store: it runs the EWMA script over every
// window of key in one round trip. A zero now means Redis TIME; otherwise
// now is used at millisecond resolution (an instant at or before the Unix
// epoch also means Redis TIME). No windows means allowed without a call.
// An error always wraps ratelimit.ErrUnavailable.
func (s *Store) Decide(ctx context.Context, key string, windows *ratelimit.Windows, now time.Time) (ratelimit.Decision, error) {
	return s.decide(ctx, key, windows, now, nil)
}

// decide is Decide with each window's score after the decision written to
// scores when it is not nil (len windows.Len()): the conformance suite
// reads them, the hot path does not.
func (s *Store) decide(ctx context.Context, key string, windows *ratelimit.Windows, now time.Time, scores []float64) (ratelimit.Decision, error) {
	return s.decideWith(ctx, key, windows, now, scores, nil)
}

// decideWith is decide with, when room is not nil, a quota's room decided
// with it as one message: off a cluster in the same call
// (request.with), batched like any decision; on a cluster, where the
// actor's key is in a slot of its own, apart (decideApart). A refusal or
// error of the room's has By 1.
func (s *Store) decideWith(ctx context.Context, key string, windows *ratelimit.Windows, now time.Time, scores []float64, room *ratelimit.Budget) (ratelimit.Decision, error) {
	if windows.Len() == 0 {
		return ratelimit.Decision{Allowed: true}, nil
	}
	if room != nil && s.nodes != nil {
		return s.decideApart(ctx, key, windows, now, room)
	}
	return s.decideReq(ctx, key, nil, func() *request {
		r := s.request(key, windows, now)
		r.scores = scores
		if room != nil {
			r.with = s.roomRequest(room.Key, room.Room, now)
		}
		return r
	})
}

// decideApart decides a message of one window budget and a quota's room
// on a cluster: the two as decisions of their own, each batched with its
// master's, at once. The window's admission is written before the room is
// known, so when the room refuses (or fails) it is refunded, as
// DecideAll's parts on several masters are; the bound on what a racing
// message sees is DecideAll's. The verdict is decision's for a
// request with a companion: the window's error, then the room's, then the
// longer wait of the two refusals.
func (s *Store) decideApart(ctx context.Context, key string, windows *ratelimit.Windows, now time.Time, room *ratelimit.Budget) (ratelimit.Decision, error) {
	wreq := s.request(key, windows, now)
	wreq.scores = make([]float64, windows.Len()) // its admission replied with its value, for a refund
	rreq := s.roomRequest(room.Key, room.Room, now)
	type result struct {
		d   ratelimit.Decision
		err error
	}
	rc := make(chan result, 1)
	go func() {
		d, err := s.decideReq(ctx, room.Key, rreq, nil)
		rc <- result{d, err}
	}()
	d, err := s.decideReq(ctx, key, wreq, nil)
	r := <-rc
	r.d.By = 1
	switch {
	case err != nil:
		return d, err
	case r.err == nil && r.d.Allowed:
		return d, nil
	case d.Allowed:
		s.refund(ctx, []*request{wreq}, []string{wreq.value})
	}
	if r.err != nil || d.Allowed || r.d.Wait > d.Wait {
		return r.d, r.err
	}
	return d, nil
}

// decideReq decides req (when nil, built by mk once the breakers let the
// decision go: key is the budget's key without the prefix, which routes
// it on a cluster), straight out or batched (see batcher).
func (s *Store) decideReq(ctx context.Context, key string, req *request, mk func() *request) (ratelimit.Decision, error) {
	if s.closed.Load() {
		return ratelimit.Decision{}, errClosedRefused
	}
	probe, ok := s.br.allow()
	if !ok {
		return ratelimit.Decision{}, errOpenRefused
	}
	br := s.br
	start := time.Now()
	deadline := s.deadline(ctx, start)
	if s.nodes != nil {
		// The breaker that judges this decision is its master's. s.br
		// only refuses while the client cannot load a slot map at all.
		rk := routeKey(key)
		if rk == "" {
			if req == nil {
				req = mk()
			}
			rk = req.keys[0]
		}
		nd, err := s.nodes.of(ctx, deadline, rk, start)
		switch {
		case err != nil && errors.Is(ctx.Err(), context.Canceled):
			s.br.record(probe, outcomeIgnored)
			return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
		case err != nil:
			s.br.record(probe, outcomeFailed)
			return ratelimit.Decision{}, fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
		case probe:
			// Only a probe's success is counted: once a slot map is
			// loaded, finding a master cannot fail again, and counting
			// every decision would take a lock per decision.
			s.br.record(true, outcomeOK)
		}
		br = nd.br
		if probe, ok = br.allow(); !ok {
			return ratelimit.Decision{}, nd.errOpen
		}
	}
	if req == nil {
		req = mk()
	}
	d, err := s.send(ctx, start, br, probe, req)
	if probe, ok := s.again(err, start, br); ok {
		d, err = s.send(ctx, time.Now(), br, probe, req)
	}
	if s.observe != nil && !errors.Is(err, errBreakerOpen) { // a queued decision its breaker refused was not sent
		s.observe(time.Since(start), err)
	}
	return d, unavailable(err)
}

// send decides req once: straight out, or in a batch when round trips
// are busy. asked is when the decision was asked for (its wait in the
// queue starts there).
func (s *Store) send(ctx context.Context, asked time.Time, br *breaker, probe bool, req *request) (ratelimit.Decision, error) {
	var d ratelimit.Decision
	var err error
	switch {
	case s.batch != nil && s.batch.tryDirect():
		d, err = s.direct(ctx, s.deadline(ctx, time.Now()), br, probe, req)
		s.batch.finish(false)
	case s.batch != nil:
		c := &call{req: req, asked: asked, br: br, probe: probe}
		if until, ok := ctx.Deadline(); ok {
			c.until = until
		}
		d, err = s.batch.queueLocked(ctx, c) // tryDirect left b.mu held
		if probe && !c.sent.Load() {
			br.record(true, outcomeIgnored) // never sent: hand the probe slot back
		}
	default:
		d, err = s.direct(ctx, s.deadline(ctx, time.Now()), br, probe, req)
	}
	return d, err
}

// deadline is the whole deadline of a decision sent at start: the store's
// Timeout from then, or ctx's deadline when earlier; zero for none. A
// decision's deadline is taken when it is sent (the store's Timeout bounds
// Redis, not the gate's own wait before the sending); on a cluster the
// slot-map load a first decision may need is bounded from Decide.
func (s *Store) deadline(ctx context.Context, start time.Time) time.Time {
	var deadline time.Time
	if s.timeout > 0 {
		deadline = start.Add(s.timeout)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	return deadline
}

// unavailable wraps a decision's error (nil: none) as Decide returns it:
// always with ratelimit.ErrUnavailable, and a script refusing a value as a
// bad reply too.
func unavailable(err error) error {
	refusedValue := isScriptRefusal(err)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrOverloaded), errors.Is(err, errClosed):
		return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
	case errors.Is(err, errBadReply), errors.Is(err, ratelimit.ErrUnavailable):
		return err
	case refusedValue:
		return fmt.Errorf("%w: %w: %w", ratelimit.ErrUnavailable, errBadReply, err)
	}
	return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
}

// direct decides req alone, bounded by deadline and ctx, and reports the
// round trip to the breaker. A caller that gave up (client gone, shutdown:
// its context cancelled) says nothing about Redis. A caller whose own
// deadline passed does: Redis did not answer within it, and were that not
// counted, callers with deadlines shorter than Timeout would keep the
// breaker closed on a hung Redis forever.
func (s *Store) direct(ctx context.Context, deadline time.Time, br *breaker, probe bool, req *request) (ratelimit.Decision, error) {
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		// Expired before it was sent (the caller's deadline was already
		// past, or this goroutine waited for a CPU): our overload.
		s.overloaded.Add(1)
		br.record(probe, outcomeIgnored)
		return ratelimit.Decision{}, ErrOverloaded
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up before the call went out (its round trip
		// would not see it: callCtx).
		br.record(probe, outcomeIgnored)
		return ratelimit.Decision{}, err
	}
	var reply any
	var err error
	sent := time.Now()
	if deadline.IsZero() {
		reply, err = s.runLean(ctx, req, 0)
	} else {
		cc := s.ctxs.withDeadline(ctx, deadline)
		reply, err = s.runLean(cc, req, cutoff(deadline, s.margin))
		cc.release()
	}
	d, err := decision(reply, err, req)
	s.callTrip(ctx, sent, br, probe, err)
	return d, err
}

// cutoff is the instant (unix ms) past which the script must not write for
// a call whose first decision has deadline: margin before it, since the
// reply still has to come back. Zero (none) without a deadline.
func cutoff(deadline time.Time, margin time.Duration) int64 {
	if deadline.IsZero() {
		return 0
	}
	return deadline.Add(-margin).UnixMilli()
}

// heard reports whether a call sent at sent that ended in err shows Redis
// answering: the script's reply, or its refusal of one key — or its
// refusal of the call as late when the gate stalled meanwhile (lateOnUs).
func heard(err error, sent time.Time) bool {
	return answered(err) || lateOnUs(err, sent)
}

// lateOnUs reports whether Redis refused a call asked at since as late
// (past its cutoff: nothing of it was written) while the gate itself did
// not run for part of the wait (stallMeter): the time lost was the
// gate's, not Redis's.
func lateOnUs(err error, since time.Time) bool {
	return isLate(err) && stalls.since(since) > 0
}

// again reports whether a decision asked at since that ended in err goes
// once more, with a deadline of its own, and with which probe of br: when
// it was late on us (lateOnUs) and br lets it go.
func (s *Store) again(err error, since time.Time, br *breaker) (probe, ok bool) {
	if !lateOnUs(err, since) {
		return false, false
	}
	if probe, ok = br.allow(); ok {
		s.resent.Add(1)
	}
	return probe, ok
}

// isLate reports whether the script refused a call as past its cutoff.
func isLate(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "ERR sluice late")
}

// IsPerKey reports whether err, returned by Decide, is Redis answering about
// one key rather than Redis not answering: a reply that is not a list of
// numbers, the script refusing a stored value, or Redis Cluster refusing a
// key whose windows are in different slots. Such an error refuses one
// client's message (it still wraps ratelimit.ErrUnavailable) while every
// other client is served; the breaker does not count it, and an operator's
// outage alarm should not either.
func IsPerKey(err error) bool {
	return errors.Is(err, errBadReply) || isScriptRefusal(err) || isCrossSlot(err)
}

// isScriptRefusal reports whether err is the script's own error reply
// ("ERR sluice ewma: …": a malformed stored value, arguments it refuses), as opposed to Redis failing to run
// it. Each is about one key or one call, and Redis did answer.
func isScriptRefusal(err error) bool {
	if err == nil {
		return false // before re exists: it escapes, and would cost every call an allocation
	}
	var rf refusal
	if errors.As(err, &rf) {
		return true
	}
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), refusalPrefix)
}

// refusalPrefix starts every error the script replies, for a whole call or
// (as a -1 flag and this message) for one decision of it.
const refusalPrefix = "ERR sluice ewma: "

// refusal is the script refusing one decision of a call (a -1 flag).
type refusal string

func (r refusal) Error() string { return string(r) }

// isCrossSlot reports whether Redis Cluster refused the call because the
// key's windows are in different slots: a key without a non-empty {hash
// tag}, such as the "{}" of an empty client identity.
func isCrossSlot(err error) bool {
	if err == nil {
		return false
	}
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "CROSSSLOT")
}

// Argument values boxed once: converting a string or a large integer to
// an interface allocates, and these are the same on every call.
var (
	argEvalSha any = "evalsha"
	argEval    any = "eval"
	argSHA     any = ewma.Hash()
	argSource  any = scripts.EWMA
	argSHA1    any = ewma1.Hash()
	argSource1 any = scripts.EWMA1
	argSHAX    any = ewmaCluster.Hash()
	argSourceX any = scripts.EWMACluster
	argScores  any = "s" // ewma1.lua's ARGV[3]: reply an admission with its scores
)

// request is one decision's part of a script call: its key (one, holding
// every window) and the request id, sharing one byte allocation, and the prepared
// windows, whose script arguments are ready to send. A call deciding
// several requests at one instant is built by command.
type request struct {
	keys    []string
	id      string
	windows *ratelimit.Windows
	room    *ratelimit.Room // a room check (ratelimit.Room) instead of windows
	value   string          // the value an admission wrote, when its scores were asked for (decision)
	// with, when set, is a room check decided with this request, as one
	// message of two budgets (joined: see internal/scripts/ewma.lua,
	// "Groups"), in the same call: so a frame of one window budget and a
	// quota's room still goes batched, a call shared with others, or
	// alone as the lean call with two keys (leanArgs).
	with *request
	now  int64 // unix ms; 0 means Redis TIME
	// The packed arguments of the call this request leads (see commandOf
	// and leanArgs): now, the cutoff and the limits; a batch call's list
	// indices.
	nums, ix string
	scores   []float64 // when not nil, receives the scores (see decide)
	joined   bool      // joined with the next request: one message (DecideAll)

	keysArr [1]string
}

// command returns the EVALSHA deciding reqs, which share one instant, in
// order (see internal/scripts/ewma.lua): numkeys, every decision's key, the packed
// numbers (the instant, the cutoff, each distinct set of windows once), the
// packed index of each request's set, then the ids if the store sends
// them. Keys, ids and the packed arguments go in as *string, which an
// interface holds without allocating and go-redis writes like a string:
// two allocations, the argument slice and the packed arguments.
func command(reqs []*request) []any { return commandBy(reqs, 0) }

// commandBy is command with a cutoff (unix ms; 0: none) past which, by
// Redis TIME, the script must decide and write nothing (see
// internal/scripts/ewma.lua, ARGV[1]).
func commandBy(reqs []*request, cutoff int64) []any { return commandOf(reqs, cutoff, false) }

// clusterCommand is commandBy for scripts.EWMACluster: the decisions' keys,
// one each, in different slots of one master; only the first is declared,
// the others follow the arguments, then their count.
func clusterCommand(reqs []*request, cutoff int64) []any { return commandOf(reqs, cutoff, true) }

func commandOf(reqs []*request, cutoff int64, cluster bool) []any {
	// A limit list is a request's windows or its room (a room list).
	type list struct {
		ws   *ratelimit.Windows
		room *ratelimit.Room
	}
	var lists [8]list
	distinct := lists[:0]
	index := func(r *request) int {
		l := list{r.windows, r.room} // a room request has no windows
		for i, d := range distinct {
			if d == l {
				return i + 1
			}
		}
		distinct = append(distinct, l)
		return len(distinct)
	}
	// The call's decisions: each request, then its companion (with).
	var decBuf [16]*request
	decs := decBuf[:0]
	for _, r := range reqs {
		decs = append(decs, r)
		if r.with != nil {
			decs = append(decs, r.with)
		}
	}
	nkeys, nlim := 0, 0
	for _, r := range decs {
		nkeys += len(r.keys)
		index(r)
	}
	for _, d := range distinct {
		if d.room != nil {
			nlim += 24
		} else {
			nlim += 8 + 24*d.ws.Len()
		}
	}
	// One string holds both packed arguments: the call's numbers (now, the
	// cutoff, the number of lists, the lists), then each decision's list
	// index (two bytes); it is kept in the first request, so that the
	// arguments point into it (*string) rather than box a copy.
	b := make([]byte, 0, 24+nlim+2*len(decs))
	b = appendFloat(b, float64(reqs[0].now))
	b = appendFloat(b, float64(cutoff))
	b = appendFloat(b, float64(len(distinct)))
	for _, d := range distinct {
		if d.room != nil {
			// A room list (internal/scripts/ewma.lua, "Rooms"): 0, E, W.
			b = appendFloat(b, 0)
			b = appendFloat(b, float64(d.room.Events))
			b = appendFloat(b, float64(d.room.Window.Milliseconds()))
			continue
		}
		b = appendFloat(b, float64(d.ws.Len()))
		b = appendLimits(b, d.ws)
	}
	nums := len(b)
	for _, r := range decs {
		ix := uint16(index(r))
		if r.scores != nil {
			ix |= withValue // reply its admission with the value written
		}
		if r.joined || r.with != nil {
			ix |= joinedBit
		}
		b = binary.LittleEndian.AppendUint16(b, ix)
	}
	lead := reqs[0]
	packed := unsafe.String(unsafe.SliceData(b), len(b)) // b is not written again
	lead.nums, lead.ix = packed[:nums], packed[nums:]
	// A store sends ids for every decision or for none ("" for a room,
	// which writes nothing).
	ids := 0
	for _, r := range decs {
		if r.id != "" {
			ids = len(decs)
			break
		}
	}
	args := make([]any, 0, 6+nkeys+ids+len(decs))
	if cluster {
		args = append(args, argEvalSha, argSHAX, 1, &decs[0].keys[0])
	} else {
		args = append(args, argEvalSha, argSHA, nkeys)
		for _, r := range decs {
			for i := range r.keys {
				args = append(args, &r.keys[i])
			}
		}
	}
	args = append(args, &lead.nums, &lead.ix)
	if ids > 0 {
		for _, r := range decs {
			args = append(args, &r.id)
		}
	}
	if cluster {
		for _, r := range decs[1:] {
			args = append(args, &r.keys[0])
		}
		args = append(args, len(decs)-1)
	}
	return args
}

// withValue is the bit of a decision's list index (internal/scripts/ewma.lua's
// ARGV[2]) that asks for its admission to be replied with the value
// written; without it an admission is 0, 0.
const withValue = 1 << 15

// joinedBit is the bit of a decision's list index that joins it with the
// next decision of the call: budgets of one message, written only if all
// admit (internal/scripts/ewma.lua, "Groups").
const joinedBit = 1 << 14

// appendFloat appends f as the scripts read a packed number: a
// little-endian IEEE double (Lua's struct "<d").
func appendFloat(b []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
}

// appendLimits appends ws as the scripts read a limit list's windows: per
// window its rate, half-life in whole milliseconds and cost, packed (see
// internal/scripts/ewma.lua, ARGV[1]). The windows were validated when they were
// made, so every number is one the script accepts.
func appendLimits(b []byte, ws *ratelimit.Windows) []byte {
	for i := range ws.Len() {
		l := ws.Limit(i)
		b = appendFloat(b, l.Rate)
		b = appendFloat(b, float64(l.Period/time.Millisecond))
		b = appendFloat(b, l.EffectiveCost())
	}
	return b
}

// appendKeySuffix appends what names a decision's value after its key:
// ":<period_ms>" for each window of ws in order, then valueTag. Another
// list of periods (a window added, removed or reordered) names another
// value rather than misreading this one; a changed rate keeps its score.
func appendKeySuffix(b []byte, ws *ratelimit.Windows) []byte {
	for i := range ws.Len() {
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(ws.Limit(i).Period/time.Millisecond), 10)
	}
	return append(b, valueTag...)
}

// evalArgs returns the same command as EVAL with the script's source (the
// batch script's or the lean one's), for the fallback on NOSCRIPT.
func evalArgs(args []any) []any {
	a := append([]any(nil), args...)
	a[0], a[1] = argEval, sourceOf(args[1])
	return a
}

// sourceOf returns the source of the script whose SHA is sha.
func sourceOf(sha any) any {
	switch sha {
	case argSHA1:
		return argSource1
	case argSHAX:
		return argSourceX
	}
	return argSource
}

// newCmd returns the script call for args; the cluster client routes it
// by its first key (on a cluster, the only key a call declares).
func newCmd(ctx context.Context, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// runLean decides req alone with the lean script (internal/scripts/ewma1.lua; a
// decision of more than two windows with the batch script, see leanArgs):
// no limit list index, the request id after the packed numbers when there
// is one; EVAL on NOSCRIPT (run).
func (s *Store) runLean(ctx context.Context, req *request, cutoff int64) (any, error) {
	reply, err := s.run(ctx, leanArgs(req, cutoff)).Result()
	if err != nil {
		return nil, err // a reply of no use beside an error
	}
	return reply, nil
}

// run sends the script call args (an EVALSHA, or the EVAL evalFirst makes
// of it) as one command, and once more as an EVAL when Redis has lost the
// script (NOSCRIPT), noting in s.known what the answer says of Redis's
// script cache.
func (s *Store) run(ctx context.Context, args []any) *redis.Cmd {
	args = evalFirst(args, &s.known)
	cmd := newCmd(ctx, args)
	_ = s.client.Process(ctx, cmd)
	if isNoScript(cmd.Err()) {
		cmd = newCmd(ctx, evalArgs(args))
		_ = s.client.Process(ctx, cmd)
	}
	learnScript(cmd.Err(), &s.known)
	return cmd
}

// evalFirst turns args (an EVALSHA) into the same EVAL with the script's
// source while known says Redis may not have the scripts cached (see
// Store.known).
func evalFirst(args []any, known *atomic.Bool) []any {
	if known != nil && !known.Load() && args[0] == argEvalSha {
		args[0], args[1] = argEval, sourceOf(args[1])
	}
	return args
}

// learnScript records what a script call's error says of Redis's script
// cache: a NOSCRIPT forgets it, an answer (a script's reply or its error)
// shows it.
func learnScript(err error, known *atomic.Bool) {
	switch {
	case known == nil:
	case isNoScript(err):
		known.Store(false)
	case answered(err) || isLate(err):
		if !known.Load() {
			known.Store(true)
		}
	}
}

// leanArgs returns the EVALSHA of the lean script (internal/scripts/ewma1.lua)
// deciding req alone with the cutoff (unix ms; 0: none): its key, the
// instant, the cutoff, its windows' arguments and its request id if any,
// then 's' if req wants its scores (without it an admission is answered
// with the integer 0 alone: a table and a bulk string less for Redis).
// Two allocations: the argument slice and the packed numbers. The lean
// script decides one or two windows, and the quota's room going with them
// (request.with); a decision of more windows goes alone as the batch
// script deciding one (commandBy), which replies alike.
func leanArgs(req *request, cutoff int64) []any {
	n := req.windows.Len()
	room := req.with
	if n > 2 || req.room != nil || room != nil && room.room == nil {
		reqs := [1]*request{req}
		return commandBy(reqs[:], cutoff)
	}
	b := make([]byte, 0, 32+24*n)
	b = appendFloat(b, float64(req.now))
	b = appendFloat(b, float64(cutoff))
	b = appendLimits(b, req.windows)
	if room != nil {
		// The quota's room, decided with the message (ewma1.lua's KEYS[2]).
		b = appendFloat(b, float64(room.room.Events))
		b = appendFloat(b, float64(room.room.Window.Milliseconds()))
	}
	req.nums = unsafe.String(unsafe.SliceData(b), len(b)) // b is not written again
	args := make([]any, 0, 7+len(req.keys))
	args = append(args, argEvalSha, argSHA1, req.callKeys())
	for i := range req.keys {
		args = append(args, &req.keys[i])
	}
	if room != nil {
		args = append(args, &room.keys[0])
	}
	args = append(args, &req.nums)
	switch {
	case req.scores != nil:
		args = append(args, &req.id, argScores) // "": no request id
	case req.id != "":
		args = append(args, &req.id)
	}
	return args
}

// split hands each request of a call its part of the flat reply (two
// elements each), or the call's error. A reply of the wrong shape
// is an error for every request of the call.
func split(cmd *redis.Cmd, reqs []*request, deliver func(i int, reply any, err error)) {
	reply, err := cmd.Result()
	if _, bare := reply.(int64); err == nil && bare && len(reqs) == 1 {
		deliver(0, reply, nil) // a lean call's bare admission (parseReply)
		return
	}
	if err == nil {
		want := 0
		for _, r := range reqs {
			want += r.entries()
		}
		arr, ok := reply.([]any)
		switch {
		case !ok:
			err = badReply("reply is %T, not an array", reply)
		case len(arr) != want:
			err = badReply("reply has %d elements, want %d", len(arr), want)
		default:
			at := 0
			for i, r := range reqs {
				n := r.entries()
				deliver(i, arr[at:at+n:at+n], nil)
				at += n
			}
			return
		}
	}
	for i := range reqs {
		deliver(i, nil, err)
	}
}

// request builds the key and the id of one decision (see
// internal/scripts/ewma.lua): one allocation for the request and one for its
// strings. The key holds every window:
// "<prefix><key>:<period_ms>…:bin" (appendKeySuffix).
func (s *Store) request(key string, windows *ratelimit.Windows, now time.Time) *request {
	r := &request{windows: windows}
	r.keys = r.keysArr[:1]
	if !now.IsZero() {
		r.now = now.UnixMilli()
	}
	// The key, then the request id, in one string.
	b := make([]byte, 0, len(s.prefix)+len(key)+21*windows.Len()+len(valueTag)+idLen)
	b = append(b, s.prefix...)
	b = append(b, key...)
	b = appendKeySuffix(b, windows)
	end := len(b)
	if !s.lean {
		b = s.appendRequestID(b) // none when the client never resends: "" is none
	}
	all := unsafe.String(unsafe.SliceData(b), len(b)) // b is not written again
	r.keys[0], r.id = all[:end], all[end:]
	return r
}

// entries is how many entries of a call's reply are r's: two per
// decision, its companion's too.
func (r *request) entries() int {
	if r.with != nil {
		return 4
	}
	return 2
}

// callKeys is how many keys r puts in a call: its own and its
// companion's.
func (r *request) callKeys() int {
	if r.with != nil {
		return len(r.keys) + len(r.with.keys)
	}
	return len(r.keys)
}

// roomRequest builds the room check of a message's budgets (see
// ratelimit.Room): key is the quota's key without the store's prefix
// (Quota.Room), and no request id goes with it, since nothing is written.
func (s *Store) roomRequest(key string, room *ratelimit.Room, now time.Time) *request {
	r := &request{room: room}
	r.keys = r.keysArr[:1]
	if !now.IsZero() {
		r.now = now.UnixMilli()
	}
	r.keys[0] = s.prefix + key
	return r
}

// valueTag ends every decision's key name: its value is packed
// (internal/scripts/ewma.lua, "Stored value"), and a value of digits under the name
// without it is never read as a packed one (docs/redis.md).
const valueTag = ":bin"

// idLen is the width of a request id. One width, because the script cuts
// its list of recent ids by length.
const idLen = 16

// appendRequestID appends a fresh request id: the store's 6 hex digits
// and 10 of a counter (2^40 ids before it wraps).
func (s *Store) appendRequestID(b []byte) []byte {
	var id [idLen]byte
	copy(id[:], s.idBase)
	n := s.idSeq.Add(1)
	for i := idLen - 1; i >= 6; i-- {
		id[i] = "0123456789abcdef"[n&15]
		n >>= 4
	}
	return append(b, id[:]...)
}

// maxWaitMs is the longest wait the script reports (2^40 ms, as in ratelimit).
const maxWaitMs = 1 << 40

// parseReply reads one decision's part of the script's reply strictly:
// exactly 2 elements — the wait in milliseconds (0 when admitted, 1…2^40
// when refused), then the decision's scores in a stored value's layout
// (internal/scripts/ewma.lua: 8 bytes of t, then one little-endian double per
// window, then possibly request ids), each finite and non-negative.
// Anything else is a protocol disagreement and an error wrapping both
// errBadReply and ErrUnavailable — never a score of zero. A wait of -1 is
// the script refusing this decision (a malformed stored value): its
// message comes second, and the error is also a refusal
// (isScriptRefusal), since Redis did answer. Every score is checked; they
// are written to scores when it is not nil. The lean script answers an
// admission whose scores were not asked for (scores nil) with the integer
// 0 alone, the batch script with 0, 0; any other integer there, or one
// when scores were asked for, is a bad reply too.
func parseReply(reply any, n int, scores []float64) (ratelimit.Decision, error) {
	if w, ok := reply.(int64); ok {
		// The lean script's admission when the scores were not asked
		// for (leanArgs): 0 alone, and nothing else.
		if w != 0 || scores != nil {
			return ratelimit.Decision{}, badReply("reply is the integer %d", w)
		}
		return ratelimit.Decision{Allowed: true}, nil
	}
	arr, ok := reply.([]any)
	if !ok {
		return ratelimit.Decision{}, badReply("reply is %T, not an array", reply)
	}
	if len(arr) != 2 {
		return ratelimit.Decision{}, badReply("reply has %d elements, want 2", len(arr))
	}
	wait, ok := arr[0].(int64)
	if ok && wait == -1 {
		if msg, ok := arr[1].(string); ok && strings.HasPrefix(msg, refusalPrefix) {
			return ratelimit.Decision{}, fmt.Errorf("%w: %w: %w", ratelimit.ErrUnavailable, errBadReply, refusal(msg))
		}
	}
	if !ok || wait < 0 || wait > maxWaitMs {
		return ratelimit.Decision{}, badReply("wait is %#v", arr[0])
	}
	if w, ok := arr[1].(int64); ok {
		// The batch script's admission when the scores were not asked
		// for (commandOf): 0, 0, and nothing else.
		if w != 0 || wait != 0 || scores != nil {
			return ratelimit.Decision{}, badReply("wait %d, then the integer %d", wait, w)
		}
		return ratelimit.Decision{Allowed: true}, nil
	}
	v, ok := arr[1].(string)
	if !ok || len(v) < 8+8*n {
		return ratelimit.Decision{}, badReply("scores are %#v, not %d packed", arr[1], n)
	}
	for i := range n {
		f := packedFloat(v[8+8*i:])
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return ratelimit.Decision{}, badReply("score %d is %v", i, f)
		}
		if scores != nil {
			scores[i] = f
		}
	}
	return ratelimit.Decision{Allowed: wait == 0, Wait: time.Duration(wait) * time.Millisecond}, nil
}

// packedFloat reads the little-endian double that begins v (len >= 8).
func packedFloat(v string) float64 {
	_ = v[7]
	u := uint64(v[0]) | uint64(v[1])<<8 | uint64(v[2])<<16 | uint64(v[3])<<24 |
		uint64(v[4])<<32 | uint64(v[5])<<40 | uint64(v[6])<<48 | uint64(v[7])<<56
	return math.Float64frombits(u)
}

func badReply(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", ratelimit.ErrUnavailable, errBadReply, fmt.Sprintf(format, args...))
}
