package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

func newGuard(tb testing.TB, s *Store, lease time.Duration) ratelimit.Guard {
	tb.Helper()
	g, err := NewGuard(s, lease)
	if err != nil {
		tb.Fatalf("NewGuard: %v", err)
	}
	tb.Cleanup(func() { _ = g.Close() })
	return g
}

// TestGuardCapAcrossInstances: three instances on one Redis, each asked
// for the cap of one client's connections at once, hold the cap between
// them, never more; a Release frees a place for any instance.
func TestGuardCapAcrossInstances(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, Options{Timeout: time.Second})
	const cap = 8
	gs := []ratelimit.Guard{newGuard(t, s, 0), newGuard(t, s, 0), newGuard(t, s, 0)}
	ctx := context.Background()
	var mu sync.Mutex
	held := map[int]int{}
	var wg sync.WaitGroup
	for i, g := range gs {
		for range cap {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, ok, err := g.Hold(ctx, "203.0.113.7", nil, cap)
				if err != nil {
					t.Error(err)
				}
				if ok {
					mu.Lock()
					held[i]++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	total := held[0] + held[1] + held[2]
	t.Logf("held per instance %v, %d of %d asked, cap %d", held, total, 3*cap, cap)
	if total != cap {
		t.Fatalf("held %d connections across 3 instances, want the cap %d", total, cap)
	}
	if _, ok, _ := gs[0].Hold(ctx, "203.0.113.7", nil, cap); ok {
		t.Fatal("a Hold past the cap admitted")
	}
	var from int
	for i := range gs {
		if held[i] > 0 {
			from = i
			break
		}
	}
	gs[from].Release("203.0.113.7")
	// The release is sent in the background: another instance admits once
	// it has landed.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		_, ok, err := gs[(from+1)%3].Hold(ctx, "203.0.113.7", nil, cap)
		if ok {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("after a Release on another instance: admitted %v, %v", ok, err)
		}
	}
}

// TestGuardReleasesTogether: releases wait for no round trip of their own.
// Fifty clients' releases made at once reach Redis in a few pipelined
// round trips, not one each; and a client's release not yet sent goes in
// its next Hold on the same instance, which is admitted at once.
func TestGuardReleasesTogether(t *testing.T) {
	_, c := realRedis(t)
	var trips atomic.Int64
	s := newStore(t, c, Options{Timeout: time.Second, Observe: func(time.Duration, error) { trips.Add(1) }})
	a := newGuard(t, s, 0)
	ctx := context.Background()
	var clients []string
	for i := range 50 {
		cl := "192.0.2." + strconv.Itoa(i)
		clients = append(clients, cl)
		if _, ok, err := a.Hold(ctx, cl, nil, 1); !ok || err != nil {
			t.Fatalf("%s: %v %v", cl, ok, err)
		}
	}
	before := trips.Load()
	for _, cl := range clients {
		a.Release(cl)
	}
	for _, cl := range clients {
		key := a.(*guard).connsKey(cl)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			n, err := c.Exists(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: released, still counted in Redis", cl)
			}
		}
	}
	releases := trips.Load() - before
	t.Logf("50 releases in %d round trips", releases)
	// Sent one by one, they take 50; together, one or two here. The bound
	// leaves room for a loaded machine that runs the sender between most
	// of the releases.
	if releases > 40 {
		t.Errorf("50 releases took %d round trips: sent one by one", releases)
	}
	// A Hold right after a Release, on the same instance, is admitted
	// whether or not the release was sent.
	for range 20 {
		a.Release(clients[0])
		if _, ok, err := a.Hold(ctx, clients[0], nil, 1); !ok || err != nil {
			t.Fatalf("a Hold after a Release on the same instance: %v %v", ok, err)
		}
	}
}

// TestGuardDeadInstanceFreed: an instance that stops renewing (killed: it
// closes nothing) stops counting once its lease ends, while the instances
// that renew keep theirs.
func TestGuardDeadInstanceFreed(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, Options{Timeout: time.Second})
	const lease = 2 * time.Second
	alive, dead := newGuard(t, s, lease), newGuard(t, s, lease)
	ctx := context.Background()
	for range 2 {
		if _, ok, err := alive.Hold(ctx, "198.51.100.1", nil, 4); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if _, ok, err := dead.Hold(ctx, "198.51.100.1", nil, 4); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if _, ok, _ := alive.Hold(ctx, "198.51.100.1", nil, 4); ok {
		t.Fatal("admitted past the cap")
	}
	_ = dead.Close() // its renewals stop; its two connections are never released
	killed := time.Now()
	deadline := killed.Add(5 * lease)
	for {
		_, ok, err := alive.Hold(ctx, "198.51.100.1", nil, 4)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead instance's connections still counted %v after it stopped renewing", 5*lease)
		}
		time.Sleep(50 * time.Millisecond) // waiting for the lease to end, with a deadline
	}
	t.Logf("freed %v after the last renewal could have been (lease %v)", time.Since(killed).Round(10*time.Millisecond), lease)
	// The live instance's two (renewed past the lease) and the new one
	// count: one more place, then the cap.
	if _, ok, _ := alive.Hold(ctx, "198.51.100.1", nil, 4); !ok {
		t.Fatal("the fourth place not free")
	}
	if _, ok, _ := alive.Hold(ctx, "198.51.100.1", nil, 4); ok {
		t.Fatal("the live instance's connections were freed with the dead one's")
	}
}

