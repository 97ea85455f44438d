package redisstore

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

func itoa(n int64) string                      { return strconv.FormatInt(n, 10) }
func log2(x float64) float64                   { return math.Log2(x) }
func fmtSscan(s string, v ...any) (int, error) { return fmt.Sscan(s, v...) }

// scorer is s as the conformance suite reads a store: its decisions, with
// each window's score after the decision as the script replied it.
func scorer(s *Store) storetest.Scorer {
	return func(ctx context.Context, key string, ws *ratelimit.Windows, now time.Time) (ratelimit.Decision, []float64, error) {
		scores := make([]float64, ws.Len())
		d, err := s.decide(ctx, key, ws, now, scores)
		if err != nil {
			return d, nil, err
		}
		return d, scores, nil
	}
}

// memory is the reference for Agree and the batch test: fresh memory
// stores, one per key (below). Their scores are unreachable outside
// package ratelimit, so they are followed here from their decisions: per
// window, the stored score decayed by
// 2^(-Δt/T) (nothing for time that has not passed), plus the cost when the
// message was admitted, written at the later of now and the last write.
// Each decision is checked against that model — admitted exactly when every
// window's decayed score plus cost is within its rate — and a disagreement
// is an error, so the scores compared are those the memory store holds.
//
// Each key has a memory store of its own: the store's table is bounded and
// two keys that meet in a slot share a budget (by design), which in a
// shared table made the reference refuse a key that Redis rightly
// admitted, once in a while, as a test failure of Redis's.
func memory() storetest.Scorer {
	stores := map[string]*ratelimit.MemoryStore{}
	type window struct {
		score float64
		at    int64
	}
	var mu sync.Mutex
	keys := map[string][]window{}
	return func(ctx context.Context, key string, ws *ratelimit.Windows, now time.Time) (ratelimit.Decision, []float64, error) {
		if now.IsZero() {
			return ratelimit.Decision{}, nil, fmt.Errorf("memory reference: the zero instant is not modelled")
		}
		mu.Lock()
		defer mu.Unlock()
		m := stores[key]
		if m == nil {
			m = ratelimit.NewMemoryStore(2 * ratelimit.MaxWindows) // a key's windows probe past each other
			stores[key] = m
		}
		d, err := m.Decide(ctx, key, ws, now)
		if err != nil {
			return d, nil, err
		}
		n := ws.Len()
		st := keys[key]
		if len(st) != n {
			if st != nil {
				return d, nil, fmt.Errorf("memory reference: key %s decided against %d windows, then %d", key, len(st), n)
			}
			st = make([]window, n)
			keys[key] = st
		}
		t := now.UnixMilli()
		scores := make([]float64, n)
		admits := true
		for i := range n {
			l := ws.Limit(i)
			s := st[i].score
			if dt := t - st[i].at; dt > 0 {
				if x := float64(dt) / float64(l.Period/time.Millisecond); x > 1100 {
					s = 0
				} else {
					s *= math.Exp2(-x)
				}
			}
			scores[i] = s
			if s+l.EffectiveCost() > l.Rate {
				admits = false
			}
		}
		if admits != d.Allowed {
			return d, nil, fmt.Errorf("memory reference: %s against %v at %v: store says allowed=%v, model %v", key, ws, now, d.Allowed, admits)
		}
		if d.Allowed {
			for i := range n {
				scores[i] += ws.Limit(i).EffectiveCost()
				st[i].score = scores[i]
				st[i].at = max(st[i].at, t)
			}
		}
		return d, scores, nil
	}
}

// pack packs numbers as the scripts read them (see appendFloat).
func pack(nums ...float64) []byte {
	var b []byte
	for _, n := range nums {
		b = appendFloat(b, n)
	}
	return b
}

// stored is a decision's stored value (internal/scripts/ewma.lua, "Stored value"):
// write time t (unix ms), the windows' scores, then the request ids.
func stored(t int64, scores []float64, ids ...string) string {
	v := string(pack(append([]float64{float64(t)}, scores...)...))
	for _, id := range ids {
		v += id
	}
	return v
}

// storedScores reads the n scores of a stored value; ok is false when it
// is too short to hold them.
func storedScores(v string, n int) (t int64, scores []float64, ok bool) {
	if len(v) < 8+8*n {
		return 0, nil, false
	}
	for i := range n {
		scores = append(scores, packedFloat(v[8+8*i:]))
	}
	return int64(packedFloat(v)), scores, true
}

// keySuffix is what the store appends to a decision's key for ws.
func keySuffix(ws *ratelimit.Windows) string { return string(appendKeySuffix(nil, ws)) }

// messageKey is the key the gate decides messages of type typ from client
// under ("{client}:message:TYPE").
func messageKey(client, typ string) string { return "{" + client + "}:message:" + typ }

// run decides req alone as one EVALSHA of the batch script, and as EVAL
// (which caches the script again) if Redis answers NOSCRIPT: after a
// restart or SCRIPT FLUSH.
func run(ctx context.Context, c processor, req *request) (any, error) {
	reqs := [1]*request{req}
	args := commandBy(reqs[:], 0)
	cmd := newCmd(ctx, args)
	_ = c.Process(ctx, cmd)
	if isNoScript(cmd.Err()) {
		cmd = newCmd(ctx, evalArgs(args))
		_ = c.Process(ctx, cmd)
	}
	var reply any
	var err error
	split(cmd, reqs[:], func(_ int, r any, e error) { reply, err = r, e })
	return reply, err
}
