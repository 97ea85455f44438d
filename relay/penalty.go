package relay

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
)

// This file holds what the gate does at the upgrade beyond the connection
// limit: the per-client connection cap and the penalty box, both kept by
// the Guard (Options.Guard), and the local deny cache that answers a
// client refused at the upgrade without asking the Guard again.

// The points each violation adds to the penalty box (policy.Config.Penalty)
// of the client and its aggregates. A cut for knocking is a whole point;
// the rest are counted here until they make one (see violate), so a flood
// of invalid frames or refused upgrades costs the store one call per point,
// not one per frame or upgrade.
const (
	pointsKnocking = 1.0   // a connection cut for knocking (knockBurst refusals past their wait)
	pointsAuth     = 0.25  // an AUTH refused by the gate's verification, or malformed
	pointsInvalid  = 0.125 // any other frame answered "invalid:"
	pointsUpgrade  = 0.125 // an upgrade refused by the connection limit or the cap
)

// capHoldOff is the Retry-After of an upgrade refused by the connection
// cap, and how long the gate then refuses that client's upgrades from its
// deny cache (without asking the Guard): a cap has no wait of its own (a
// connection closing frees a place at any time), so the gate makes one.
// An upgrade before it is refused, one after it is decided afresh; the
// hold-off ends early when one of the client's connections through this
// gate closes (the place it frees is the client's to take at once).
const capHoldOff = 5 * time.Second

// unavailableRetry is the Retry-After of a 503 (the store cannot decide, or
// the gate is shutting down): a hint, not a promise; an outage that opened
// the store's breaker lasts seconds, and spreading the reconnects of every
// client refused in it keeps them from arriving as one wave.
const unavailableRetry = 5 * time.Second

// denyCacheSize bounds the deny cache, and pendingSize the table of points
// not yet sent to the Guard: one entry per client (or aggregate) refused
// at the upgrade, or with less than a point pending.
const (
	denyCacheSize = 4096
	pendingSize   = 4096
)

// denyCache remembers, per client or aggregate key, until when its upgrades
// are refused: a ban's end (learnt from the Guard, in the store's time as a
// remaining wait) or a cap's hold-off. Bounded: when full, expired entries
// go, then the one ending first. Safe for concurrent use.
type denyCache struct {
	mu sync.Mutex
	m  map[string]denial
}

type denial struct {
	until time.Time // the gate's clock
	ban   bool      // a ban's, not a cap's hold-off
}

// get returns the longest denial of keys at now.
func (d *denyCache) get(now time.Time, keys ...string) (denial, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out denial
	for _, k := range keys {
		if e, ok := d.m[k]; ok {
			if !now.Before(e.until) {
				delete(d.m, k)
				continue
			}
			if e.until.After(out.until) {
				out = e
			}
		}
	}
	return out, !out.until.IsZero()
}

func (d *denyCache) put(now time.Time, key string, e denial) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = make(map[string]denial)
	}
	if old, ok := d.m[key]; ok && old.until.After(e.until) {
		return
	}
	if _, ok := d.m[key]; !ok && len(d.m) >= denyCacheSize {
		first := ""
		for k, x := range d.m {
			if !now.Before(x.until) {
				delete(d.m, k)
			} else if first == "" || x.until.Before(d.m[first].until) {
				first = k
			}
		}
		if len(d.m) >= denyCacheSize {
			delete(d.m, first)
		}
	}
	d.m[key] = e
}

// lift drops key's hold-off of the cap (not a ban): one of its
// connections has closed, so a place is free.
func (d *denyCache) lift(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.m[key]; ok && !e.ban {
		delete(d.m, key)
	}
}

// pendingPoints holds, per client, the points of violations not yet sent
// to the Guard (less than one). Safe for concurrent use.
type pendingPoints struct {
	mu sync.Mutex
	m  map[string]float64
}

// add adds points to key's and returns what is to be sent now: the total
// once it makes a point (or when the table is full), else 0.
func (p *pendingPoints) add(key string, points float64) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[string]float64)
	}
	sum := p.m[key] + points
	if sum >= 1 || (len(p.m) >= pendingSize && p.m[key] == 0) {
		delete(p.m, key)
		return sum
	}
	p.m[key] = sum
	return 0
}

