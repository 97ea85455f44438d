package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/internal/faultproxy"
	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

const ms = int64(time.Millisecond)

// TestStallMeterLost: the heartbeat's arithmetic. A gap between ticks of
// stallTick+stallMin or more is a stall; what a wait since from lost is the
// longest stall's part after from, less the tick it would have waited
// anyway; a stall in progress (the heartbeat late now) counts; a short
// gap, a stall over before the wait began, or no heartbeat at all count
// nothing.
func TestStallMeterLost(t *testing.T) {
	var m stallMeter
	if got := m.lost(0, 500*ms); got != 0 {
		t.Fatalf("no heartbeat: lost %v, want 0", got)
	}
	m.tick(5 * ms)
	if m.last.Load() != 0 {
		t.Fatal("a tick with no Store holding the heartbeat started it")
	}
	m.users = 1
	m.last.Store(1 * ms)
	for _, at := range []int64{11, 21, 46, 171, 181} { // 46: a gap of 25 ms, not a stall; 46→171: one
		m.tick(at * ms)
	}
	cases := []struct {
		from, now int64
		want      time.Duration
	}{
		{from: 1, now: 185, want: 115 * time.Millisecond},   // 171-46-10
		{from: 100, now: 185, want: 61 * time.Millisecond},  // 171-100-10
		{from: 150, now: 185, want: 0},                      // 11 ms of the stall after from: under stallMin
		{from: 172, now: 185, want: 0},                      // over before the wait
		{from: 172, now: 281, want: 90 * time.Millisecond},  // the heartbeat 100 ms late now: 281-181-10
		{from: 200, now: 281, want: 71 * time.Millisecond},  // in progress, from 200
		{from: 200, now: 205, want: 0},                      // the heartbeat on time
		{from: 1, now: 281, want: 115 * time.Millisecond},   // the older stall is the longer
		{from: 1, now: 400, want: 209 * time.Millisecond},   // now the one in progress is
		{from: 46, now: 185, want: 115 * time.Millisecond},  // from its first tick
		{from: 21, now: 185, want: 115 * time.Millisecond},  // the short gap before it adds nothing
		{from: 170, now: 185, want: 0},                      // 1 ms of it
		{from: 141, now: 185, want: 20 * time.Millisecond},  // 30 ms of it, less the tick
		{from: 142, now: 185, want: 0},                      // 29 ms, less the tick: under stallMin
		{from: 1, now: 211, want: 115 * time.Millisecond},   // 30 ms since the last tick: in progress, 20 ms
		{from: 181, now: 211, want: 20 * time.Millisecond},  // that one alone
		{from: 181, now: 210, want: 0},                      // 29 ms: not yet
		{from: 400, now: 401, want: 0},                      // a wait begun 1 ms ago, the heartbeat late since long before
		{from: 250, now: 401, want: 141 * time.Millisecond}, // 401-250-10
	}
	for _, c := range cases {
		if got := m.lost(c.from*ms, c.now*ms); got != c.want {
			t.Errorf("lost(from %d ms, now %d ms) = %v, want %v", c.from, c.now, got, c.want)
		}
	}
	noted := 0
	for _, g := range m.gaps {
		if g.to != 0 {
			noted++
		}
	}
	if noted != 1 {
		t.Errorf("%d stalls noted, want 1", noted)
	}
	// The ring keeps the newest stallKeep.
	for i := range int64(stallKeep) {
		m.tick(m.last.Load() + 50*ms + i*ms)
	}
	if got := m.lost(1, m.last.Load()); got != time.Duration(50+stallKeep-1-10)*time.Millisecond {
		t.Errorf("after %d more stalls: lost %v, want the newest's", stallKeep, got)
	}
}

// deadlines counts the read deadlines set on a connection.
type deadlines struct {
	net.Conn
	n int
}

func (d *deadlines) SetReadDeadline(t time.Time) error {
	d.n++
	return d.Conn.SetReadDeadline(t)
}

