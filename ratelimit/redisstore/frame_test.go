package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// TestDecideAllOneCall: a frame of three budgets on one Redis is one
// script call, one round trip; refused by one budget, it writes none of
// them, and the refusal names that budget with its wait.
func TestDecideAllOneCall(t *testing.T) {
	srv, admin := realRedis(t)
	s := newStore(t, client(t, srv.Addr()), slow)
	ctx := context.Background()
	wide := storetest.MustWindows(ratelimit.PerPeriod(100, time.Hour))
	narrow := storetest.MustWindows(ratelimit.PerPeriod(1.5, time.Hour))
	frame := []ratelimit.Budget{
		{Key: "{c}:message:EVENT", Windows: wide},
		{Key: "{c}:kind:reactions", Windows: narrow},
		{Key: "{p}:aggregate", Windows: wide},
	}
	before := evalshaCalls(t, admin)
	if d, err := s.DecideAll(ctx, frame, time.Time{}); !d.Allowed || err != nil {
		t.Fatalf("first frame: %+v %v", d, err)
	}
	if n := evalshaCalls(t, admin) - before; n != 1 || s.Stats().RoundTrips != 1 {
		t.Fatalf("%d script calls, %d round trips for one frame, want 1 and 1", n, s.Stats().RoundTrips)
	}
	keys := func() int { return len(admin.Keys(ctx, defaultPrefix+"*").Val()) }
	if n := keys(); n != 3 {
		t.Fatalf("%d keys after an admitted frame of 3 budgets", n)
	}
	d, err := s.DecideAll(ctx, frame, time.Time{})
	if err != nil || d.Allowed || d.By != 1 || d.Wait <= 0 {
		t.Fatalf("second frame: %+v %v, want refused by budget 1", d, err)
	}
	// Nothing written: the aggregate's score is still one message's.
	agg := frame[2]
	for range 98 {
		if d, _ := s.DecideAll(ctx, []ratelimit.Budget{agg}, time.Time{}); !d.Allowed {
			t.Fatalf("the aggregate refused early: the refused frame charged it")
		}
	}
	if d, _ := s.DecideAll(ctx, []ratelimit.Budget{agg}, time.Time{}); !d.Allowed {
		t.Fatal("the aggregate's 100th message refused")
	}
}

// A frame refused by its first budget charges none of the later ones: the
// refusal of a group's first decision leaves nothing queued, and the last
// decision, admitting, must not then be written as a lone one.
func TestDecideAllFirstRefusedChargesNoOther(t *testing.T) {
	srv, _ := realRedis(t)
	s := newStore(t, client(t, srv.Addr()), slow)
	ctx := context.Background()
	frame := []ratelimit.Budget{
		{Key: "{c}:kind:reactions", Windows: storetest.MustWindows(ratelimit.PerPeriod(1.5, time.Hour))},
		{Key: "{p}:aggregate", Windows: storetest.MustWindows(ratelimit.PerPeriod(100, time.Hour))},
	}
	if d, err := s.DecideAll(ctx, frame, time.Time{}); !d.Allowed || err != nil {
		t.Fatalf("first frame: %+v %v", d, err)
	}
	for i := range 10 {
		if d, err := s.DecideAll(ctx, frame, time.Time{}); err != nil || d.Allowed || d.By != 0 {
			t.Fatalf("frame %d: %+v %v, want refused by budget 0", i+2, d, err)
		}
	}
	agg := frame[1]
	for i := range 99 {
		if d, _ := s.DecideAll(ctx, []ratelimit.Budget{agg}, time.Time{}); !d.Allowed {
			t.Fatalf("the aggregate refused its message %d of 100: the refused frames charged it", i+2)
		}
	}
}