// TestGuardPenaltyEscalates: points add up to a ban at the threshold, the
// ban is seen by every instance's Hold with the same remaining time, and
// each next ban doubles up to MaxBan.
func TestGuardPenaltyEscalates(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, Options{Timeout: time.Second})
	a, b := newGuard(t, s, 0), newGuard(t, s, 0)
	ctx := context.Background()
	p := ratelimit.Penalty{Threshold: 2, HalfLife: time.Hour, Ban: time.Minute, MaxBan: 3 * time.Minute}
	keys := []string{"192.0.2.9", "192.0.2.0/24"}
	endBan := func() {
		for _, k := range keys {
			if err := c.HSet(ctx, "sluice:{"+k+"}:pen", "u", "1").Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 3 * time.Minute, 3 * time.Minute}
	for i, w := range want {
		if banned, _, _, err := a.Violate(ctx, keys, 1, p); err != nil || banned != "" {
			t.Fatalf("ban %d: one point banned %q, %v", i, banned, err)
		}
		banned, wait, started, err := b.Violate(ctx, keys, 1, p)
		if err != nil || banned == "" || !started || wait != w {
			t.Fatalf("ban %d: banned %q for %v (started %v), %v; want %v", i, banned, wait, started, err, w)
		}
		if _, wait2, started2, _ := a.Violate(ctx, keys, 1, p); started2 || wait2 > w || wait2 < w-time.Second {
			t.Fatalf("ban %d: a violation while banned: %v started %v", i, wait2, started2)
		}
		for _, g := range []ratelimit.Guard{a, b} {
			hw, ok, err := g.Hold(ctx, "192.0.2.9", nil, 0)
			if ok || err != nil || hw > w || hw < w-time.Second {
				t.Fatalf("ban %d: Hold admitted %v, wait %v, %v", i, ok, hw, err)
			}
		}
		// The aggregate's ban holds out another client of it.
		if hw, ok, _ := a.Hold(ctx, "192.0.2.10", []string{"192.0.2.0/24"}, 0); ok || hw < w-time.Second {
			t.Fatalf("ban %d: a client of the banned aggregate admitted %v, %v", i, ok, hw)
		}
		endBan()
	}
}

// TestGuardStoreDown: a Guard whose Redis is gone fails closed, with an
// error wrapping ratelimit.ErrUnavailable.
func TestGuardStoreDown(t *testing.T) {
	srv, c := realRedis(t)
	s := newStore(t, c, Options{Timeout: 200 * time.Millisecond})
	g := newGuard(t, s, 0)
	srv.Kill()
	_, ok, err := g.Hold(context.Background(), "192.0.2.1", nil, 4)
	if ok || !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("Hold with Redis down: %v, %v", ok, err)
	}
}

// TestGuardNoCapCountsNothing: with no cap a Hold only checks the ban:
// nothing is counted, so nothing is left to release or renew.
func TestGuardNoCapCountsNothing(t *testing.T) {
	_, c := realRedis(t)
	s := newStore(t, c, Options{Timeout: time.Second})
	g := newGuard(t, s, 0)
	ctx := context.Background()
	for range 3 {
		if _, ok, err := g.Hold(ctx, "192.0.2.3", nil, 0); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if n, err := c.Exists(ctx, "sluice:{192.0.2.3}:conns").Result(); err != nil || n != 0 {
		t.Fatalf("with no cap the connections were counted: %d, %v", n, err)
	}
	if held := len(g.(*guard).held[g.(*guard).stripe("192.0.2.3")]); held != 0 {
		t.Fatalf("%d clients held locally", held)
	}
}

// TestGuardCluster: on a Redis Cluster a client's connections and penalty
// record share its slot (one script call), its aggregates' records are on
// other masters, and a Hold, a renewal and a Violate each pipeline their
// calls across them.
func TestGuardCluster(t *testing.T) {
	addrs := startCluster(t)
	c, err := NewClient("redis+cluster://" + strings.Join(addrs, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, Options{Timeout: time.Second})
	a, b := newGuard(t, s, 0), newGuard(t, s, 0)
	ctx := context.Background()
	aggs := []string{"2001:db8::/48", "2001:db8::/32"}
	clients := []string{"2001:db8::/64", "2001:db8:0:1::/64", "2001:db8:0:2::/64", "2001:db8:0:3::/64"}
	for _, cl := range clients {
		for i := range 3 {
			_, ok, err := []ratelimit.Guard{a, b}[i%2].Hold(ctx, cl, aggs, 2)
			if err != nil || ok != (i < 2) {
				t.Fatalf("%s Hold %d: admitted %v, %v", cl, i, ok, err)
			}
		}
	}
	if err := a.(*guard).renew(); err != nil {
		t.Fatalf("renewal across masters: %v", err)
	}
	p := ratelimit.Penalty{Threshold: 1, Ban: time.Minute}
	banned, wait, started, err := b.Violate(ctx, append([]string{clients[0]}, aggs...), 1, p)
	if err != nil || banned == "" || wait != time.Minute || !started {
		t.Fatalf("Violate across masters: %q %v %v %v", banned, wait, started, err)
	}
	// Every client of the banned aggregates is held out.
	for _, cl := range clients[1:] {
		a.Release(cl)
		if w, ok, err := a.Hold(ctx, cl, aggs, 2); ok || err != nil || w < 59*time.Second {
			t.Fatalf("%s of a banned aggregate: admitted %v, %v, %v", cl, ok, w, err)
		}
	}
}