// TestStallConnGracesOncePerWait: a read that times out after a stall of
// the gate reads on, past go-redis's deadline by the time lost, once per
// wait: a second timed-out read of the same wait (go-redis reading the
// rest of a reply) is not given the time again, which would make the
// wait as long as the reply has bytes; the next command's wait is.
// Without a stall nothing is given.
func TestStallConnGracesOncePerWait(t *testing.T) {
	release := stalls.hold()
	defer release()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	d := &deadlines{Conn: a}
	c := &stallConn{Conn: d}
	go func() { _, _ = io.Copy(io.Discard, b) }()
	read := func() error {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		_, err := c.Read(make([]byte, 8))
		return err
	}
	if _, err := c.Write([]byte("PING")); err != nil {
		t.Fatal(err)
	}
	before := d.n
	if err := read(); !errors.Is(err, os.ErrDeadlineExceeded) || d.n-before != 1 {
		t.Fatalf("no stall: %v after %d deadlines, want a timeout and go-redis's one", err, d.n-before)
	}
	forget := pretendStall(t, 100*time.Millisecond)
	defer forget()
	if _, err := c.Write([]byte("PING")); err != nil {
		t.Fatal(err)
	}
	before = d.n
	if err := read(); !errors.Is(err, os.ErrDeadlineExceeded) || d.n-before != 2 {
		t.Fatalf("after a stall: %v after %d deadlines, want a timeout after go-redis's and the grace's", err, d.n-before)
	}
	before = d.n
	if err := read(); !errors.Is(err, os.ErrDeadlineExceeded) || d.n-before != 1 {
		t.Fatalf("the same wait again: %v after %d deadlines, want no second grace", err, d.n-before)
	}
	pretendStall(t, 100*time.Millisecond) // another
	if _, err := c.Write([]byte("PING")); err != nil {
		t.Fatal(err)
	}
	before = d.n
	if err := read(); !errors.Is(err, os.ErrDeadlineExceeded) || d.n-before != 2 {
		t.Fatalf("a new wait: %v after %d deadlines, want a grace of its own", err, d.n-before)
	}
}

// pretendStall records a stall of the process spanning the next d, as the
// heartbeat would have seen it had the test process been paused (which a
// test cannot do to itself); forget forgets every stall noted, at the
// latest when the test ends.
func pretendStall(t *testing.T, d time.Duration) (forget func()) {
	t.Helper()
	now := monoNow()
	stalls.mu.Lock()
	stalls.note(now-int64(time.Millisecond), now+int64(d))
	stalls.mu.Unlock()
	forget = func() {
		stalls.mu.Lock()
		stalls.gaps = [stallKeep]span{}
		stalls.mu.Unlock()
	}
	t.Cleanup(forget)
	return forget
}

// pauseRedis pauses srv (SIGSTOP) for 250 ms, the gate's stall pretended
// over it when stalled (the two paused together); resumed waits for srv
// to run again and forgets the stall.
func pauseRedis(t *testing.T, srv *redistest.Server, stalled bool) (resumed func()) {
	t.Helper()
	forget := func() {}
	if stalled {
		forget = pretendStall(t, 600*time.Millisecond)
	}
	srv.Pause()
	done := make(chan struct{})
	go func() {
		time.Sleep(250 * time.Millisecond)
		srv.Resume()
		close(done)
	}()
	return func() {
		<-done
		forget()
	}
}

// stalledReally reports whether the heartbeat saw the test process itself
// stall since (a loaded machine): then a control that expects
// "unavailable" may rightly have been answered.
func stalledReally(t *testing.T, since time.Time) bool {
	if lost := stalls.since(since); lost > 0 {
		t.Logf("the test process itself stalled (%v lost): the control's answer is not judged", lost)
		return true
	}
	return false
}

// oneEvent is a budget of a few decisions an hour.
var oneEvent = storetest.MustWindows(ratelimit.PerPeriod(2, time.Hour))

// admits is how many more decisions of key s admits now, in a row.
func admits(t *testing.T, s *Store, key string) int {
	t.Helper()
	for n := 0; n < 10; n++ {
		d, err := s.Decide(context.Background(), key, oneEvent, time.Time{})
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if !d.Allowed {
			return n
		}
	}
	t.Fatalf("%s: 10 admitted in a row", key)
	return 0
}