// An actor quota's room is decided in the frame's own call: the count
// another instance's charges wrote refuses the frame at once, with the
// wait to the end of the quota's window, and the refused frame charges
// nothing. The quota's own memory (Exceeded) has not heard of those
// charges and would have let it through. A room on another limiter's
// store is not offered (Room's false), and a stored count not of the
// quota's shape is an error, never a count of zero.
func TestDecideAllQuotaRoom(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv, admin := realRedis(t)
		a := newStore(t, client(t, srv.Addr()), slow)
		b := newStore(t, client(t, srv.Addr()), slow)
		quotaRoom(t, a, b, admin)
		// The room costs no call of its own: a frame of three budgets and
		// a room is one script call.
		q := newQuota(t, a, 5, time.Minute)
		room, _ := q.Room(strings.Repeat("ef", 32), ratelimit.NewLimiter(a, nil))
		w := storetest.MustWindows(ratelimit.PerPeriod(100, time.Hour))
		frame := []ratelimit.Budget{{Key: "{d}:message:EVENT", Windows: w}, {Key: "{d}:kind:notes", Windows: w}, {Key: "{p2}:aggregate", Windows: w}, room}
		// Once for Redis to have the batch script cached (the frames above
		// were lean calls), then counted.
		if d, err := a.DecideAll(context.Background(), frame, time.Time{}); !d.Allowed || err != nil {
			t.Fatalf("frame of three budgets and a room: %+v %v", d, err)
		}
		before := evalshaCalls(t, admin)
		if d, err := a.DecideAll(context.Background(), frame, time.Time{}); !d.Allowed || err != nil {
			t.Fatalf("frame of three budgets and a room: %+v %v", d, err)
		}
		if n := evalshaCalls(t, admin) - before; n != 1 {
			t.Fatalf("%d script calls for a frame with a room, want 1", n)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		addrs := startCluster(t)
		var st []*Store
		for range 2 {
			c, err := NewClient("redis+cluster://" + strings.Join(addrs, ","))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			st = append(st, newStore(t, c, slow))
		}
		quotaRoom(t, st[0], st[1], st[0].nodes.cc)
	})
}

func quotaRoom(t *testing.T, a, b *Store, c redis.Cmdable) {
	t.Helper()
	ctx := context.Background()
	now := m0.Add(20 * time.Second)
	qa := newQuota(t, a, 2, time.Minute)
	qb := newQuota(t, b, 2, time.Minute)
	lim := ratelimit.NewLimiter(a, nil)
	actor := strings.Repeat("ab", 32)
	// Quota.Room offers a room on one Redis and on a Cluster (see its
	// doc); on a Cluster the frame goes as two decisions, the window's
	// refunded when the room refuses.
	roomOf := func(actor string) ratelimit.Budget {
		return ratelimit.Budget{Key: "{q:" + actor + "}:quota:60000", Room: &ratelimit.Room{Events: 2, Window: time.Minute}}
	}
	if room, ok := qa.Room(actor, lim); !ok || room.Room == nil || *room.Room != *roomOf(actor).Room || room.Key != roomOf(actor).Key {
		t.Fatalf("Room on the limiter's own store: %+v %v, want %+v", room, ok, roomOf(actor))
	}
	room := roomOf(actor)
	if _, ok := qa.Room(actor, ratelimit.NewLimiter(b, nil)); ok {
		t.Fatal("Room offered for a limiter on another store")
	}
	if _, ok := qa.Room(actor, ratelimit.NewLimiter(nil, nil)); ok {
		t.Fatal("Room offered for a limiter on a memory store")
	}
	// The client's EVENT budget (2.5 an hour: room for two more after the
	// first frame) and the actor's quota key are in different slots (on a
	// cluster, most likely on different masters).
	ev := ratelimit.Budget{Key: "{198.51.100.7}:message:EVENT", Windows: storetest.MustWindows(ratelimit.PerPeriod(2.5, time.Hour))}
	frame := []ratelimit.Budget{ev, room}
	if d, err := a.DecideAll(ctx, frame, now); !d.Allowed || err != nil {
		t.Fatalf("frame with room: %+v %v", d, err)
	}
	// Instance b's charges fill the actor's quota; instance a's memory
	// has not heard of them.
	for i := range 2 {
		if ok, err := qb.addAt(ctx, actor, now); !ok || err != nil {
			t.Fatalf("charge %d on b: %v %v", i, ok, err)
		}
	}
	if over, _, _ := qa.Exceeded(ctx, actor); over {
		t.Fatal("a's memory knows of b's charges: the test shows nothing")
	}
	d, err := a.DecideAll(ctx, frame, now)
	if err != nil || d.Allowed || d.By != 1 || d.Wait != 40*time.Second {
		t.Fatalf("frame of an actor at its quota: %+v %v, want refused by the room, wait 40s", d, err)
	}
	// A value the quota never writes is an error.
	other := roomOf(strings.Repeat("cd", 32))
	if err := c.Set(ctx, a.prefix+other.Key, "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.DecideAll(ctx, []ratelimit.Budget{ev, other}, now); !errors.Is(err, ratelimit.ErrUnavailable) {
		t.Fatalf("malformed quota value: %v, want unavailable", err)
	}
	// Neither frame charged the EVENT budget: it admits one more message,
	// and then refuses.
	for i, want := range []bool{true, false} {
		if d, err := a.DecideAll(ctx, []ratelimit.Budget{ev}, now); d.Allowed != want || err != nil {
			t.Fatalf("EVENT alone, %d: %+v %v, want admitted %v (the refused frames charged it)", i, d, err, want)
		}
	}
	// The next window has room again.
	ev.Key = "{198.51.100.8}:message:EVENT"
	if d, err := a.DecideAll(ctx, []ratelimit.Budget{ev, room}, m0.Add(time.Minute)); !d.Allowed || err != nil {
		t.Fatalf("frame in the next window: %+v %v", d, err)
	}
}

