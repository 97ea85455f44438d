package relay

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// countingGuard counts the calls a gate makes of its Guard.
type countingGuard struct {
	ratelimit.Guard
	calls atomic.Int64
}

func (c *countingGuard) Hold(ctx context.Context, client string, aggs []string, max int) (time.Duration, bool, error) {
	c.calls.Add(1)
	return c.Guard.Hold(ctx, client, aggs, max)
}

func (c *countingGuard) Release(client string) {
	c.calls.Add(1)
	c.Guard.Release(client)
}

func (c *countingGuard) Violate(ctx context.Context, keys []string, points float64, p ratelimit.Penalty) (string, time.Duration, bool, error) {
	c.calls.Add(1)
	return c.Guard.Violate(ctx, keys, points, p)
}

// instance is one gate of several sharing a Redis, as one sluice process.
type instance struct {
	g       *Gate
	url     string
	guard   *countingGuard
	limiter *ratelimit.Limiter
}

// storeCalls is every call the instance made of the store: its limiter's
// and its guard's.
func (in *instance) storeCalls() int64 {
	return int64(in.limiter.Stats().StoreCalls) + in.guard.calls.Load()
}

// sharedGates starts n gates on the Redis at addr, each with a store, a
// limiter on clock (nil: the real one) and a guard of its own (lease 0:
// the default), configured by opts.
func sharedGates(t *testing.T, addr string, n int, lease time.Duration, clock ratelimit.Clock, opts Options) []*instance {
	t.Helper()
	var out []*instance
	for range n {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		st, err := redisstore.New(c, redisstore.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		gd, err := redisstore.NewGuard(st, lease)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = gd.Close() })
		in := &instance{guard: &countingGuard{Guard: gd}, limiter: ratelimit.NewLimiter(st, clock)}
		o := opts
		o.Limiter, o.Guard = in.limiter, in.guard
		in.g = newGate(t, o)
		in.url = serve(t, in.g.Wrap(newRecorder()))
		out = append(out, in)
	}
	return out
}