// refuseDenied answers an upgrade from a client its deny cache refuses (a
// ban, or the cap's hold-off), and reports whether it did. It costs no
// store call.
func (g *Gate) refuseDenied(w http.ResponseWriter, client, addr string, aggs []string) bool {
	now := g.now()
	keys := append(make([]string, 0, 1+len(aggs)), client)
	e, ok := g.deny.get(now, append(keys, aggs...)...)
	if !ok {
		return false
	}
	wait := e.until.Sub(now)
	if e.ban {
		g.obs.ReportConnection(client, policy.RateLimited)
		refuseBanned(w, wait)
		return true
	}
	g.obs.ReportConnection(client, policy.OverCap)
	g.violate(context.Background(), client, addr, aggs, pointsUpgrade)
	g.refuseOverCapUpgrade(w, wait)
	return true
}

// refuseRateUpgrade answers an upgrade refused by the connection budget:
// 429 with the wait, and a violation (reconnecting while told to wait).
func (g *Gate) refuseRateUpgrade(ctx context.Context, w http.ResponseWriter, client, addr string, aggs []string, wait time.Duration) {
	g.obs.ReportConnection(client, policy.RateLimited)
	w.Header().Set("Retry-After", strconv.FormatInt(scan.RetrySeconds(wait), 10))
	http.Error(w, scan.RateLimitedReason(wait), http.StatusTooManyRequests)
	g.violate(ctx, client, addr, aggs, pointsUpgrade)
}

// refuseBanned answers an upgrade from a banned client: 429 with the ban's
// remaining time.
func refuseBanned(w http.ResponseWriter, wait time.Duration) {
	s := strconv.FormatInt(scan.RetrySeconds(wait), 10)
	w.Header().Set("Retry-After", s)
	http.Error(w, "blocked: banned for repeated violations; retry in "+s+"s", http.StatusTooManyRequests)
}

// refuseOverCapUpgrade answers an upgrade past the connection cap: 429 with
// what is left of the hold-off.
func (g *Gate) refuseOverCapUpgrade(w http.ResponseWriter, wait time.Duration) {
	s := strconv.FormatInt(scan.RetrySeconds(wait), 10)
	w.Header().Set("Retry-After", s)
	http.Error(w, "blocked: too many open connections from your address (at most "+strconv.Itoa(g.connCounts.max)+"); retry in "+s+"s", http.StatusTooManyRequests)
}

// refuseUnavailable answers an upgrade the gate cannot decide: 503 with a
// Retry-After hint.
func refuseUnavailable(w http.ResponseWriter, body string) {
	w.Header().Set("Retry-After", strconv.FormatInt(scan.RetrySeconds(unavailableRetry), 10))
	http.Error(w, body, http.StatusServiceUnavailable)
}

// holdAnswer is what the Guard answered a Hold.
type holdAnswer struct {
	wait time.Duration
	ok   bool
	err  error
}

// holdAsked is a Hold under way or answered; nil when none was asked.
type holdAsked chan holdAnswer

// needsHold reports whether an upgrade from a client (not allow-listed)
// asks the Guard: for a place under the cap, or whether it is banned.
func (g *Gate) needsHold(gp *gatePolicy) bool { return g.connCounts.max > 0 || gp.penalty != nil }

// askHold starts the Hold of an upgrade of client alongside the decision
// on its connection budget when the Guard is shared (Options.Guard: a
// round trip away), so that the upgrade waits for one round trip, not
// two; it returns nil when there is nothing to ask, or the Guard is this
// process's (answered at once: asked in holdUpgrade). It is asked only of
// an upgrade the limiter's local table did not refuse. A Hold asked this
// way for an upgrade the budget then refuses is given back (dropHold):
// until then an upgrade of the same client may find that place taken and
// be refused for the cap, as when two of its upgrades race for the last
// place.
func (g *Gate) askHold(ctx context.Context, gp *gatePolicy, client string, aggs []string, freeIP bool) holdAsked {
	if freeIP || !g.sharedGuard || !g.needsHold(gp) {
		return nil
	}
	ch := make(holdAsked, 1)
	go func() {
		wait, ok, err := g.guard.Hold(ctx, client, aggs, g.connCounts.max)
		ch <- holdAnswer{wait, ok, err}
	}()
	return ch
}