// A frame of one window budget and a quota's room (an EVENT with the
// quota on, the usual frame) is one decision with a companion, batched
// with other clients' decisions: 200 such frames at once from 64
// goroutines share calls, and within the shared calls the actors at their
// quota are refused, with nothing charged, and the others admitted. Sent
// alone each (DecideAll's call per frame), the frames took one call each,
// and at 256 connections they queued past their deadline. On a 3-master
// cluster the window and the room are two decisions, each batched with
// its master's, and a refused frame's window is refunded: fewer calls than
// the 2 per frame (and a refund per refused frame) of frames sent alone,
// and nothing charged either.
func TestDecideAllRoomBatched(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv, admin := realRedis(t)
		s := newStore(t, client(t, srv.Addr()), Options{Timeout: slow.Timeout, Batch: 32})
		roomBatched(t, s, 1, func() int { return evalshaCalls(t, admin) })
	})
	t.Run("cluster", func(t *testing.T) {
		addrs := startCluster(t)
		c, err := NewClient("redis+cluster://" + strings.Join(addrs, ","))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		s := newStore(t, c, Options{Timeout: slow.Timeout, Batch: 32})
		var ms []*redis.Client
		for _, a := range addrs {
			m := redis.NewClient(&redis.Options{Addr: a})
			t.Cleanup(func() { _ = m.Close() })
			ms = append(ms, m)
		}
		roomBatched(t, s, 2, func() int {
			n := 0
			for _, m := range ms {
				n += evalshaCalls(t, m)
			}
			return n
		})
	})
}

// roomBatched runs 200 frames with a room at once on s (see
// TestDecideAllRoomBatched), a frame sent alone being per decisions
// script calls, calls counting them all.
func roomBatched(t *testing.T, s *Store, perFrame int, calls func() int) {
	ctx := context.Background()
	now := m0.Add(20 * time.Second)
	q := newQuota(t, s, 1, time.Minute)
	lim := ratelimit.NewLimiter(s, nil)
	ws := storetest.MustWindows(ratelimit.PerPeriod(1.5, time.Hour))
	const n = 200
	frames := make([][]ratelimit.Budget, n)
	for i := range n {
		actor := fmt.Sprintf("%064x", i)
		if i%2 == 1 { // odd actors are at their quota of 1
			if ok, err := q.addAt(ctx, actor, now); !ok || err != nil {
				t.Fatalf("fill %d: %v %v", i, ok, err)
			}
		}
		room, _ := q.Room(actor, lim)
		frames[i] = []ratelimit.Budget{{Key: fmt.Sprintf("{10.0.%d.%d}:message:EVENT", i>>8, i&255), Windows: ws}, room}
	}
	before := calls()
	var wg sync.WaitGroup
	ds := make([]ratelimit.Decision, n)
	errs := make([]error, n)
	next := atomic.Int64{}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				ds[i], errs[i] = s.DecideAll(ctx, frames[i], now)
			}
		}()
	}
	wg.Wait()
	made := calls() - before
	for i := range n {
		switch {
		case errs[i] != nil:
			t.Fatalf("frame %d: %v", i, errs[i])
		case i%2 == 0 && !ds[i].Allowed:
			t.Fatalf("frame %d, actor with room: %+v", i, ds[i])
		case i%2 == 1 && (ds[i].Allowed || ds[i].By != 1 || ds[i].Wait != 40*time.Second):
			t.Fatalf("frame %d, actor at its quota: %+v, want refused by the room, 40s", i, ds[i])
		}
	}
	// Nothing charged for the refused: each of their clients still
	// admits a message of its window of 1.5 (an admitted one's refuses).
	for i := range n {
		d, err := s.DecideAll(ctx, frames[i][:1], now)
		if err != nil || d.Allowed != (i%2 == 1) {
			t.Fatalf("client %d afterwards: %+v %v, want admitted %v", i, d, err, i%2 == 1)
		}
	}
	t.Logf("%d frames with a room in %d script calls", n, made)
	if made >= perFrame*n {
		t.Fatalf("%d frames with a room took %d script calls: not batched", n, made)
	}
}

