package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/scripts"
	"github.com/sluice-relay/sluice/ratelimit"
)

// guardScript is shared by every guard: the SHA is a property of the source.
var guardScript = redis.NewScript(scripts.Guard)

// defaultLease is a guard's lease when NewGuard is given 0: an instance
// that dies stops counting against its clients' caps at most this long
// after its last renewal.
const defaultLease = 20 * time.Second

// guardStripes is the number of locks that serialize one client's calls on
// one instance (a client hashes to one); each stripe holds its clients'
// counts.
const guardStripes = 64

// NewGuard returns the Guard of one gate instance on s's Redis (its client,
// key prefix and deadline): a client's open connections counted across
// every instance sharing that Redis, and the penalty box's records, both
// on Redis TIME (internal/scripts/guard.lua).
//
// Each instance holds a lease on its count of each client's connections,
// renewed for all its clients together, in one pipelined round trip every
// quarter lease (0 means 20 s; at least a second): an instance
// that dies (killed, cut off from Redis) stops counting once its lease
// ends, and one cut off for longer than a lease is counted again from its
// next renewal. A Hold is one round trip (with the checks of the client's
// aggregates pipelined in it); nothing is sent per frame. A Release sends
// nothing itself: the releases made meanwhile go together in one pipelined
// round trip sent in the background as soon as the one before it is
// answered (a client whose call is under way waits for the next), and a
// client's release not yet sent goes in its next Hold here (which sends
// the client's count). So another instance counts a closed
// connection until that round trip lands (the same instance never does).
// An instance sends the absolute count of a client in each call and
// serializes one client's calls, so a lost reply or a failed release is
// healed by the next call or renewal; the cap can be passed only by a
// renewal that overwrites a Hold another call of the same client made in
// between, which the serialization rules out: k is 0 while every instance
// renews in time, and otherwise the counts of the instances whose leases
// ran out while they lived.
//
// Close sends the releases not yet sent and stops the renewals
// (connections still open stop counting when the lease ends). The guard
// needs a client
// that pipelines (every go-redis UniversalClient does).
func NewGuard(s *Store, lease time.Duration) (ratelimit.Guard, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil store", errConfig)
	}
	pl, ok := s.client.(interface{ Pipeline() redis.Pipeliner })
	if !ok {
		return nil, fmt.Errorf("%w: the guard needs a client that pipelines", errConfig)
	}
	switch {
	case lease == 0:
		lease = defaultLease
	case lease < time.Second || lease%time.Millisecond != 0:
		return nil, fmt.Errorf("%w: lease %v must be at least 1s in whole milliseconds", errConfig, lease)
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	g := &guard{
		s:     s,
		pipe:  pl.Pipeline,
		inst:  hex.EncodeToString(id[:]),
		lease: strconv.FormatInt(lease.Milliseconds(), 10),
		every: lease / 4,
		seed:  maphash.MakeSeed(),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		kick:  make(chan struct{}, 1),
	}
	for i := range g.held {
		g.held[i] = make(map[string]int)
		g.unsent[i] = make(map[string]struct{})
	}
	go g.renewEvery()
	return g, nil
}

type guard struct {
	s     *Store
	pipe  func() redis.Pipeliner
	inst  string // this instance's field in every client's hash
	lease string // ms
	every time.Duration
	seed  maphash.Seed

	// locks[i] serializes the calls for the clients of stripe i and
	// guards held[i], their counts on this instance, and unsent[i], those
	// of them whose count Redis has not been sent since a Release.
	locks  [guardStripes]sync.Mutex
	held   [guardStripes]map[string]int
	unsent [guardStripes]map[string]struct{}

	// kick wakes the loop of renewEvery to send the releases (cap 1).
	kick       chan struct{}
	stop, done chan struct{}
	closeOnce  sync.Once
}

func (g *guard) stripe(client string) int {
	return int(maphash.String(g.seed, client) % guardStripes)
}

func (g *guard) connsKey(client string) string { return g.s.prefix + "{" + client + "}:conns" }
func (g *guard) penKey(key string) string      { return g.s.prefix + "{" + key + "}:pen" }

