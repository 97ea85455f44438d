//go:build !race

// Left out of -race builds with the other end-to-end tests (see e2e_test.go).

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/pgstore"
	"github.com/sluice-relay/sluice/internal/pgtest"
	"github.com/sluice-relay/sluice/internal/redistest"
)

// These tests run several sluice relay processes on one PostgreSQL and one
// Redis, as deploy/compose/scale-out.yml does, and check that the bounds a
// client meets at the upgrade hold across them. Every test client connects
// from 127.0.0.1: one address, one client, whichever instance it reaches.

// scaleOutConfig is a config file for instances that share one store, with
// max_connections cap and the limits far above what the tests send, plus
// extra (more YAML sections).
func scaleOutConfig(t *testing.T, cap int, extra string) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	writeConfig(t, cfg, fmt.Sprintf(`store: {timeout: 5s}
limits:
  connection: [{rate: 100000, period: 1s}]
  max_connections: %d
  message: {EVENT: [{rate: 100000, period: 1s}], REQ: [{rate: 100000, period: 1s}]}
%s`, cap, extra))
	return cfg
}

// dialHeld attempts an upgrade at url. Admitted, the connection stays open
// until the test ends, its frames read and dropped (so that the relay's
// pings are answered); refused, it returns nil with the status and the
// Retry-After header.
func dialHeld(t *testing.T, ctx context.Context, url string) (*websocket.Conn, int, string) {
	t.Helper()
	c, resp, err := websocket.DefaultDialer.DialContext(ctx, url, nil)
	if err != nil {
		if resp == nil {
			t.Fatalf("dial %s: %v", url, err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, resp.StatusCode, resp.Header.Get("Retry-After")
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	}()
	return c, http.StatusSwitchingProtocols, ""
}

// metricSum is the sum of every sample of p's /metrics whose name (before
// its labels) is name; 0 when there is none.
func (p *proc) metricSum(t *testing.T, name string) float64 {
	t.Helper()
	resp := p.get(t, "/metrics")
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for line := range strings.Lines(string(body)) {
		sample, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || (sample != name && !strings.HasPrefix(sample, name+"{")) {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += f
	}
	return sum
}

// storeCalls is how many calls p made of Redis: every one, the limiter's
// and the guard's, is observed in sluice_store_latency_seconds.
func (p *proc) storeCalls(t *testing.T) float64 {
	t.Helper()
	return p.metricSum(t, "sluice_store_latency_seconds_count")
}

// redisCommands is Redis's total_commands_processed, which counts the INFO
// command asking for it.
func redisCommands(t *testing.T, rc *redis.Client) int64 {
	t.Helper()
	info, err := rc.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no total_commands_processed in INFO stats")
	return 0
}

// TestE2EScaleOutCap: one address opening three times max_connections at
// once across three sluice relays on one Redis holds the cap, no more: k =
// 0, as docs/operations.md states while every instance renews in time
// (each upgrade is one atomic script call on the client's key). Each
// refusal is 429 with Retry-After 5. Counted per process, the address
// would hold three times the cap.
func TestE2EScaleOutCap(t *testing.T) {
	pg := pgtest.Start(t)
	rd := redistest.Start(t)
	const cap = 4
	ps := startSharedOn(t, 3, pg.NewDatabase("cap"), rd, scaleOutConfig(t, cap, ""))
	ctx := testCtx(t)
	var mu sync.Mutex
	open, refused := 0, 0
	var wg sync.WaitGroup
	for _, p := range ps {
		for range cap {
			wg.Go(func() {
				c, code, ra := dialHeld(t, ctx, p.url())
				// 5, or what is left of it when refused from the hold-off
				// another refusal on the instance started (a loaded
				// machine may take seconds for 12 dials).
				s, err := strconv.Atoi(ra)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case c != nil:
					open++
				case code == http.StatusTooManyRequests && err == nil && s >= 1 && s <= 5:
					refused++
				default:
					t.Errorf("refused with %d, Retry-After %q; want 429 with at most 5", code, ra)
				}
			})
		}
	}
	wg.Wait()
	gauges := 0.0
	for _, p := range ps {
		gauges += p.metric(t, "sluice_open_connections")
	}
	t.Logf("one address, %d upgrades at once over 3 instances, cap %d: %d held open (%v by the instances' gauges), %d refused",
		3*cap, cap, open, gauges, refused)
	if open != cap || refused != 2*cap {
		t.Fatalf("%d connections held open across 3 instances, %d refused; want the cap %d and %d", open, refused, cap, 2*cap)
	}
	if gauges != cap {
		t.Fatalf("the instances count %v open connections, the client holds %d", gauges, open)
	}
}

// statedLease is the lease docs/operations.md states ("An instance that
// dies stops counting within 20 s of its last renewal").
const statedLease = 20 * time.Second

// TestE2EScaleOutKill: an instance killed with SIGKILL while it holds an
// address's connections (it releases nothing) stops counting against the
// cap once its lease ends: the lease it left in Redis ends at most the
// stated 20 s after the kill, and then the address is admitted again on
// the surviving instances, up to the cap and no further (their own
// connections still count). Without leases the dead instance's count
// would refuse the address until an operator cleared Redis.
func TestE2EScaleOutKill(t *testing.T) {
	pg := pgtest.Start(t)
	rd := redistest.Start(t)
	const cap = 3
	ps := startSharedOn(t, 3, pg.NewDatabase("kill"), rd, scaleOutConfig(t, cap, ""))
	a, b, c := ps[0], ps[1], ps[2]
	ctx := testCtx(t)
	for i := range cap {
		if conn, code, _ := dialHeld(t, ctx, c.url()); conn == nil {
			t.Fatalf("connection %d on C refused (%d) below the cap", i, code)
		}
	}
	if conn, code, ra := dialHeld(t, ctx, a.url()); conn != nil || code != http.StatusTooManyRequests || ra != "5" {
		t.Fatalf("A with the cap held on C: admitted %v, %d, Retry-After %q; want 429 and 5", conn != nil, code, ra)
	}

	rc := redis.NewClient(&redis.Options{Addr: rd.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	const key = "sluice:{127.0.0.1}:conns"
	held, err := rc.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 {
		t.Fatalf("%s holds %v, want C's count alone", key, held)
	}
	c.kill() // SIGKILL: no release, no renewal
	killed, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var leaseEnd time.Time
	for _, v := range held {
		n, end, _ := strings.Cut(v, " ")
		ms, err := strconv.ParseInt(end, 10, 64)
		if n != strconv.Itoa(cap) || err != nil {
			t.Fatalf("C's field %q, want %d and its lease end", v, cap)
		}
		leaseEnd = time.UnixMilli(ms)
	}
	if d := leaseEnd.Sub(killed); d > statedLease {
		t.Fatalf("the killed instance's lease ends %v after the kill, past the stated %v", d, statedLease)
	}

	// Wait for the lease to end and the survivors to admit the address: the
	// stated lease, A's 5 s hold-off after its refusal above, and slack for
	// a loaded machine. A bound on a broken build, not a timing assertion.
	start := time.Now()
	deadline := start.Add(statedLease + time.Minute)
	for {
		conn, code, _ := dialHeld(t, ctx, a.url())
		if conn != nil {
			break
		}
		if code != http.StatusTooManyRequests {
			t.Fatalf("A after the kill: %d, want 429 until C's lease ends", code)
		}
		if time.Now().After(deadline) {
			t.Fatalf("A still refuses the address %v after C was killed (its lease ended %v after the kill)", time.Since(start), leaseEnd.Sub(killed))
		}
		time.Sleep(250 * time.Millisecond) // polling a real process, bounded by the deadline
	}
	t.Logf("killed instance held %d connections; its lease ended %v after the kill (stated bound %v); A admitted the address again %v after it",
		cap, leaseEnd.Sub(killed).Round(time.Millisecond), statedLease, time.Since(start).Round(100*time.Millisecond))
	open := 1
	for _, p := range []*proc{b, a} {
		for open < cap {
			conn, code, _ := dialHeld(t, ctx, p.url())
			if conn == nil {
				t.Fatalf("refused %d on a survivor with %d of %d open", code, open, cap)
			}
			open++
		}
	}
	for _, p := range []*proc{a, b} {
		if conn, code, _ := dialHeld(t, ctx, p.url()); conn != nil || code != http.StatusTooManyRequests {
			t.Fatalf("past the cap on the survivors: admitted %v, %d", conn != nil, code)
		}
	}
}

// TestE2EScaleOutBan: with the penalty box on, a client whose invalid
// frames on A reach the threshold is banned on every instance: each
// refuses its upgrade with 429 and a Retry-After of the ban's remaining
// time, the same on all three within a second; once an instance has
// refused it, its further upgrades there cost no store call (the
// instance's own count and Redis's), and the ban is logged once, by A,
// and listed at /top by every instance that refused it. A ban kept per
// process would admit the client on B and C; one not cached would cost a
// Redis call per upgrade.
func TestE2EScaleOutBan(t *testing.T) {
	pg := pgtest.Start(t)
	rd := redistest.Start(t)
	ps := startSharedOn(t, 3, pg.NewDatabase("ban"), rd,
		scaleOutConfig(t, 8, "penalty: {enabled: true, threshold: 1, ban: 1m}\n"))
	ctx := testCtx(t)
	// The peer of a banned upgrade's cost: an admitted one's.
	admitCalls := ps[0].storeCalls(t)
	c := dialRaw(t, ctx, ps[0].url())
	c.challenge()
	admitCalls = ps[0].storeCalls(t) - admitCalls
	// Eight invalid frames (0.125 points each) make the threshold's point.
	for range 8 {
		if err := c.c.WriteMessage(websocket.TextMessage, []byte(`["EVENT",{}]`)); err != nil {
			break
		}
	}
	_ = c.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var closeErr error
	for closeErr == nil {
		_, _, closeErr = c.c.ReadMessage()
	}
	if ce, ok := closeErr.(*websocket.CloseError); !ok || !strings.Contains(ce.Text, "banned") {
		t.Fatalf("the violating connection ended with %v, want a close telling the ban", closeErr)
	}
	// A gives the connection's place back (a store call) before its gauge
	// drops: wait for that, so that what A is asked next is all counted.
	for deadline := time.Now().Add(time.Minute); ps[0].metric(t, "sluice_open_connections") != 0; {
		if time.Now().After(deadline) {
			t.Fatal("A still counts the banned connection open a minute after closing it")
		}
		time.Sleep(50 * time.Millisecond) // polling a real process, bounded by the deadline
	}

	// Each refusal's Retry-After, read from when its upgrade was sent and
	// when it was answered, says when the ban ends: no earlier than the
	// answer plus it, and (rounded up to whole seconds) less than a second
	// after the sending plus it. Every instance telling the same end
	// within a second keeps the latest such "sent + Retry-After" within a
	// second of the earliest "answered + Retry-After", however long the
	// upgrades took on a loaded machine; the slack is for an instance
	// that learnt the ban a round trip after Redis stated it.
	const slack = 250 * time.Millisecond
	var waits []int
	var latestEnd, earliestEnd time.Time
	perRound := make([][]float64, 3)
	for round := range 3 {
		for i, p := range ps {
			before := p.storeCalls(t)
			sent := time.Now()
			conn, code, ra := dialHeld(t, ctx, p.url())
			answered := time.Now()
			if conn != nil || code != http.StatusTooManyRequests {
				t.Fatalf("instance %d admitted a banned client (%d)", i, code)
			}
			s, err := strconv.Atoi(ra)
			if err != nil || s < 1 || s > 60 {
				t.Fatalf("instance %d: Retry-After %q, want what is left of the 60 s ban", i, ra)
			}
			waits = append(waits, s)
			wait := time.Duration(s) * time.Second
			if end := sent.Add(wait); end.After(latestEnd) {
				latestEnd = end
			}
			if end := answered.Add(wait); earliestEnd.IsZero() || end.Before(earliestEnd) {
				earliestEnd = end
			}
			calls := p.storeCalls(t) - before
			perRound[round] = append(perRound[round], calls)
			// A started the ban and knows it; B and C ask Redis once
			// (the connection limit's decision, and the guard's, which
			// tells the ban).
			if (round > 0 || i == 0) && calls != 0 {
				t.Fatalf("instance %d, round %d: a banned client's upgrade cost %v store calls", i, round, calls)
			}
		}
	}
	lo, hi := waits[0], waits[0]
	for _, w := range waits {
		lo, hi = min(lo, w), max(hi, w)
	}
	if d := latestEnd.Sub(earliestEnd); d > time.Second+slack {
		t.Fatalf("Retry-After across instances %v: the ban ends they state are %v apart, want within 1 s", waits, d)
	}

	rc := redis.NewClient(&redis.Options{Addr: rd.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	const more = 30
	callsBefore := 0.0
	for _, p := range ps {
		callsBefore += p.storeCalls(t)
	}
	before := redisCommands(t, rc)
	for i := range more {
		if conn, _, _ := dialHeld(t, ctx, ps[i%3].url()); conn != nil {
			t.Fatal("a banned client admitted")
		}
	}
	commands := redisCommands(t, rc) - before - 1 // the INFO itself
	callsAfter := 0.0
	for _, p := range ps {
		callsAfter += p.storeCalls(t)
	}
	t.Logf("an admitted upgrade: %v store calls; banned upgrades: Retry-After on 3 instances over 3 rounds: %v (spread %d s; "+
		"the ends they state within %v); store calls per instance per round: %v; %d more banned upgrades: %v store calls by the instances, %d Redis commands",
		admitCalls, waits, hi-lo, latestEnd.Sub(earliestEnd).Round(time.Millisecond), perRound, more, callsAfter-callsBefore, commands)
	if commands != 0 || callsAfter != callsBefore {
		t.Fatalf("%d banned upgrades cost %v store calls, Redis %d commands; want none", more, callsAfter-callsBefore, commands)
	}

	lines := 0
	for i, p := range ps {
		for line := range strings.Lines(p.logs()) {
			var rec struct{ Msg, Key string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "banned" {
				lines++
				if i != 0 || rec.Key != "127.0.0.1" {
					t.Errorf("instance %d logged the ban of %q: %s", i, rec.Key, line)
				}
			}
		}
	}
	if lines != 1 {
		t.Errorf("the ban logged %d times across the instances, want once", lines)
	}
	for i, p := range ps {
		resp := p.get(t, "/top")
		var top struct{ Bans []Ban }
		err := json.NewDecoder(resp.Body).Decode(&top)
		resp.Body.Close()
		if err != nil || len(top.Bans) != 1 || top.Bans[0].Key != "127.0.0.1" || top.Bans[0].RetryAfter < int64(lo)-1 {
			t.Errorf("instance %d's /top lists bans %+v (%v), want the client's", i, top.Bans, err)
		}
	}
}

// TestE2ESharedExpired: NIP-40 across instances on one PostgreSQL. An
// event expired on arrival is refused by every instance; one expired
// already in the shared store, and one accepted through A that has
// expired since, are neither served nor counted by any instance, and the
// latter sent again to B is refused. Without the guard an instance on
// PostgreSQL would serve an expired event until some instance's
// expiration manager deleted it (khatru's first pass is an hour after its
// start); without the expiry in the count's statement, an instance would
// count the expired events it had not met.
func TestE2ESharedExpired(t *testing.T) {
	pg := pgtest.Start(t)
	url := pg.NewDatabase("expired")
	sk, pk := newKey(t)
	now := nostr.Now()
	old := signedEvent(t, sk, nostr.Event{Kind: 1, CreatedAt: now - 100, Content: "expired in the store",
		Tags: nostr.Tags{{"expiration", fmt.Sprint(now - 50)}}})
	db, err := pgstore.Open(url, pgstore.Limits{MaxLimit: maxQueryLimit})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.SaveEvent(context.Background(), &old); err != nil {
		t.Fatal(err)
	}
	db.Close()

	ps := startShared(t, 3, url)
	ctx := testCtx(t)
	for i, p := range ps {
		c := dialRaw(t, ctx, p.url())
		c.challenge()
		stale := signedEvent(t, sk, nostr.Event{Kind: 1, CreatedAt: nostr.Now() - 10, Content: fmt.Sprintf("expired on arrival at %d", i),
			Tags: nostr.Tags{{"expiration", fmt.Sprint(nostr.Now() - 1)}}})
		if ok, reason := c.publish(stale); ok || reason != "invalid: this event has expired" {
			t.Fatalf("instance %d, expired on arrival: %v %q", i, ok, reason)
		}
	}
	exp := nostr.Now() + 3
	soon := signedEvent(t, sk, nostr.Event{Kind: 1, CreatedAt: nostr.Now(), Content: "expires in seconds",
		Tags: nostr.Tags{{"expiration", fmt.Sprint(exp)}}})
	c := dialRaw(t, ctx, ps[0].url())
	c.challenge()
	if ok, reason := c.publish(soon); !ok {
		t.Fatalf("an event expiring in 3 s refused on A: %q", reason)
	}
	// NIP-40 is about the wall clock: wait until it has passed the
	// expiration, by a second for the rounding of created_at-style times.
	time.Sleep(time.Until(time.Unix(int64(exp)+1, 0)))
	// Counted first: a query that meets an expired event teaches the
	// instance its expiration, which a COUNT must not depend on.
	for i, p := range ps {
		r := connect(t, ctx, p.url())
		for _, f := range []nostr.Filter{{IDs: []string{old.ID, soon.ID}}, {Authors: []string{pk}}} {
			if n := count(t, r, f); n != 0 {
				t.Fatalf("instance %d, %v: counted %d", i, f, n)
			}
			if got := query(t, r, f); len(got) != 0 {
				t.Fatalf("instance %d, %v: served %v", i, f, got)
			}
		}
	}
	b := dialRaw(t, ctx, ps[1].url())
	b.challenge()
	if ok, reason := b.publish(soon); ok || reason != "invalid: this event has expired" {
		t.Fatalf("expired since, sent again to B: %v %q", ok, reason)
	}
}