// A room is not offered on a Ring (one Redis and a Cluster have it): a
// Ring routes a call by its first key and would read the actor's count on
// the wrong shard (always 0). And
// a room the script would refuse for the whole call, which a batch shares
// with other clients, is refused before it is sent.
func TestQuotaRoomNotOnRing(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr(), "b": b.Addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = ring.Close() })
	rs := newStore(t, ring, Options{Timeout: slow.Timeout, Batch: 32})
	if _, ok := newQuota(t, rs, 5, time.Minute).Room(strings.Repeat("ab", 32), ratelimit.NewLimiter(rs, nil)); ok {
		t.Fatal("Room offered on a Ring")
	}
	s := newStore(t, client(t, a.Addr()), Options{Timeout: slow.Timeout, Batch: 32})
	ws := storetest.MustWindows(ratelimit.PerPeriod(100, time.Hour))
	for _, r := range []ratelimit.Room{{Events: 0, Window: time.Minute}, {Events: 5, Window: 0}, {Events: 5, Window: 1500 * time.Microsecond}} {
		d, err := s.DecideAll(context.Background(), []ratelimit.Budget{{Key: "{e}:message:EVENT", Windows: ws}, {Key: "{q:x}:quota:60000", Room: &r}}, time.Time{})
		if !errors.Is(err, ratelimit.ErrUnavailable) || d.By != 1 {
			t.Fatalf("room %+v: %+v %v, want unavailable by the room", r, d, err)
		}
	}
}

// TestRoomGoesLean: the usual frame with the quota on, one window budget
// and the actor's room, sent alone is a call of the lean script
// (ewma1.lua with the room as its second key), not of the batch one; it
// is decided as the batch script decides it (internal/scripts
// TestLeanRoomEqualsBatch): admitted while the actor has room, refused by
// the room with the wait to its window's end, nothing written.
func TestRoomGoesLean(t *testing.T) {
	srv, admin := realRedis(t)
	s := newStore(t, client(t, srv.Addr()), slow)
	q := newQuota(t, s, 1, time.Minute)
	ctx := context.Background()
	actor := strings.Repeat("ab", 32)
	room, ok := q.Room(actor, ratelimit.NewLimiter(s, nil))
	if !ok {
		t.Fatal("no room on one Redis")
	}
	ev := ratelimit.Budget{Key: "{198.51.100.7}:message:EVENT", Windows: storetest.MustWindows(ratelimit.PerPeriod(10, time.Hour))}
	now := m0.Add(15 * time.Second)
	if d, err := s.DecideAll(ctx, []ratelimit.Budget{ev, room}, now); !d.Allowed || err != nil {
		t.Fatalf("first frame: %+v %v", d, err)
	}
	if ok, err := q.addAt(ctx, actor, now); !ok || err != nil {
		t.Fatalf("charge: %v %v", ok, err)
	}
	evKey := s.request(ev.Key, ev.Windows, now).keys[0]
	before := admin.Get(ctx, evKey).Val()
	d, err := s.DecideAll(ctx, []ratelimit.Budget{ev, room}, now)
	if err != nil || d.Allowed || d.By != 1 || d.Wait != 45*time.Second {
		t.Fatalf("frame of an actor at its quota: %+v %v, want refused by the room, wait 45s", d, err)
	}
	if after := admin.Get(ctx, evKey).Val(); after != before {
		t.Error("the refused frame wrote its window")
	}
	have, err := admin.ScriptExists(ctx, ewma.Hash(), ewma1.Hash()).Result()
	if err != nil || have[0] || !have[1] {
		t.Errorf("scripts in Redis's cache (batch, lean): %v %v, want only the lean one", have, err)
	}
}