// upgrade dials url once and returns the open connection (nil when
// refused), the status and the Retry-After of a refusal.
func upgrade(t *testing.T, url string) (*websocket.Conn, int, string) {
	t.Helper()
	c, resp, err := websocket.DefaultDialer.Dial(url, nil)
	if err == nil {
		t.Cleanup(func() { c.Close() })
		return c, http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	return nil, resp.StatusCode, resp.Header.Get("Retry-After")
}

// TestSharedCapAcrossInstances: one address opening three times the cap at
// once across three instances on one Redis holds the cap and no more (k =
// 0: every Hold is one atomic script call on the client's key); each
// refusal is a 429 with a Retry-After.
func TestSharedCapAcrossInstances(t *testing.T) {
	srv := redistest.Start(t)
	const cap = 4
	ins := sharedGates(t, srv.Addr(), 3, 0, nil, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxConnections: cap})
	var mu sync.Mutex
	open, refused := 0, 0
	var wg sync.WaitGroup
	for _, in := range ins {
		for range cap {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, code, ra := upgrade(t, in.url)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case c != nil:
					open++
				case code == http.StatusTooManyRequests && ra == "5":
					refused++
				default:
					t.Errorf("refused with %d, Retry-After %q; want 429 with 5", code, ra)
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("one address, %d upgrades over 3 instances, cap %d: %d held open, %d refused", 3*cap, cap, open, refused)
	if open != cap || refused != 2*cap {
		t.Fatalf("%d connections held open across 3 instances, %d refused; want the cap %d and %d", open, refused, cap, 2*cap)
	}
}

// TestSharedCapDeadInstanceFreed: an instance that stops renewing its
// leases without closing anything (killed) stops counting once its lease
// ends, within one lease of its kill; the others' connections still count.
func TestSharedCapDeadInstanceFreed(t *testing.T) {
	srv := redistest.Start(t)
	const cap, lease = 3, 2 * time.Second
	ins := sharedGates(t, srv.Addr(), 3, lease, nil, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxConnections: cap})
	for _, in := range ins {
		if c, code, _ := upgrade(t, in.url); c == nil {
			t.Fatalf("refused %d below the cap", code)
		}
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	ctx := context.Background()
	_ = ins[2].guard.Guard.Close() // kill -9: no more renewals, nothing released
	killed, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Wait, with a deadline, for Redis's clock to pass a lease end that
	// was not renewed: the killed instance's. The live instances' renewals
	// may delete its expired entry before a poll sees it (a loaded
	// machine polls late), so an entry gone is read at the lease end it
	// last had.
	leaseEnd := func(v string) int64 {
		_, exp, _ := strings.Cut(v, " ")
		ms, _ := strconv.ParseInt(exp, 10, 64)
		return ms
	}
	before, err := rc.HGetAll(ctx, "sluice:{127.0.0.1}:conns").Result()
	if err != nil {
		t.Fatal(err)
	}
	var freedAt time.Time
	for deadline := time.Now().Add(5 * lease); freedAt.IsZero(); {
		now, err := rc.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		all, err := rc.HGetAll(ctx, "sluice:{127.0.0.1}:conns").Result()
		if err != nil {
			t.Fatal(err)
		}
		for id, v := range before {
			cur, ok := all[id]
			switch {
			case !ok:
				freedAt = time.UnixMilli(leaseEnd(v))
			case leaseEnd(cur) <= now.UnixMilli():
				freedAt = time.UnixMilli(leaseEnd(cur))
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lease ended %v after the kill: %v", 5*lease, all)
		}
		time.Sleep(20 * time.Millisecond) // waiting for Redis's clock, with a deadline
	}
	if d := freedAt.Sub(killed); d > lease {
		t.Fatalf("the killed instance's lease ended %v after the kill, past the lease %v", d, lease)
	}
	t.Logf("the killed instance's connection stopped counting %v after the kill (lease %v)", freedAt.Sub(killed).Round(time.Millisecond), lease)
	if c, code, _ := upgrade(t, ins[0].url); c == nil {
		t.Fatalf("after the killed instance's lease: refused %d", code)
	}
	if c, code, _ := upgrade(t, ins[1].url); c != nil || code != http.StatusTooManyRequests {
		t.Fatalf("past the cap with the live instances' connections: %d", code)
	}
}

// TestSharedBanEveryInstance: a client banned on one instance (its
// invalid frames reached the threshold) is refused at the upgrade by every
// instance with 429 and the same Retry-After (±1 s), never admitted; after
// each instance has refused it once, its upgrades cost no store call at
// all (neither the limiter's nor the guard's, and Redis sees no command).
func TestSharedBanEveryInstance(t *testing.T) {
	srv := redistest.Start(t)
	lim := policy.Limits{Connection: []ratelimit.Limit{ratelimit.PerPeriod(1000, time.Second)}}
	pen := &ratelimit.Penalty{Threshold: 1, Ban: time.Minute}
	ins := sharedGates(t, srv.Addr(), 3, 0, nil, Options{Policy: policy.Config{Limits: &lim, Penalty: pen}, MaxConnections: 8})
	c, _, _ := upgrade(t, ins[0].url)
	if c == nil {
		t.Fatal("refused before any violation")
	}
	// Eight invalid frames make the one point of the threshold.
	for range 8 {
		if err := c.WriteMessage(websocket.TextMessage, []byte(`["EVENT",{}]`)); err != nil {
			break
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var closeErr error
	for closeErr == nil {
		_, _, closeErr = c.ReadMessage()
	}
	if ce, ok := closeErr.(*websocket.CloseError); !ok || !strings.Contains(ce.Text, "banned") {
		t.Fatalf("the violating connection ended with %v, want a close telling the ban", closeErr)
	}
	var waits []int
	for round := range 3 {
		for i, in := range ins {
			before := in.storeCalls()
			conn, code, ra := upgrade(t, in.url)
			if conn != nil || code != http.StatusTooManyRequests {
				t.Fatalf("instance %d admitted a banned client (%d)", i, code)
			}
			s, err := strconv.Atoi(ra)
			if err != nil || s < 59 || s > 60 {
				t.Fatalf("instance %d: Retry-After %q, want the ban's remaining 60 s", i, ra)
			}
			waits = append(waits, s)
			if calls := in.storeCalls() - before; round > 0 && calls != 0 {
				t.Fatalf("instance %d: a banned client's upgrade cost %d store calls", i, calls)
			}
		}
		if round == 0 {
			continue
		}
	}
	lo, hi := waits[0], waits[0]
	for _, w := range waits {
		lo, hi = min(lo, w), max(hi, w)
	}
	if hi-lo > 1 {
		t.Fatalf("Retry-After across instances %v: more than 1 s apart", waits)
	}
	// Redis itself sees nothing of further banned upgrades.
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	processed := func() int64 {
		info, err := rc.Info(context.Background(), "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no total_commands_processed in INFO stats")
		return 0
	}
	before := processed()
	const more = 30
	for i := range more {
		if conn, _, _ := upgrade(t, ins[i%3].url); conn != nil {
			t.Fatal("a banned client admitted")
		}
	}
	after := processed()
	t.Logf("Retry-After on 3 instances over 3 rounds: %v; %d more banned upgrades: %d Redis commands (the INFO call itself excluded)", waits, more, after-before-1)
	if after-before-1 != 0 {
		t.Fatalf("%d banned upgrades cost Redis %d commands", more, after-before-1)
	}
}

// TestSharedCapRetryAfterTrue: the cap's Retry-After is true: an upgrade a
// second before it is refused (from the deny cache, no store call), one at
// it is decided afresh and admitted when a place is free (here one that a
// connection on another instance gave back).
func TestSharedCapRetryAfterTrue(t *testing.T) {
	srv := redistest.Start(t)
	clk := nostrtest.NewClock()
	closed := make(chan struct{}, 4)
	obs := &policy.Observer{Open: func(d int) {
		if d < 0 {
			closed <- struct{}{}
		}
	}}
	ins := sharedGates(t, srv.Addr(), 2, 0, clk.Now, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxConnections: 2, Observer: obs})
	a, b := ins[0], ins[1]
	upgrade(t, a.url)
	other, _, _ := upgrade(t, b.url)
	if other == nil {
		t.Fatal("refused below the cap")
	}
	_, code, ra := upgrade(t, a.url)
	if code != http.StatusTooManyRequests || ra != "5" {
		t.Fatalf("past the cap: %d, Retry-After %q; want 429 and 5", code, ra)
	}
	// The connection on b closes: a place is free, but a was told 5 s.
	other.Close()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("b did not see its connection close")
	}
	// b gives the place back in the background: wait, bounded, until
	// Redis counts b's connections no more.
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		n, err := rc.HLen(context.Background(), "sluice:{127.0.0.1}:conns").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's release not in Redis: %d instances counted", n)
		}
	}
	clk.Advance(4 * time.Second)
	before := a.storeCalls()
	if c, code, ra := upgrade(t, a.url); c != nil || code != http.StatusTooManyRequests || ra != "1" {
		t.Fatalf("a second before the Retry-After: admitted %v, %d, Retry-After %q; want 429 and 1", c != nil, code, ra)
	}
	if n := a.storeCalls() - before; n != 0 {
		t.Fatalf("an upgrade in the hold-off cost %d store calls", n)
	}
	clk.Advance(time.Second)
	if c, code, _ := upgrade(t, a.url); c == nil {
		t.Fatalf("at the Retry-After, with a place free: refused %d", code)
	}
}

// TestUnavailableRetryAfter: with the store down, an upgrade is refused
// 503 with a Retry-After, whichever call fails (the connection limit's or
// the cap's).
func TestUnavailableRetryAfter(t *testing.T) {
	srv := redistest.Start(t)
	lim := policy.Limits{Connection: []ratelimit.Limit{ratelimit.PerPeriod(1000, time.Second)}}
	withLimit := sharedGates(t, srv.Addr(), 1, 0, nil, Options{Policy: policy.Config{Limits: &lim}})[0]
	capOnly := sharedGates(t, srv.Addr(), 1, 0, nil, Options{Policy: policy.Config{Limits: &policy.Limits{}}})[0]
	srv.Kill()
	for name, in := range map[string]*instance{"connection limit": withLimit, "cap": capOnly} {
		if c, code, ra := upgrade(t, in.url); c != nil || code != http.StatusServiceUnavailable || ra != "5" {
			t.Errorf("%s with the store down: admitted %v, %d, Retry-After %q; want 503 and 5", name, c != nil, code, ra)
		}
	}
}

// The Redis quota's room is decided with the frame's own decision (on one
// Redis in its script call, on a Cluster beside it), so an actor at its
// limit is refused on every instance at once: two events by one author
// accepted through instance a fill its quota of 2, and the third, sent
// through instance b, whose own quota has charged nothing and so knows
// nothing of a's charges, is refused without reaching the relay. With the
// room asked from each instance's memory of its own charges, b forwards
// it and the relay stores a third event.
func TestSharedQuotaRoomAcrossInstances(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Start(t)
		sharedQuotaRoom(t, func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		})
	})
	t.Run("cluster", func(t *testing.T) {
		var addrs []string
		for _, s := range redistest.StartCluster(t) {
			addrs = append(addrs, s.Addr())
		}
		sharedQuotaRoom(t, func() redis.UniversalClient {
			c, err := redisstore.NewClient("redis+cluster://" + strings.Join(addrs, ","))
			if err != nil {
				t.Fatal(err)
			}
			return c
		})
	})
}