// TestStallReadsTheReplyOn: Redis answers a decision in time (its call runs
// at once, before its cutoff, and writes) but the reply reaches the gate
// after the deadline (replies held 150 ms, Timeout 100 ms). Alone that is a
// slow Redis, and the decision is unavailable as before. When the gate
// itself did not run for part of the wait, its read is given that time
// back and the written decision is read, not lost: without the grace the
// client is refused while the budget is charged.
func TestStallReadsTheReplyOn(t *testing.T) {
	srv, _ := realRedis(t)
	p := faultproxy.Start(t, srv.Addr())
	c, err := NewClient("redis://" + p.Addr() + "/0?max_retries=-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for _, batch := range []bool{false, true} {
		s := newStore(t, c, Options{Timeout: 100 * time.Millisecond, Batch: batchSize(batch)})
		t.Cleanup(func() { _ = s.Close() })
		// Warm: the script cached, so the call is one EVALSHA.
		if _, err := s.Decide(ctx, "{warm}:message:EVENT", oneEvent, time.Time{}); err != nil {
			t.Fatalf("batch %v: warm: %v", batch, err)
		}
		p.SetLatency(150 * time.Millisecond)
		key := "{slow" + itoa(time.Now().UnixNano()) + "}:message:EVENT"
		real := time.Now()
		if _, err := s.Decide(ctx, key, oneEvent, time.Time{}); !errors.Is(err, ratelimit.ErrUnavailable) && !stalledReally(t, real) {
			t.Fatalf("batch %v: a slow Redis, the gate running: %v, want unavailable", batch, err)
		}
		before := s.Stats().Stalls
		key2 := key + "2"
		forget := pretendStall(t, 500*time.Millisecond)
		d, err := s.Decide(ctx, key2, oneEvent, time.Time{})
		p.SetLatency(0)
		forget()
		if err != nil || !d.Allowed {
			t.Fatalf("batch %v: the gate stalled, the reply on its way: %+v, %v; want admitted", batch, d, err)
		}
		if s.Stats().Stalls == before {
			t.Errorf("batch %v: Stats().Stalls did not count the grace", batch)
		}
		// It was charged once.
		if n, fresh := admits(t, s, key2), admits(t, s, key2+"fresh"); n != fresh-1 {
			t.Errorf("batch %v: %d more admitted after it, want %d (one fewer than a fresh key's)", batch, n, fresh-1)
		}
	}
}

// TestStallLateDecisionSentAgain: the gate and its Redis paused together
// (Redis SIGSTOPped for 250 ms, the gate's stall pretended): Redis runs the
// decision past its cutoff and writes nothing ("late"). Alone that is a
// slow Redis, refused as unavailable. After a stall of the gate the
// decision is sent once more and admitted, charged exactly once: the late
// call wrote nothing, and the resend did.
func TestStallLateDecisionSentAgain(t *testing.T) {
	srv, _ := realRedis(t)
	// Two connections for 16 decisions: most wait for one, on their
	// context, which a stall must put off too (callCtx).
	c, err := NewClient(srv.URL() + "?max_retries=-1&pool_size=2&min_idle_conns=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	for _, batch := range []bool{false, true} {
		for _, stalled := range []bool{false, true} {
			s := newStore(t, c, Options{Timeout: 100 * time.Millisecond, Batch: batchSize(batch)})
			if _, err := s.Decide(ctx, "{warm}:message:EVENT", oneEvent, time.Time{}); err != nil {
				t.Fatalf("warm: %v", err)
			}
			key := "{late" + itoa(time.Now().UnixNano()) + "}:message:EVENT"
			real := time.Now()
			resumed := pauseRedis(t, srv, stalled)
			before := s.Stats().Stalls
			// g decisions at once, every other one a frame of two budgets
			// (DecideAll's one call): the late calls must not open the
			// breaker and so refuse their own resends.
			const g = 16
			ds := make([]ratelimit.Decision, g)
			errs := make([]error, g)
			var wg sync.WaitGroup
			for i := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					k := key + itoa(int64(i))
					if i%2 == 0 {
						ds[i], errs[i] = s.Decide(ctx, k, oneEvent, time.Time{})
						return
					}
					ds[i], errs[i] = s.DecideAll(ctx, []ratelimit.Budget{{Key: k, Windows: oneEvent}, {Key: k + "b", Windows: oneEvent}}, time.Time{})
				}()
			}
			wg.Wait()
			resumed()
			for i := range g {
				d, err := ds[i], errs[i]
				switch {
				case !stalled && !errors.Is(err, ratelimit.ErrUnavailable) && !stalledReally(t, real):
					t.Errorf("batch %v, decision %d: Redis paused, the gate running: %+v, %v; want unavailable", batch, i, d, err)
				case stalled && (err != nil || !d.Allowed):
					t.Errorf("batch %v, decision %d: Redis paused with the gate: %+v, %v; want admitted", batch, i, d, err)
				case stalled:
					k := key + itoa(int64(i))
					if n, fresh := admits(t, s, k), admits(t, s, k+"fresh"); n != fresh-1 {
						t.Errorf("batch %v, decision %d: %d more admitted after it, want %d (one fewer than a fresh key's: charged once)", batch, i, n, fresh-1)
					}
				}
			}
			if stalled {
				if n := s.Stats().Stalls - before; n < g {
					t.Errorf("batch %v: Stats().Stalls counted %d, want a resend per decision at least", batch, n)
				}
				if st := s.breakerNow(); st != breakerClosed {
					t.Errorf("batch %v: breaker %v after late answers the gate's stall made", batch, st)
				}
			}
			_ = s.Close()
		}
	}
}

