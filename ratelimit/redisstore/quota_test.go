package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/faultproxy"
	"github.com/sluice-relay/sluice/ratelimit"
)

// m0 is a whole minute: the quota's windows of a minute start on it.
var m0 = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

// quotaStep is one call at m0+at: Exceeded ("x") or Add ("a") for actor,
// with the answer both quotas must give (want: over, or added; wait: the
// wait of an Exceeded).
type quotaStep struct {
	at    time.Duration
	actor string
	op    string
	want  bool
	wait  time.Duration
}

// quotaSteps is the conformance table, for 3 events a minute: the limit,
// refusal without counting, one actor's budget not another's, the wait to
// the next window, the window boundary, a late caller (an instant behind a
// window already opened), and a window left unused.
var quotaSteps = []quotaStep{
	{10 * time.Second, "alice", "x", false, 0},
	{10 * time.Second, "alice", "a", true, 0},
	{10 * time.Second, "alice", "a", true, 0},
	{11 * time.Second, "alice", "x", false, 0},
	{11 * time.Second, "alice", "a", true, 0},
	{12 * time.Second, "alice", "x", true, 48 * time.Second},
	{12 * time.Second, "alice", "a", false, 0},
	{13 * time.Second, "alice", "a", false, 0},
	{13 * time.Second, "bob", "x", false, 0},
	{13 * time.Second, "bob", "a", true, 0},
	{59*time.Second + 999*time.Millisecond, "alice", "x", true, time.Millisecond},
	{60 * time.Second, "alice", "x", false, 0},
	{61 * time.Second, "alice", "a", true, 0},
	// Late: charged into the newer window, never rolling it back.
	{59 * time.Second, "alice", "a", true, 0},
	{59*time.Second + 500*time.Millisecond, "alice", "x", false, 0},
	{62 * time.Second, "alice", "a", true, 0},
	{62 * time.Second, "alice", "x", true, 58 * time.Second},
	{30 * time.Second, "alice", "x", true, 90 * time.Second},
	{62 * time.Second, "alice", "a", false, 0},
	{62 * time.Second, "bob", "a", true, 0},
	// Two windows later everything is fresh.
	{200 * time.Second, "alice", "x", false, 0},
	{200 * time.Second, "alice", "a", true, 0},
	{200 * time.Second, "bob", "x", false, 0},
}

// runQuotaSteps runs the table against a fresh Redis quota and, actor by
// actor, a fresh in-process ratelimit.Quota seen through the ActorQuota
// interface (Quota.Local, its clock set to each step's instant): the in-process table shares
// slots between actors by design, so each actor gets its own there, and the
// comparison is of windows and counts. Every step must give the wanted
// answer on both.
func runQuotaSteps(t *testing.T, q *Quota) {
	t.Helper()
	ctx := context.Background()
	var now time.Time // the in-process quotas' clock
	local := map[string]ratelimit.ActorQuota{}
	for i, st := range quotaSteps {
		lq := local[st.actor]
		if lq == nil {
			rq, err := ratelimit.NewQuota(q.Events(), q.Window())
			if err != nil {
				t.Fatal(err)
			}
			lq = rq.WithClock(func() time.Time { return now })
			local[st.actor] = lq
		}
		now = m0.Add(st.at)
		var got, lgot bool
		var wait, lwait time.Duration
		var err error
		switch st.op {
		case "x":
			got, wait, err = q.exceededAt(ctx, st.actor, now)
			if err == nil {
				lgot, lwait, err = lq.Exceeded(ctx, st.actor)
			}
		case "a":
			got, err = q.addAt(ctx, st.actor, now)
			if err == nil {
				lgot, err = lq.Add(ctx, st.actor, "", 0)
			}
		}
		if err != nil {
			t.Fatalf("step %d %+v: %v", i, st, err)
		}
		if got != st.want || wait != st.wait || lgot != st.want || lwait != st.wait {
			t.Errorf("step %d %s %s at +%v: redis %v %v, in-process %v %v; want %v %v",
				i, st.op, st.actor, st.at, got, wait, lgot, lwait, st.want, st.wait)
		}
	}
}

func newQuota(tb testing.TB, s *Store, events int, window time.Duration) *Quota {
	tb.Helper()
	q, err := NewQuota(s, events, window)
	if err != nil {
		tb.Fatalf("NewQuota: %v", err)
	}
	return q
}

func TestQuotaConformanceRedis(t *testing.T) {
	_, c := realRedis(t)
	runQuotaSteps(t, newQuota(t, newStore(t, c, slow), 3, time.Minute))
	// Through a client that never resends: no request ids, same answers.
	lean := redis.NewClient(&redis.Options{Addr: c.Options().Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = lean.Close() })
	ls := newStore(t, lean, Options{Prefix: "lean:", Timeout: slow.Timeout})
	if !ls.lean {
		t.Fatal("store on a client without retries is not lean")
	}
	runQuotaSteps(t, newQuota(t, ls, 3, time.Minute))
}

func TestQuotaConformanceMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	runQuotaSteps(t, newQuota(t, newStore(t, client(t, m.Addr()), slow), 3, time.Minute))
}

func TestNewQuotaValidates(t *testing.T) {
	m := miniredis.RunT(t)
	s := newStore(t, client(t, m.Addr()), slow)
	for _, tt := range []struct {
		events int
		window time.Duration
	}{
		{0, time.Minute}, {-1, time.Minute}, {10, 0}, {10, -time.Second},
		{bigQuota + 1, time.Minute}, {10, time.Second + time.Microsecond},
	} {
		if q, err := NewQuota(s, tt.events, tt.window); !errors.Is(err, ratelimit.ErrInvalidQuota) || q != nil {
			t.Errorf("NewQuota(%d, %v) = %v, %v; want ErrInvalidQuota", tt.events, tt.window, q, err)
		}
	}
	if _, err := NewQuota(nil, 10, time.Minute); !errors.Is(err, errConfig) {
		t.Errorf("NewQuota(nil store) = %v, want errConfig", err)
	}
	q := newQuota(t, s, 600, time.Minute)
	if q.Events() != 600 || q.Window() != time.Minute {
		t.Errorf("Events, Window = %d, %v", q.Events(), q.Window())
	}
}

// sharedQuota adds 15 events for actor through the quotas in turn at now
// (zero: Redis TIME) and returns how many were accepted.
func sharedQuota(t *testing.T, qs []*Quota, actor string, now time.Time) int {
	t.Helper()
	added := 0
	for i := range 15 {
		ok, err := qs[i%len(qs)].addAt(context.Background(), actor, now)
		if err != nil {
			t.Fatalf("Add %d: %v", i, err)
		}
		if ok {
			added++
		}
	}
	return added
}

// TestQuotaSharedByInstances: three Stores over one Redis, as three gate
// instances, give one actor one quota: 5 of 15 events, where three
// in-process quotas accepted 15. Then every instance sees it exceeded, with
// the same wait.
func TestQuotaSharedByInstances(t *testing.T) {
	srv, _ := realRedis(t)
	var qs []*Quota
	for range 3 {
		qs = append(qs, newQuota(t, newStore(t, client(t, srv.Addr()), slow), 5, time.Minute))
	}
	now := m0.Add(20 * time.Second)
	if n := sharedQuota(t, qs, "alice", now); n != 5 {
		t.Errorf("%d of 15 events accepted across three instances, want 5", n)
	}
	for i, q := range qs {
		over, wait, err := q.exceededAt(context.Background(), "alice", now)
		if err != nil || !over || wait != 40*time.Second {
			t.Errorf("instance %d: Exceeded = %v %v %v, want true 40s", i, over, wait, err)
		}
	}
	// The same by Redis TIME: a window of a day, so that the 15 calls fall
	// in one window unless they straddle midnight UTC, which is checked.
	var day []*Quota
	for _, q := range qs {
		day = append(day, newQuota(t, q.s, 5, 24*time.Hour))
	}
	c := client(t, srv.Addr())
	before, _ := c.Time(context.Background()).Result()
	n := sharedQuota(t, day, "bob", time.Time{})
	after, _ := c.Time(context.Background()).Result()
	if before.UnixMilli()/864e5 != after.UnixMilli()/864e5 {
		t.Skip("the calls straddled a window boundary")
	}
	if n != 5 {
		t.Errorf("by Redis TIME: %d of 15 events accepted, want 5", n)
	}
	over, wait, err := day[0].exceededAt(context.Background(), "bob", time.Time{})
	if err != nil || !over || wait <= 0 || wait > 24*time.Hour {
		t.Errorf("by Redis TIME: Exceeded = %v %v %v, want over with a wait within the window", over, wait, err)
	}
}

// TestQuotaSharedCluster: the same on a three-node cluster, for actors
// whose keys land on every node.
func TestQuotaSharedCluster(t *testing.T) {
	addrs := startCluster(t)
	var qs []*Quota
	for range 3 {
		c, err := NewClient("redis+cluster://" + strings.Join(addrs, ","))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		qs = append(qs, newQuota(t, newStore(t, c, slow), 5, time.Minute))
	}
	now := m0.Add(20 * time.Second)
	for i := range 6 {
		actor := fmt.Sprintf("%064x", i)
		if n := sharedQuota(t, qs, actor, now); n != 5 {
			t.Errorf("actor %d: %d of 15 events accepted across three instances, want 5", i, n)
		}
	}
	nodes := 0
	for _, a := range addrs {
		n := redis.NewClient(&redis.Options{Addr: a})
		if k, _ := n.DBSize(context.Background()).Result(); k > 0 {
			nodes++
		}
		_ = n.Close()
	}
	if nodes != 3 {
		t.Errorf("quota keys on %d of 3 nodes; routing was not exercised", nodes)
	}
}