func (g *guard) Hold(ctx context.Context, client string, aggs []string, maxConns int) (time.Duration, bool, error) {
	i := g.stripe(client)
	g.locks[i].Lock()
	defer g.unlock(i)
	n := g.held[i][client] + 1
	calls := make([]guardCall, 1, 1+len(aggs))
	if maxConns > 0 {
		calls[0] = guardCall{keys: []string{g.connsKey(client), g.penKey(client)}, args: []any{"h", 0, g.inst, n, maxConns, g.lease}}
	} else {
		// No cap: nothing to count, only the ban to check.
		calls[0] = guardCall{keys: []string{g.penKey(client)}, args: []any{"b", 0}}
	}
	for _, a := range aggs {
		calls = append(calls, guardCall{keys: []string{g.penKey(a)}, args: []any{"b", 0}})
	}
	if err := g.run(ctx, calls); err != nil {
		// Redis may have counted it and its reply been lost: the client's
		// count goes again with the next releases or renewal.
		g.unsent[i][client] = struct{}{}
		return 0, false, err
	}
	code, wait := calls[0].code, calls[0].wait
	if code == 2 {
		return wait, false, nil
	}
	var aggWait time.Duration
	for _, c := range calls[1:] {
		if c.code == 2 {
			aggWait = max(aggWait, c.wait)
		}
	}
	if code == 0 && maxConns <= 0 {
		return aggWait, aggWait == 0, nil
	}
	if code == 1 {
		// The count sent is the client's: a release not yet sent went in it.
		delete(g.unsent[i], client)
		if aggWait > 0 {
			// Counted before its aggregate's ban was seen (one round
			// trip for both): taken back.
			if g.run(ctx, []guardCall{g.setCall(client, n-1)}) != nil {
				g.unsent[i][client] = struct{}{}
			}
			return aggWait, false, nil
		}
		g.held[i][client] = n
		return 0, true, nil
	}
	return aggWait, false, nil
}

func (g *guard) setCall(client string, n int) guardCall {
	return guardCall{keys: []string{g.connsKey(client)}, args: []any{"s", 0, g.inst, n, g.lease}}
}

func (g *guard) Release(client string) {
	i := g.stripe(client)
	g.locks[i].Lock()
	n, ok := g.held[i][client]
	if !ok {
		g.locks[i].Unlock()
		return
	}
	if n--; n <= 0 {
		delete(g.held[i], client)
	} else {
		g.held[i][client] = n
	}
	g.unsent[i][client] = struct{}{}
	g.unlock(i)
}

// unlock releases stripe i, and has its releases sent when it has some:
// sendReleases leaves a stripe whose call is under way for its caller to
// hand over here.
func (g *guard) unlock(i int) {
	due := len(g.unsent[i]) > 0
	g.locks[i].Unlock()
	if due {
		select {
		case g.kick <- struct{}{}:
		default: // a send is due already
		}
	}
}

// sendReleases sends the count of every client released since its count
// was last sent, in one pipelined round trip; those clients' calls wait
// for it. A stripe with a call under way (its lock taken) is left to the
// next send, which its call asks for as it ends (unlock), so that a slow
// call holds up no other stripe. A failure is healed by the next renewal,
// or, for a client this instance no longer holds, by the end of the lease.
func (g *guard) sendReleases() {
	var locked []int
	var calls []guardCall
	for i := range g.locks {
		if !g.locks[i].TryLock() {
			continue
		}
		if len(g.unsent[i]) == 0 {
			g.locks[i].Unlock()
			continue
		}
		locked = append(locked, i)
		for client := range g.unsent[i] {
			calls = append(calls, g.setCall(client, g.held[i][client]))
		}
		clear(g.unsent[i])
	}
	defer func() {
		for _, i := range locked {
			g.locks[i].Unlock()
		}
	}()
	if len(calls) > 0 {
		_ = g.run(context.Background(), calls)
	}
}