// sharedQuotaRoom runs TestSharedQuotaRoomAcrossInstances with two gates,
// each on a client of its own from newClient.
func sharedQuotaRoom(t *testing.T, newClient func() redis.UniversalClient) {
	rec := newRecorder()
	rec.answerOK = func(hex32) bool { return true }
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Second)}
	var urls []string
	var admin redis.UniversalClient
	for range 2 {
		c := newClient()
		t.Cleanup(func() { _ = c.Close() })
		admin = c
		st, err := redisstore.New(c, redisstore.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		q, err := redisstore.NewQuota(st, 2, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		lim := ratelimit.NewLimiter(st, nil)
		g := newGate(t, Options{UpstreamVerifies: true, Limiter: lim, Policy: policy.Config{Limits: &l, Quota: q}})
		urls = append(urls, serve(t, g.Wrap(rec)))
	}
	a, b := dialRaw(t, urls[0]), dialRaw(t, urls[1])
	send := func(c *websocket.Conn, n int) string {
		t.Helper()
		if err := c.WriteMessage(websocket.TextMessage, []byte(eventFrame(n, pubkeyN(1)))); err != nil {
			t.Fatal(err)
		}
		return readText(t, c)
	}
	for n := 1; n <= 2; n++ {
		if got, want := send(a, n), okReply(n, true, ""); got != want {
			t.Fatalf("event %d through a: %s, want %s", n, got, want)
		}
	}
	// a's charges go in the background, after the relay's OK: wait for
	// Redis to hold both.
	for deadline := time.Now().Add(nostrtest.Timeout); ; time.Sleep(10 * time.Millisecond) {
		v, _ := admin.Get(context.Background(), "sluice:{q:"+pubkeyN(1)+"}:quota:3600000").Result()
		if f := strings.Fields(v); len(f) >= 2 && f[1] == "2" { // "<window> <count> <id>"
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("instance a's charges never reached Redis")
		}
	}
	got := send(b, 3)
	id := evID(3)
	if !strings.HasPrefix(got, fmt.Sprintf(`["OK","%x",false,"rate-limited: quota: 2 events per 3600s for this pubkey; retry in `, id[:])) {
		t.Fatalf("third event through b: %s, want refused by the quota", got)
	}
	for _, f := range rec.frames(0) {
		if strings.Contains(f, fmt.Sprintf("%x", id[:])) {
			t.Fatal("the event refused by the quota reached the relay")
		}
	}
}