// TestQuotaKeyExpires: a key's TTL is the rest of its window plus the
// margin (a second), by the instant given or by Redis TIME, so it never
// outlives its window by more than the margin.
func TestQuotaKeyExpires(t *testing.T) {
	_, c := realRedis(t)
	ctx := context.Background()
	q := newQuota(t, newStore(t, c, slow), 5, time.Minute)
	const margin = time.Second
	if ok, err := q.addAt(ctx, "alice", m0.Add(10*time.Second)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	key, _ := q.key("alice", false)
	if key != "sluice:{q:alice}:quota:60000" {
		t.Errorf("key %q", key)
	}
	ttl, err := c.PTTL(ctx, key).Result()
	if err != nil || ttl <= 0 || ttl > 50*time.Second+margin {
		t.Errorf("PTTL after an Add 10 s into the window = %v %v, want (0, 51 s]", ttl, err)
	}
	if ok, err := q.addAt(ctx, "bob", time.Time{}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	key, _ = q.key("bob", false)
	ttl, err = c.PTTL(ctx, key).Result()
	if err != nil || ttl <= 0 || ttl > q.Window()+margin {
		t.Errorf("PTTL by Redis TIME = %v %v, want (0, window + %v]", ttl, err, margin)
	}
	// Exceeded writes nothing.
	if _, _, err := q.exceededAt(ctx, "carol", time.Time{}); err != nil {
		t.Fatal(err)
	}
	key, _ = q.key("carol", false)
	if n, _ := c.Exists(ctx, key).Result(); n != 0 {
		t.Error("Exceeded created a key")
	}
	// A key past its window is gone, and the actor starts afresh (miniredis,
	// whose clock the test moves).
	m := miniredis.RunT(t)
	mq := newQuota(t, newStore(t, client(t, m.Addr()), slow), 1, time.Minute)
	m.SetTime(m0.Add(30 * time.Second))
	if ok, err := mq.addAt(ctx, "alice", time.Time{}); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if over, wait, err := mq.exceededAt(ctx, "alice", time.Time{}); !over || wait != 30*time.Second || err != nil {
		t.Fatalf("miniredis at +30s: %v %v %v, want over, 30s", over, wait, err)
	}
	key, _ = mq.key("alice", false)
	if ttl := m.TTL(key); ttl != 31*time.Second {
		t.Errorf("miniredis TTL %v, want 31s", ttl)
	}
	m.FastForward(31 * time.Second)
	m.SetTime(m0.Add(61 * time.Second))
	if m.Exists(key) {
		t.Error("key outlived its window and margin")
	}
	if ok, err := mq.addAt(ctx, "alice", time.Time{}); !ok || err != nil {
		t.Errorf("next window: %v %v", ok, err)
	}
}

// TestQuotaLongActor: an actor longer than maxActorLen, or with a brace,
// is hashed into the key; a 64-hex pubkey is used as it is.
func TestQuotaLongActor(t *testing.T) {
	m := miniredis.RunT(t)
	q := newQuota(t, newStore(t, client(t, m.Addr()), slow), 1, time.Minute)
	pub := strings.Repeat("ab", 32)
	if k, _ := q.key(pub, false); k != "sluice:{q:"+pub+"}:quota:60000" {
		t.Errorf("pubkey key %q", k)
	}
	for _, a := range []string{strings.Repeat("x", 10000), "a}b", "{x}"} {
		k, _ := q.key(a, false)
		if len(k) != len("sluice:{q:#}:quota:60000")+64 || strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Errorf("key of %.20q… is %q", a, k)
		}
		if ok, err := q.addAt(context.Background(), a, m0); !ok || err != nil {
			t.Errorf("Add %.20q: %v %v", a, ok, err)
		}
		if ok, _ := q.addAt(context.Background(), a, m0); ok {
			t.Errorf("second Add %.20q accepted with events 1", a)
		}
	}
}

// TestQuotaAddIdempotent: an Add resent with its request id (go-redis
// retrying after a lost reply) is answered added and not counted again.
func TestQuotaAddIdempotent(t *testing.T) {
	_, c := realRedis(t)
	ctx := context.Background()
	key := "sluice:{q:alice}:quota:60000"
	now := strconv.FormatInt(m0.Add(time.Second).UnixMilli(), 10)
	add := func(id string) []any {
		r, err := quotaScript.Run(ctx, c, []string{key}, "a", 2, 60000, now, 0, id).Result()
		if err != nil {
			t.Fatal(err)
		}
		return r.([]any)
	}
	if r := add("00000000000000a1"); r[0] != int64(1) || r[2] != int64(1) {
		t.Fatalf("first: %v", r)
	}
	if r := add("00000000000000a1"); r[0] != int64(1) || r[2] != int64(1) {
		t.Errorf("resend: %v, want added and count still 1", r)
	}
	if r := add("00000000000000a2"); r[0] != int64(1) || r[2] != int64(2) {
		t.Errorf("second: %v", r)
	}
	if r := add("00000000000000a3"); r[0] != int64(0) || r[2] != int64(2) {
		t.Errorf("third: %v, want refused", r)
	}
}

// TestQuotaDownFailsClosed: a Redis killed or paused answers every call
// with an error wrapping ratelimit.ErrUnavailable within the deadline
// (the hang guard tells bounded from stuck; it asserts no speed), never
// "not exceeded".
func TestQuotaDownFailsClosed(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, q *Quota, what string) {
		t.Helper()
		for i := range 20 {
			start := time.Now()
			over, _, err := q.exceededAt(ctx, "alice", time.Time{})
			if !errors.Is(err, ratelimit.ErrUnavailable) {
				t.Fatalf("%s: Exceeded #%d = %v %v, want ErrUnavailable", what, i, over, err)
			}
			added, err := q.addAt(ctx, "alice", time.Time{})
			if !errors.Is(err, ratelimit.ErrUnavailable) || added {
				t.Fatalf("%s: Add #%d = %v %v, want ErrUnavailable", what, i, added, err)
			}
			if el := time.Since(start); el > 2*hangGuard {
				t.Fatalf("%s: two calls took %v", what, el)
			}
		}
	}
	t.Run("killed", func(t *testing.T) {
		srv, c := realRedis(t)
		q := newQuota(t, newStore(t, c, Options{}), 5, time.Minute)
		if _, err := q.addAt(ctx, "alice", time.Time{}); err != nil {
			t.Fatal(err)
		}
		srv.Kill()
		check(t, q, "killed")
		if st := q.s.breakerNow(); st == breakerClosed {
			t.Errorf("breaker %v with Redis dead", st)
		}
	})
	t.Run("paused", func(t *testing.T) {
		srv, c := realRedis(t)
		q := newQuota(t, newStore(t, c, Options{}), 5, time.Minute)
		if _, err := q.addAt(ctx, "alice", time.Time{}); err != nil {
			t.Fatal(err)
		}
		srv.Pause()
		start := time.Now()
		_, _, err := q.exceededAt(ctx, "alice", time.Time{})
		if !errors.Is(err, ratelimit.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("paused: %v, want ErrUnavailable ending at the deadline", err)
		}
		if el := time.Since(start); el > hangGuard {
			t.Errorf("paused: the call took %v", el)
		}
		check(t, q, "paused")
	})
	t.Run("blackhole", func(t *testing.T) {
		srv, _ := realRedis(t)
		p := faultproxy.Start(t, srv.Addr())
		q := newQuota(t, newStore(t, client(t, p.Addr()), Options{}), 5, time.Minute)
		if _, err := q.addAt(ctx, "alice", time.Time{}); err != nil {
			t.Fatal(err)
		}
		p.Blackhole(true)
		check(t, q, "blackhole")
		p.Blackhole(false)
	})
	t.Run("closed", func(t *testing.T) {
		m := miniredis.RunT(t)
		s := newStore(t, client(t, m.Addr()), slow)
		q := newQuota(t, s, 5, time.Minute)
		_ = s.Close()
		if _, err := q.Add(ctx, "alice", "", 0); !errors.Is(err, errClosed) || !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Errorf("after Close: %v", err)
		}
	})
}