func (g *guard) Violate(ctx context.Context, keys []string, points float64, p ratelimit.Penalty) (string, time.Duration, bool, error) {
	p = p.WithDefaults()
	calls := make([]guardCall, len(keys))
	for i, k := range keys {
		calls[i] = guardCall{keys: []string{g.penKey(k)}, args: []any{"v", 0,
			strconv.FormatFloat(points, 'g', -1, 64), strconv.FormatFloat(p.Threshold, 'g', -1, 64),
			p.HalfLife.Milliseconds(), p.Ban.Milliseconds(), p.MaxBan.Milliseconds(), ratelimit.PenaltyMemory.Milliseconds()}}
	}
	if err := g.run(ctx, calls); err != nil {
		return "", 0, false, err
	}
	banned, wait, started := "", time.Duration(0), false
	for i, c := range calls {
		if c.code != 0 && c.wait > wait {
			banned, wait, started = keys[i], c.wait, c.code == 1
		}
	}
	return banned, wait, started, nil
}

// renewEvery renews this instance's leases every quarter lease, and sends
// the releases when kicked, until Close.
func (g *guard) renewEvery() {
	defer close(g.done)
	t := time.NewTicker(g.every)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			g.sendReleases()
			return
		case <-g.kick:
			g.sendReleases()
		case <-t.C:
			_ = g.renew()
		}
	}
}

// renew sets this instance's count of every client it holds connections
// of, renewing its leases, in one pipelined round trip; the client's calls
// wait for it (the counts it sends must be the last word).
func (g *guard) renew() error {
	for i := range g.locks {
		g.locks[i].Lock()
	}
	defer func() {
		for i := range g.locks {
			g.locks[i].Unlock()
		}
	}()
	var calls []guardCall
	for i := range g.held {
		for client, n := range g.held[i] {
			calls = append(calls, g.setCall(client, n))
		}
		for client := range g.unsent[i] {
			if _, held := g.held[i][client]; !held {
				calls = append(calls, g.setCall(client, 0))
			}
		}
		clear(g.unsent[i])
	}
	if len(calls) == 0 {
		return nil
	}
	// A renewal may be large: it has a quarter lease, the time until the
	// next, rather than one decision's deadline.
	ctx, cancel := context.WithTimeout(context.Background(), g.every)
	defer cancel()
	return g.runWithin(ctx, calls)
}

func (g *guard) Close() error {
	g.closeOnce.Do(func() { close(g.stop) })
	<-g.done
	return nil
}

// guardCall is one script call and, once run, its reply.
type guardCall struct {
	keys []string
	args []any
	code int64
	wait time.Duration
}

// run runs calls in one pipelined round trip within the store's deadline.
func (g *guard) run(ctx context.Context, calls []guardCall) error {
	if g.s.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.s.timeout)
		defer cancel()
	}
	return g.runWithin(ctx, calls)
}

// runWithin runs calls in one pipelined round trip (EVALSHA, then EVAL for
// the calls Redis answered NOSCRIPT) and reads their replies. An error
// wraps ratelimit.ErrUnavailable.
func (g *guard) runWithin(ctx context.Context, calls []guardCall) error {
	if g.s.closed.Load() {
		return errClosedRefused
	}
	start := time.Now()
	cmds := make([]*redis.Cmd, len(calls))
	p := g.pipe()
	for i, c := range calls {
		cmds[i] = p.EvalSha(ctx, guardScript.Hash(), c.keys, c.args...)
	}
	_, _ = p.Exec(ctx)
	var again []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		p = g.pipe()
		for _, i := range again {
			cmds[i] = p.Eval(ctx, scripts.Guard, calls[i].keys, calls[i].args...)
		}
		_, _ = p.Exec(ctx)
	}
	var err error
	for i, cmd := range cmds {
		if err = cmd.Err(); err != nil {
			break
		}
		r, ok := cmd.Val().([]any)
		if !ok || len(r) != 3 {
			err = badReply("guard: reply %v", cmd.Val())
			break
		}
		code, ok1 := r[0].(int64)
		wait, ok2 := r[1].(int64)
		if !ok1 || !ok2 || code < 0 || code > 2 || wait < 0 {
			err = badReply("guard: reply %v", cmd.Val())
			break
		}
		calls[i].code, calls[i].wait = code, time.Duration(wait)*time.Millisecond
	}
	if g.s.observe != nil {
		g.s.observe(time.Since(start), err)
	}
	if err != nil && !errors.Is(err, ratelimit.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
	}
	return err
}