// TestStallGuardHold: the connection cap's place, whose call keeps its
// plain deadline, is read on after a stall like any reply: with Redis
// paused 250 ms past a 100 ms deadline, two holds at once fail as
// unavailable while the gate runs, and are answered (the places held)
// when the gate itself was paused with Redis.
func TestStallGuardHold(t *testing.T) {
	srv, _ := realRedis(t)
	c, err := NewClient(srv.URL() + "?max_retries=-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, Options{Timeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = s.Close() })
	g := newGuard(t, s, 0)
	ctx := context.Background()
	if _, ok, err := g.Hold(ctx, "198.51.100.1", nil, 4); err != nil || !ok {
		t.Fatalf("warm: %v, %v", ok, err)
	}
	// Clients of different stripes, whose holds go at once.
	var apart []string
	for i := 2; len(apart) < 4; i++ {
		cl := "198.51.100." + itoa(int64(i))
		if len(apart)%2 == 0 || g.(*guard).stripe(cl) != g.(*guard).stripe(apart[len(apart)-1]) {
			apart = append(apart, cl)
		}
	}
	for _, stalled := range []bool{false, true} {
		clients := apart[:2]
		if stalled {
			clients = apart[2:]
		}
		real := time.Now()
		resumed := pauseRedis(t, srv, stalled)
		oks := make([]bool, len(clients))
		errs := make([]error, len(clients))
		var wg sync.WaitGroup
		for i, cl := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, oks[i], errs[i] = g.Hold(ctx, cl, nil, 4)
			}()
		}
		wg.Wait()
		resumed()
		for i := range clients {
			switch {
			case !stalled && !errors.Is(errs[i], ratelimit.ErrUnavailable) && !stalledReally(t, real):
				t.Errorf("hold %d, Redis paused, the gate running: held %v, %v; want unavailable", i, oks[i], errs[i])
			case stalled && (errs[i] != nil || !oks[i]):
				t.Errorf("hold %d, Redis paused with the gate: held %v, %v; want held", i, oks[i], errs[i])
			}
		}
	}
}

// TestStallHeartbeatHeldByOpenStores: a Store holds the heartbeat from New
// to its first Close; a New that fails holds nothing (it would tick for
// the life of the process).
func TestStallHeartbeatHeldByOpenStores(t *testing.T) {
	users := func() int {
		stalls.mu.Lock()
		defer stalls.mu.Unlock()
		return stalls.users
	}
	c := client(t, "127.0.0.1:1") // never asked
	before := users()
	if _, err := New(c, Options{Batch: -1}); err == nil {
		t.Fatal("New with Batch -1 succeeded")
	}
	if got := users(); got != before {
		t.Fatalf("a failed New: %d holders, want %d", got, before)
	}
	s := newStore(t, c, Options{})
	if got := users(); got != before+1 {
		t.Fatalf("an open Store: %d holders, want %d", got, before+1)
	}
	_ = s.Close()
	_ = s.Close()
	if got := users(); got != before {
		t.Fatalf("closed twice: %d holders, want %d", got, before)
	}
}