// TestQuotaMalformed: a stored value the script cannot read, a key of
// another type, or a reply of the wrong shape is an error wrapping
// ErrUnavailable and errBadReply, never "not exceeded" and never a count
// of zero; and, being about one key, it does not open the breaker.
func TestQuotaMalformed(t *testing.T) {
	ctx := context.Background()
	for _, srv := range []string{"redis", "miniredis"} {
		t.Run(srv, func(t *testing.T) {
			var c *redis.Client
			if srv == "redis" {
				_, c = realRedis(t)
			} else {
				c = client(t, miniredis.RunT(t).Addr())
			}
			s := newStore(t, c, Options{Timeout: slow.Timeout, breaker: breakerOptions{Failures: 1}})
			q := newQuota(t, s, 5, time.Minute)
			for _, v := range []string{"garbage", "1 ", " 1", "29458924 x", "29458924 5 zz", "-1 5", "1.5 2"} {
				key, _ := q.key("mallory", false)
				if err := c.Set(ctx, key, v, 0).Err(); err != nil {
					t.Fatal(err)
				}
				over, _, err := q.exceededAt(ctx, "mallory", m0)
				if !errors.Is(err, ratelimit.ErrUnavailable) || !errors.Is(err, errBadReply) || !IsPerKey(err) {
					t.Errorf("value %q: Exceeded = %v %v", v, over, err)
				}
				added, err := q.addAt(ctx, "mallory", m0)
				if !errors.Is(err, ratelimit.ErrUnavailable) || added {
					t.Errorf("value %q: Add = %v %v", v, added, err)
				}
				if got, _ := c.Get(ctx, key).Result(); got != v {
					t.Errorf("value %q rewritten to %q", v, got)
				}
			}
			key, _ := q.key("hash", false)
			c.Del(ctx, key)
			if err := c.HSet(ctx, key, "f", "1").Err(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := q.exceededAt(ctx, "hash", time.Time{}); !errors.Is(err, ratelimit.ErrUnavailable) || !errors.Is(err, errBadReply) {
				t.Errorf("key of another type: %v", err)
			}
			if st := s.breakerNow(); st != breakerClosed {
				t.Errorf("breaker %v after malformed values", st)
			}
			if _, err := q.addAt(ctx, "alice", time.Time{}); err != nil {
				t.Errorf("another actor: %v", err)
			}
		})
	}
}

func TestParseQuotaReply(t *testing.T) {
	for _, tt := range []struct {
		reply any
		add   bool
		over  bool
		wait  time.Duration
		ok    bool
	}{
		{[]any{int64(0), int64(0), int64(3)}, false, false, 0, true},
		{[]any{int64(1), int64(1500), int64(5)}, false, true, 1500 * time.Millisecond, true},
		{[]any{int64(1), int64(0), int64(5)}, true, true, 0, true},
		{[]any{int64(0), int64(20), int64(5)}, true, false, 20 * time.Millisecond, true},
		{nil, false, false, 0, false},
		{"OK", false, false, 0, false},
		{[]any{}, false, false, 0, false},
		{[]any{int64(0), int64(0)}, false, false, 0, false},
		{[]any{int64(0), int64(0), int64(0), int64(0)}, false, false, 0, false},
		{[]any{"0", int64(0), int64(0)}, false, false, 0, false},
		{[]any{int64(2), int64(0), int64(0)}, false, false, 0, false},
		{[]any{int64(-1), int64(0), int64(0)}, false, false, 0, false},
		{[]any{int64(1), int64(0), int64(5)}, false, false, 0, false},  // over without a wait
		{[]any{int64(0), int64(10), int64(5)}, false, false, 0, false}, // room with a wait
		{[]any{int64(0), int64(0), int64(5)}, true, false, 0, false},   // refused without a wait
		{[]any{int64(1), int64(10), int64(5)}, true, false, 0, false},  // added with a wait
		{[]any{int64(1), int64(maxWaitMs + 1), int64(5)}, false, false, 0, false},
		{[]any{int64(0), int64(0), int64(-1)}, false, false, 0, false},
		{[]any{int64(0), int64(0), nil}, false, false, 0, false},
	} {
		over, wait, _, err := parseQuotaReply(tt.reply, tt.add)
		if !tt.ok {
			if err == nil || !errors.Is(err, ratelimit.ErrUnavailable) || !errors.Is(err, errBadReply) || over {
				t.Errorf("%#v (add %v): %v %v %v, want a bad reply", tt.reply, tt.add, over, wait, err)
			}
			continue
		}
		if err != nil || over != tt.over || wait != tt.wait {
			t.Errorf("%#v (add %v): %v %v %v, want %v %v", tt.reply, tt.add, over, wait, err, tt.over, tt.wait)
		}
	}
}

// TestQuotaRotatingActors: an attacker minting a pubkey per event costs
// Redis one key per accepted event, each with a TTL within the window and
// its margin, so the memory goes back when the window ends. The log gives
// MEMORY USAGE of one key.
func TestQuotaRotatingActors(t *testing.T) {
	_, c := realRedis(t)
	ctx := context.Background()
	q := newQuota(t, newStore(t, c, slow), 600, time.Minute)
	const n = 10000
	before, _ := c.DBSize(ctx).Result()
	used0 := usedMemory(t, c)
	for i := range n {
		if ok, err := q.addAt(ctx, fmt.Sprintf("%064x", i), time.Time{}); !ok || err != nil {
			t.Fatalf("Add %d: %v %v", i, ok, err)
		}
	}
	var keys []string
	iter := c.Scan(ctx, 0, "sluice:{q:*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if len(keys) > n || len(keys) == 0 {
		t.Fatalf("%d keys for %d rotating pubkeys", len(keys), n)
	}
	pipe := c.Pipeline()
	ttls := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		ttls[i] = pipe.PTTL(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, d := range ttls {
		if v := d.Val(); v <= 0 || v > q.Window()+time.Second {
			t.Fatalf("key %s has PTTL %v", keys[i], v)
		}
	}
	after, _ := c.DBSize(ctx).Result()
	used1 := usedMemory(t, c)
	mem, err := c.MemoryUsage(ctx, keys[0], 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rotating pubkeys: %d keys (DBSIZE %d → %d), every one with a TTL ≤ window + 1 s; MEMORY USAGE of one key (%d-byte name) %d bytes; used_memory grew %d bytes, %d per key",
		n, len(keys), before, after, len(keys[0]), mem, used1-used0, (used1-used0)/int64(len(keys)))
}

// usedMemory returns INFO memory's used_memory.
func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}

// BenchmarkRedisQuota: one Add (queued, sent in batches) and one Exceeded
// (answered locally) per op on a local redis-server, from parallel
// goroutines, an actor each.
func BenchmarkRedisQuota(b *testing.B) {
	_, c := realRedis(b)
	q := newQuota(b, newStore(b, c, Options{}), bigQuota, time.Minute)
	ctx := context.Background()
	var seq atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		actor := fmt.Sprintf("%064x", seq.Add(1))
		for pb.Next() {
			if _, err := q.Add(ctx, actor, "", 0); err != nil {
				b.Error(err)
				return
			}
			if _, _, err := q.Exceeded(ctx, actor); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestQuotaRestartForgets: a Redis restarted without persistence has lost
// every count (and the script): the same Quota heals by itself (EVAL on
// NOSCRIPT), and each actor gets its whole quota again in the window of
// the restart — what docs/RELIABILITY.md says a restart gives back.
func TestQuotaRestartForgets(t *testing.T) {
	srv, c := realRedis(t)
	ctx := context.Background()
	q := newQuota(t, newStore(t, c, slow), 5, time.Minute)
	now := m0.Add(5 * time.Second)
	if n := sharedQuota(t, []*Quota{q}, "alice", now); n != 5 {
		t.Fatalf("before the restart: %d accepted, want 5", n)
	}
	srv.Restart()
	healed := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, _, err := q.exceededAt(ctx, "alice", now); err == nil {
			healed = true
			break
		}
	}
	if !healed {
		t.Fatal("quota did not heal after the restart")
	}
	if n := sharedQuota(t, []*Quota{q}, "alice", now); n != 5 {
		t.Errorf("after the restart, same window: %d accepted, want 5 more (the counts are gone)", n)
	}
}

// TestQuotaLostReplyChargesOnce: through a proxy that drops one reply
// (dropping the connection, so go-redis resends the EVALSHA), the Add is
// answered added and counted once. A batch of charges in one call carries
// no request id: when its reply is lost and the call resent, each event's
// seen key keeps it from counting again.
func TestQuotaLostReplyChargesOnce(t *testing.T) {
	srv, direct := realRedis(t)
	p := startLossyProxy(t, srv.Addr())
	c := client(t, p.ln.Addr().String()) // go-redis defaults: MaxRetries 3
	q := newQuota(t, newStore(t, c, slow), 5, time.Minute)
	ctx := context.Background()
	now := m0.Add(time.Second)
	if ok, err := q.addAt(ctx, "alice", now); !ok || err != nil {
		t.Fatalf("warm-up: %v %v", ok, err)
	}
	p.armed.Store(true)
	if ok, err := q.addAt(ctx, "alice", now); !ok || err != nil {
		t.Fatalf("Add whose first reply was lost: %v %v", ok, err)
	}
	if p.lost.Load() != 1 {
		t.Fatalf("proxy lost %d replies, want 1", p.lost.Load())
	}
	key, _ := q.key("alice", false)
	v, err := direct.Get(ctx, key).Result()
	if w, n, _ := strings.Cut(v, " "); err != nil || w == "" || !strings.HasPrefix(n, "2 ") {
		t.Errorf("stored %q %v after two Adds (one resent), want a count of 2", v, err)
	}

	// The batch's charges by Redis TIME, in an hour's window (the minute
	// above is at a fixed instant).
	q = newQuota(t, q.s, 5, time.Hour)
	created := time.Now().Unix()
	charge := func(ids ...int) {
		t.Helper()
		var batch []quotaAdd
		for _, i := range ids {
			batch = append(batch, quotaAdd{actor: "bob", id: fmt.Sprintf("%064x", i), created: created})
		}
		q.sendBatch(batch)
	}
	charge(1)
	p.armed.Store(true)
	charge(2, 3)
	if p.lost.Load() != 2 {
		t.Fatalf("proxy lost %d replies, want 2", p.lost.Load())
	}
	key, _ = q.key("bob", false)
	if v, err := direct.Get(ctx, key).Result(); err != nil || len(strings.Fields(v)) < 2 || strings.Fields(v)[1] != "3" {
		t.Errorf("stored %q %v after 3 events (a batch of 2 resent), want a count of 3", v, err)
	}
}

// bigQuota is the largest events-per-window a quota takes.
const bigQuota = 1<<22 - 1

// TestQuotaAddsBatchedOffPath: Add only queues (no round trip on its
// caller's path); the queued charges of many events go in a few round
// trips, all counted; and Exceeded, which asks no one, learns from its own
// charges' replies that the actor is full — an instance that charged
// nothing since the others filled the window learns it with its next one.
func TestQuotaAddsBatchedOffPath(t *testing.T) {
	srv, _ := realRedis(t)
	ctx := context.Background()
	var qs []*Quota
	var sts []*Store
	for range 3 {
		st := newStore(t, client(t, srv.Addr()), slow)
		sts = append(sts, st)
		qs = append(qs, newQuota(t, st, 50, time.Hour))
	}
	if over, _, err := qs[0].Exceeded(ctx, "alice"); over || err != nil {
		t.Fatalf("Exceeded before any charge = %v %v", over, err)
	}
	if n := sts[0].Stats().RoundTrips; n != 0 {
		t.Fatalf("Exceeded made %d round trips", n)
	}
	for i := range 40 {
		if ok, err := qs[0].Add(ctx, "alice", "", 0); !ok || err != nil {
			t.Fatalf("Add %d = %v %v", i, ok, err)
		}
	}
	qs[0].flushed()
	if n := sts[0].Stats().RoundTrips; n >= 40 || n == 0 {
		t.Errorf("%d round trips for 40 charges", n)
	}
	count := func() string {
		key, _ := qs[0].key("alice", false)
		v, _ := client(t, srv.Addr()).Get(ctx, key).Result()
		if f := strings.Fields(v); len(f) >= 2 {
			return f[1]
		}
		return v
	}
	if c := count(); c != "40" {
		t.Fatalf("count %q after 40 charges", c)
	}
	for i := range 12 {
		q := qs[1+i%2]
		if _, err := q.Add(ctx, "alice", "", 0); err != nil {
			t.Fatal(err)
		}
		q.flushed()
	}
	if c := count(); c != "50" {
		t.Fatalf("count %q, want the quota's 50", c)
	}
	for i, q := range qs[1:] {
		if over, wait, err := q.Exceeded(ctx, "alice"); !over || wait <= 0 || wait > time.Hour || err != nil {
			t.Errorf("instance %d: Exceeded = %v %v %v, want over within the hour", i+1, over, wait, err)
		}
	}
	if over, _, _ := qs[0].Exceeded(ctx, "alice"); over {
		t.Error("instance 0 knows without a charge of its own")
	}
	_, _ = qs[0].Add(ctx, "alice", "", 0)
	qs[0].flushed()
	if over, _, _ := qs[0].Exceeded(ctx, "alice"); !over {
		t.Error("instance 0 refused a charge and does not know")
	}
	if over, _, _ := qs[1].Exceeded(ctx, "bob"); over {
		t.Error("bob is over: another actor's charges answered for him")
	}
}

// TestQuotaCountsWhatWasSigned: three instances on one Redis each charge
// the same event (a re-send from other connections, a copy through other
// gates): the author is charged once in the window. A copy of an event
// created more than a window ago is not charged at all; one without an id
// is charged each time.
func TestQuotaCountsWhatWasSigned(t *testing.T) {
	srv, c := realRedis(t)
	ctx := context.Background()
	var qs []*Quota
	for range 3 {
		qs = append(qs, newQuota(t, newStore(t, client(t, srv.Addr()), slow), 10, time.Hour))
	}
	count := func() string {
		key, _ := qs[0].key("victim", false)
		v, _ := c.Get(ctx, key).Result()
		if f := strings.Fields(v); len(f) >= 2 {
			return f[1]
		}
		return "0"
	}
	now := time.Now().Unix()
	id := strings.Repeat("ab", 32)
	for round := range 3 {
		for _, q := range qs {
			if ok, err := q.Add(ctx, "victim", id, now); !ok || err != nil {
				t.Fatalf("round %d: Add = %v %v", round, ok, err)
			}
			q.flushed()
		}
	}
	if n := count(); n != "1" {
		t.Fatalf("one event sent 9 times through 3 instances counted %s times, want 1", n)
	}
	for i, q := range qs {
		// Redis's clock decides what is recent: a copy from 2 windows ago
		// is old on any machine, one from 59 minutes ago recent on a
		// loaded one too (3599 s ago became old when this test took over
		// a second to get here).
		_, _ = q.Add(ctx, "victim", strings.Repeat("cd", 32), now-2*3600)
		_, _ = q.Add(ctx, "victim", fmt.Sprintf("%064x", i), now-3540)
		q.flushed()
	}
	if n := count(); n != "4" {
		t.Fatalf("count %s after 3 old copies and 3 distinct recent events, want 4", n)
	}
	if ttl := c.PTTL(ctx, qs[0].s.prefix+"{q:victim}:seen:"+id).Val(); ttl <= 0 || ttl > time.Hour {
		t.Errorf("seen key TTL %v, want within the window", ttl)
	}
	_, _ = qs[0].Add(ctx, "victim", "", 0)
	_, _ = qs[1].Add(ctx, "victim", "", 0)
	qs[0].flushed()
	qs[1].flushed()
	if n := count(); n != "6" {
		t.Fatalf("count %s, want 6: events without an id are charged each time", n)
	}
}

// TestQuotaChargesOneCall: on one Redis, a batch of queued charges is one
// script call (one EVALSHA, one TIME), not one per charge, and each charge
// in it is what an Add alone would be: an event charged twice in the batch
// counts once, the actor's charge past the quota is refused (and learnt:
// Exceeded knows), an old copy is not charged, and an actor whose stored
// value is malformed holds up no one else's charge.
func TestQuotaChargesOneCall(t *testing.T) {
	srv, c := realRedis(t)
	ctx := context.Background()
	var seen []error
	opts := slow
	opts.Observe = func(_ time.Duration, err error) { seen = append(seen, err) }
	q := newQuota(t, newStore(t, client(t, srv.Addr()), opts), 3, time.Hour)
	if err := quotaScript.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	carol, _ := q.key("carol", false)
	c.Set(ctx, carol, "garbage", 0)
	now := time.Now().Unix()
	ev := func(i int) string { return fmt.Sprintf("%064x", i) }
	batch := []quotaAdd{
		{actor: "alice", id: ev(1), created: now},
		{actor: "alice", id: ev(1), created: now},
		{actor: "alice", id: ev(2), created: now},
		{actor: "carol", id: ev(9), created: now},
		{actor: "alice", id: ev(3), created: now},
		{actor: "alice", id: ev(4), created: now},
		{actor: "bob", id: ev(5), created: now - 2*3600},
		{actor: "dave", id: ev(6), created: now},
		// A created_at whose ms overflow an int64 (scan takes up to
		// 2^56 s) is unknown, charged: wrapped, it read as an old copy.
		{actor: "erin", id: ev(7), created: 18446744073709552},
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	q.sendBatch(batch)
	info := c.Info(ctx, "commandstats").Val()
	if !strings.Contains(info, "cmdstat_evalsha:calls=1,") || !strings.Contains(info, "cmdstat_time:calls=1,") {
		t.Errorf("9 charges made these calls, want one EVALSHA and one TIME:\n%s", info)
	}
	count := func(actor string) string {
		key, _ := q.key(actor, false)
		v, err := c.Get(ctx, key).Result()
		if err != nil {
			return err.Error()
		}
		if f := strings.Fields(v); len(f) >= 2 {
			return f[1]
		}
		return v
	}
	for actor, want := range map[string]string{"alice": "3", "bob": "redis: nil", "carol": "garbage", "dave": "1", "erin": "1"} {
		if got := count(actor); got != want {
			t.Errorf("%s: count %q, want %q", actor, got, want)
		}
	}
	if over, wait, _ := q.Exceeded(ctx, "alice"); !over || wait <= 0 {
		t.Errorf("alice refused in the batch, Exceeded = %v %v", over, wait)
	}
	if over, _, _ := q.Exceeded(ctx, "dave"); over {
		t.Error("dave is over after one charge")
	}
	if st := q.s.Stats(); st.RoundTrips != 1 || st.RoundTripFailures != 0 {
		t.Errorf("stats %+v, want one round trip, no failure", st)
	}
	if len(seen) != 1 || !errors.Is(seen[0], errQuotaMalformed) {
		t.Errorf("observed %v, want the one round trip with carol's malformed value", seen)
	}
	// The same created_at in a charge of its own.
	if ok, err := q.addEventAt(ctx, "frank", ev(8), 18446744073709552, time.Time{}); !ok || err != nil {
		t.Fatalf("charge with a created_at past int64 ms: %v %v", ok, err)
	}
	if got := count("frank"); got != "1" {
		t.Errorf("frank: count %q after an event dated past int64 ms, want 1", got)
	}
}