// dropHold gives back the place a Hold asked by askHold took, once it is
// answered, for an upgrade refused before holdUpgrade; a ban it found is
// remembered as holdUpgrade would.
func (g *Gate) dropHold(client string, asked holdAsked) {
	if asked == nil {
		return
	}
	switch a := <-asked; {
	case a.err != nil:
	case a.ok && g.connCounts.max > 0:
		g.guard.Release(client)
	case !a.ok && a.wait > 0:
		g.learnBan(client, a.wait)
	}
}

// holdUpgrade asks the Guard for a place among client's open connections
// (and whether client or an aggregate of it is banned), or reads its
// answer when askHold asked; it answers the upgrade itself and returns
// false when refused. held reports whether a place was taken (to be given
// back with releaseConn).
func (g *Gate) holdUpgrade(ctx context.Context, w http.ResponseWriter, gp *gatePolicy, client, addr string, aggs []string, asked holdAsked) (held, ok bool) {
	var a holdAnswer
	switch {
	case asked != nil:
		a = <-asked
	case !g.needsHold(gp):
		return false, true
	default:
		a.wait, a.ok, a.err = g.guard.Hold(ctx, client, aggs, g.connCounts.max)
	}
	wait, ok, err := a.wait, a.ok, a.err
	switch {
	case err != nil:
		g.obs.ReportConnection(client, policy.Unavailable)
		refuseUnavailable(w, scan.ReasonUnavailable)
		return false, false
	case ok:
		return g.connCounts.max > 0, true
	case wait > 0:
		g.obs.ReportConnection(client, policy.RateLimited)
		g.learnBan(client, wait)
		refuseBanned(w, wait)
		return false, false
	}
	g.obs.ReportConnection(client, policy.OverCap)
	g.deny.put(g.now(), client, denial{until: g.now().Add(capHoldOff)})
	g.violate(ctx, client, addr, aggs, pointsUpgrade)
	g.refuseOverCapUpgrade(w, capHoldOff)
	return false, false
}

// learnBan puts a ban the Guard reported at an upgrade in the deny cache,
// for the client (its further upgrades cost no store call until it ends),
// and tells the observer.
func (g *Gate) learnBan(client string, wait time.Duration) {
	g.deny.put(g.now(), client, denial{until: g.now().Add(wait), ban: true})
	if g.obs != nil && g.obs.Ban != nil {
		g.obs.Ban(client, wait)
	}
}

// violate counts a violation of points by client (at addr, "" when not
// known; and its aggregates) in the penalty box, when the running policy
// has one, and returns the ban it is under once the points reach the Guard
// and ban it (0: none). A ban this call starts is logged once, in a line
// fail2ban can match (docs/operations.md).
func (g *Gate) violate(ctx context.Context, client, addr string, aggs []string, points float64) time.Duration {
	gp := g.current()
	if gp.penalty == nil {
		return 0
	}
	sum := g.pending.add(client, points)
	if sum == 0 {
		return 0
	}
	keys := append(append(make([]string, 0, 1+len(aggs)), client), aggs...)
	banned, wait, started, err := g.guard.Violate(ctx, keys, sum, *gp.penalty)
	if err != nil || banned == "" {
		return 0
	}
	now := g.now()
	g.deny.put(now, banned, denial{until: now.Add(wait), ban: true})
	if started {
		g.log.Warn("banned", "key", banned, "client", client, "addr", addr, "retry_after", scan.RetrySeconds(wait))
		if g.obs != nil && g.obs.Ban != nil {
			g.obs.Ban(banned, wait)
		}
	}
	return wait
}

// violation counts a violation of points by c's client in the penalty box
// and reports whether the client is now banned; the caller then ends the
// connection with the ban's wait (c.banned).
func (c *conn) violation(points float64) bool {
	addr := ""
	if c.addr.IsValid() {
		addr = c.addr.String()
	}
	c.banned = c.g.violate(c.ctx, c.who, addr, c.aggs, points)
	return c.banned > 0
}

// endBanned ends c, whose client the penalty box has banned, telling it the
// ban's wait.
func (c *conn) endBanned() {
	c.g.cutLog.info(c.g.log, "closing client", "client", c.who, "reason", "banned")
	c.end(true, true, closeSlowClient, "sluice: banned for repeated violations; retry in "+strconv.FormatInt(scan.RetrySeconds(c.banned), 10)+"s")
}
