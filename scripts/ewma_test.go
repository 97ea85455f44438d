package scripts_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/scripts"
)

// servers runs f against miniredis and against a real redis-server (when
// there is one), so the script's behaviour is pinned on both.
func servers(t *testing.T, f func(t *testing.T, c *redis.Client)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		defer c.Close()
		f(t, c)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer c.Close()
		f(t, c)
	})
}

var ewma = redis.NewScript(scripts.EWMA)

const now = "1767322800000" // a fixed instant in unix ms

// one window of rate 2, half-life 1s, cost 1.
var keys = []string{"t:{c}:message:EVENT:1000"}

// single is the ARGV of a call that decides one message (m = 1, L = 1) at
// instant at against the windows limits (rate, half-life, cost, ...).
func single(at, reqid string, limits ...any) []any {
	args := []any{at, 1, len(limits) / 3}
	args = append(args, limits...)
	return append(args, 1, reqid)
}

func run(t *testing.T, c *redis.Client, reqid string) []any {
	t.Helper()
	v, err := ewma.Run(context.Background(), c, keys, single(now, reqid, 2, 1000, 1)...).Slice()
	if err != nil {
		t.Fatalf("reqid %q: %v", reqid, err)
	}
	return v
}

// decision is one message of a batch call: its key (one, holding every
// window), the index (1-based) of its limit list and its request id.
type decision struct {
	keys []string
	list int
	id   string
}

// batch decides decs in one call at instant at; lists are the call's limit
// lists, each (rate, half-life, cost, ...). It returns each decision's
// reply (2 + n entries each).
func batch(t *testing.T, c *redis.Client, at string, lists [][]any, decs ...decision) [][]any {
	t.Helper()
	var ks []string
	args := []any{at, len(lists)}
	for _, l := range lists {
		args = append(args, len(l)/3)
		args = append(args, l...)
	}
	for _, d := range decs {
		ks = append(ks, d.keys...)
		args = append(args, d.list, d.id)
	}
	v, err := ewma.Run(context.Background(), c, ks, args...).Slice()
	if err != nil {
		t.Fatalf("batch of %d: %v", len(decs), err)
	}
	windows := 0
	for _, d := range decs {
		windows += len(lists[d.list-1]) / 3
	}
	if len(v) != windows+2*len(decs) {
		t.Fatalf("batch of %d decisions, %d windows: %d entries %v", len(decs), windows, len(v), v)
	}
	out := make([][]any, len(decs))
	for i, d := range decs {
		n := 2 + len(lists[d.list-1])/3
		out[i], v = v[:n], v[n:]
	}
	return out
}

var ewmaCluster = redis.NewScript(scripts.EWMACluster)

// clusterBatch is batch through scripts.EWMACluster: the first decision's
// key declared, the others after the arguments, then their count. ok is
// false where the server does not run the shebang (miniredis).
func clusterBatch(t *testing.T, c *redis.Client, at string, lists [][]any, decs ...decision) (out [][]any, ok bool) {
	t.Helper()
	if err := ewmaCluster.Load(context.Background(), c).Err(); err != nil {
		return nil, false
	}
	args := []any{at, len(lists)}
	for _, l := range lists {
		args = append(args, len(l)/3)
		args = append(args, l...)
	}
	for _, d := range decs {
		args = append(args, d.list, d.id)
	}
	for _, d := range decs[1:] {
		args = append(args, d.keys[0])
	}
	args = append(args, len(decs)-1)
	v, err := ewmaCluster.Run(context.Background(), c, decs[0].keys, args...).Slice()
	if err != nil {
		t.Fatalf("cluster batch of %d: %v", len(decs), err)
	}
	for _, d := range decs {
		n := 2 + len(lists[d.list-1])/3
		if len(v) < n {
			t.Fatalf("cluster batch: %d entries short", n-len(v))
		}
		out, v = append(out, v[:n]), v[n:]
	}
	if len(v) != 0 {
		t.Fatalf("cluster batch: %d entries too many", len(v))
	}
	return out, true
}

// alone decides each of decs in a call of its own at instant at (what the
// batch must agree with).
func alone(t *testing.T, c *redis.Client, at string, lists [][]any, decs ...decision) [][]any {
	t.Helper()
	out := make([][]any, len(decs))
	for i, d := range decs {
		v, err := ewma.Run(context.Background(), c, d.keys, single(at, d.id, lists[d.list-1]...)...).Slice()
		if err != nil {
			t.Fatalf("decision %d alone: %v", i+1, err)
		}
		out[i] = v
	}
	return out
}

// values returns the stored value of every key ("" for none).
func values(t *testing.T, c *redis.Client, ks ...string) []string {
	t.Helper()
	out := make([]string, len(ks))
	for i, k := range ks {
		v, err := c.Get(context.Background(), k).Result()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		out[i] = v
	}
	return out
}

// TestRequestIDChargesOnce: the same request id run twice (what a go-redis
// retry after a lost reply does) charges once and returns the same reply;
// without an id, the repeat charges again.
func TestRequestIDChargesOnce(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		first := run(t, c, "req-1")
		again := run(t, c, "req-1")
		if len(first) != 3 || first[0] != int64(1) || first[2] != "1" {
			t.Fatalf("first reply %v, want [1 0 \"1\"]", first)
		}
		if !slices.Equal(first, again) {
			t.Errorf("repeat of req-1 replied %v, first %v", again, first)
		}
		if v, _ := c.Get(context.Background(), keys[0]).Result(); v != "1 "+now+" req-1" {
			t.Errorf("stored %q after one request run twice, want score 1 and the id", v)
		}
		// Without an id the same call charges twice: the hazard the id removes.
		run(t, c, "")
		if v, _ := c.Get(context.Background(), keys[0]).Result(); !strings.HasPrefix(v, "2 ") {
			t.Errorf("stored %q, want score 2", v)
		}
	})
}

// TestRequestIDsKept: the first window keeps the last 4 admitted ids,
// newest first; a repeat of any of them charges nothing and answers with
// every window's stored score; an id pushed out of the list charges again
// (the documented limit of the guard).
func TestRequestIDsKept(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		two := []string{"t:{d}:message:EVENT:1000:60000"}
		call := func(id string) []any {
			v, err := ewma.Run(ctx, c, two, single(now, id, 100, 1000, 1, 1000, 60000, 1)...).Slice()
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return v
		}
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			call(id)
		}
		if v, _ := c.Get(ctx, two[0]).Result(); v != "5 "+now+" 5 "+now+" e d c b" {
			t.Errorf("stored %q, want both windows at score 5 and ids e d c b", v)
		}
		if r := call("b"); !slices.Equal(r, []any{int64(1), int64(0), "5", "5"}) {
			t.Errorf("repeat of b: %v, want [1 0 5 5]", r)
		}
		if v, _ := c.Get(ctx, two[0]).Result(); !strings.HasPrefix(v, "5 ") {
			t.Errorf("repeat of b charged: %q", v)
		}
		if r := call("a"); !slices.Equal(r, []any{int64(1), int64(0), "6", "6"}) {
			t.Errorf("a, pushed out of the list, is charged as new: got %v", r)
		}
	})
}

// TestRequestIDWholeMatch: a request id matches a kept id only whole, not
// as a part of a longer one.
func TestRequestIDWholeMatch(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		call := func(id string) []any {
			v, err := ewma.Run(ctx, c, keys, single(now, id, 100, 1000, 1)...).Slice()
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return v
		}
		call("xreq-12")
		call("ab")
		for i, id := range []string{"req-1", "req-12", "xreq-1", "a"} {
			if r := call(id); r[2] != strconv.Itoa(3+i) {
				t.Errorf("%q (not kept) was not charged: %v", id, r)
			}
		}
		if r := call("a"); r[2] != "6" {
			t.Errorf("a kept id was charged again: %v", r)
		}
	})
}

// TestRefusalWritesNothing: a refused request leaves the windows and the
// kept ids untouched.
func TestRefusalWritesNothing(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		run(t, c, "")
		run(t, c, "")
		before, _ := c.Get(ctx, keys[0]).Result()
		ttlBefore, _ := c.PTTL(ctx, keys[0]).Result()
		r := run(t, c, "req-1")
		if r[0] != int64(0) || r[1] != int64(1000) || r[2] != "2" {
			t.Fatalf("third at one instant: %v, want [0 1000 \"2\"]", r)
		}
		after, _ := c.Get(ctx, keys[0]).Result()
		if after != before {
			t.Errorf("refusal changed the window: %q → %q", before, after)
		}
		if ttl, _ := c.PTTL(ctx, keys[0]).Result(); ttl > ttlBefore {
			t.Errorf("refusal extended the TTL: %v → %v", ttlBefore, ttl)
		}
		if strings.Contains(after, "req-1") {
			t.Error("refusal recorded its request id")
		}
	})
}

// TestSameKeyInOneCall: messages of one client in one call are decided in
// order, each seeing what the ones before it wrote, exactly as if each had
// had a call of its own at the same instant.
func TestSameKeyInOneCall(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		// Rate 2, cost 1, from rest: admitted, admitted, refused.
		d := decision{keys, 1, ""}
		lists := [][]any{{2, 1000, 1}}
		got := batch(t, c, now, lists, d, d, d)
		want := [][]any{{int64(1), int64(0), "1"}, {int64(1), int64(0), "2"}, {int64(0), int64(1000), "2"}}
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("decision %d: %v, want %v", i+1, got[i], want[i])
			}
		}
		if v := values(t, c, keys[0]); v[0] != "2 "+now {
			t.Errorf("stored %q, want 2 at now", v[0])
		}
		if r := run(t, c, ""); !slices.Equal(r, got[2]) {
			t.Errorf("a call of its own after the batch: %v, the batch's third %v", r, got[2])
		}

		// Two windows with a decayed score, a wait that is not round, and
		// ids: the batch and three calls of their own (on another client
		// with the same stored values) agree on every reply and value.
		lists = [][]any{{3.5, 1000, 1, 50, 60000, 1}}
		at := "1767322799700" // 300 ms before now
		b := []string{"t:{e}:message:EVENT:1000:60000"}
		s := []string{"t:{f}:message:EVENT:1000:60000"}
		for _, ks := range [][]string{b, s} {
			c.Set(ctx, ks[0], "1.5 "+at+" 7.25 "+at+" old", 0)
		}
		got = batch(t, c, now, lists, decision{b, 1, "x1"}, decision{b, 1, "x2"}, decision{b, 1, "x3"})
		sep := alone(t, c, now, lists, decision{s, 1, "x1"}, decision{s, 1, "x2"}, decision{s, 1, "x3"})
		for i := range got {
			if !slices.Equal(got[i], sep[i]) {
				t.Errorf("decision %d: batch %v, alone %v", i+1, got[i], sep[i])
			}
		}
		if got[0][0] != int64(1) || got[1][0] != int64(1) || got[2][0] != int64(0) {
			t.Errorf("want admitted, admitted, refused: %v", got)
		}
		if w, _ := got[2][1].(int64); w <= 1 || w%1000 == 0 {
			t.Errorf("wait %v: the test wants one that is not a whole period", got[2][1])
		}
		vb, vs := values(t, c, b...), values(t, c, s...)
		if !slices.Equal(vb, vs) {
			t.Errorf("stored by the batch %q, by calls of their own %q", vb, vs)
		}
		if !strings.HasSuffix(vb[0], " "+now+" x2 x1 old") {
			t.Errorf("stored %q, want the ids x2 x1 old", vb[0])
		}
	})
}

// TestClientsInOneCall: messages of different clients with different limit
// lists in one call get the replies and leave the values that one call each
// at the same instant gives.
func TestClientsInOneCall(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		lists := [][]any{
			{2, 1000, 1},
			{10, 1000, 1, 240, 60000, 1},
			{5, 1000, 1, 50, 10000, 1, 500, 100000, 2.5},
		}
		ks := func(client string, n int) []string {
			return []string{"t:{" + client + "}:message:EVENT" + []string{":1000", ":1000:60000", ":1000:60000:100000"}[n-1]}
		}
		seed := func() {
			c.FlushAll(ctx)
			c.Set(ctx, "t:{a}:message:EVENT:1000", "1.25 1767322799500 a0", 0)
			c.Set(ctx, "t:{d}:message:EVENT:1000", "2 "+now, 0) // full: refused
			c.Set(ctx, "t:{b}:message:EVENT:1000:60000", "9.5 1767322799900 100 1767322700000", 0)
			c.Set(ctx, "t:{e}:message:EVENT:1000:60000:100000", "3 1767322799000 40 1767322799000 480 1767322799000", 0)
		}
		decs := []decision{
			{ks("a", 1), 1, "a1"},
			{ks("b", 2), 2, "b1"},
			{ks("c", 2), 2, ""},
			{ks("e", 3), 3, "e1"},
			{ks("a", 1), 1, "a2"},
			{ks("d", 1), 1, "d1"},
			{ks("b", 2), 2, "b2"},
			{ks("e", 3), 3, "e2"},
			{ks("a", 1), 1, "a3"},
		}
		var all []string
		for _, d := range decs {
			if !slices.Contains(all, d.keys[0]) {
				all = append(all, d.keys[0])
			}
		}
		seed()
		got := batch(t, c, now, lists, decs...)
		vb := values(t, c, all...)
		seed()
		sep := alone(t, c, now, lists, decs...)
		vs := values(t, c, all...)
		refused := 0
		for i := range decs {
			if !slices.Equal(got[i], sep[i]) {
				t.Errorf("decision %d: batch %v, alone %v", i+1, got[i], sep[i])
			}
			if got[i][0] == int64(0) {
				refused++
			}
		}
		if refused == 0 || refused == len(decs) {
			t.Errorf("%d of %d refused: the test wants both outcomes", refused, len(decs))
		}
		if !slices.Equal(vb, vs) {
			t.Errorf("stored by the batch %q, by calls of their own %q", vb, vs)
		}
	})
}

// TestBatchEqualsAlone: random batches (clients repeated, ids repeated,
// decayed and future scores, full budgets, malformed values, one to three
// windows) give the replies and leave the values that one call per message
// at the same instant gives.
func TestBatchEqualsAlone(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(1, 2))
		lists := [][]any{
			{2, 1000, 1},
			{10, 1000, 1, 240, 60000, 1},
			{5, 1000, 1, 50, 10000, 1, 500, 100000, 2.5},
			{1.0001, 3600000, 1},
		}
		periods := []string{"1000", "60000", "100000"}
		nowms, _ := strconv.ParseInt(now, 10, 64)
		clustered := 0
		defer func() {
			if clustered == 0 && strings.HasSuffix(t.Name(), "/redis") {
				t.Error("the cluster variant never ran on redis-server")
			}
		}()
		for round := 0; round < 100; round++ {
			var decs []decision
			seeds := map[string]string{}
			var all []string
			for d := 1 + rng.IntN(16); d > 0; d-- {
				cl := strconv.Itoa(rng.IntN(5))
				l := 1 + rng.IntN(len(lists))
				n := len(lists[l-1]) / 3
				ks := []string{"t:{" + cl + "}:" + strconv.Itoa(l) + ":" + strings.Join(periods[:n], ":")}
				if _, ok := seeds[ks[0]]; !ok {
					// Every window in one value: fresh, decayed or ahead
					// of now; now and then junk, a window short, or ids.
					var parts []string
					for i := range n {
						r, _ := lists[l-1][3*i].(int)
						score := rng.Float64() * float64(max(r, 1)+1)
						at := nowms - int64(rng.IntN(5000)) + 300
						parts = append(parts, strconv.FormatFloat(score, 'g', 17, 64)+" "+strconv.FormatInt(at, 10))
					}
					switch x := rng.IntN(12); {
					case x == 0:
						seeds[ks[0]] = "junk"
					case x == 1 && n > 1:
						seeds[ks[0]] = strings.Join(parts[1:], " ")
					case x < 4:
						seeds[ks[0]] = strings.Join(parts, " ") + " id" + strconv.Itoa(rng.IntN(6)) + " zz"
					case x < 9:
						seeds[ks[0]] = strings.Join(parts, " ")
					default:
						seeds[ks[0]] = ""
					}
					all = append(all, ks[0])
				}
				id := ""
				if rng.IntN(3) > 0 {
					id = "id" + strconv.Itoa(rng.IntN(6))
				}
				decs = append(decs, decision{ks, l, id})
			}
			seed := func() {
				c.FlushAll(ctx)
				for k, v := range seeds {
					if v != "" {
						c.Set(ctx, k, v, 0)
					}
				}
			}
			seed()
			got := batch(t, c, now, lists, decs...)
			vb := values(t, c, all...)
			seed()
			sep := alone(t, c, now, lists, decs...)
			vs := values(t, c, all...)
			for i := range decs {
				if !slices.Equal(got[i], sep[i]) {
					t.Errorf("round %d decision %d %v: batch %v, alone %v", round, i+1, decs[i], got[i], sep[i])
				}
			}
			// The cluster variant, on the same table, to the last byte.
			seed()
			if gc, ok := clusterBatch(t, c, now, lists, decs...); ok {
				for i := range decs {
					if !slices.Equal(gc[i], got[i]) {
						t.Errorf("round %d decision %d %v: cluster variant %v, batch %v", round, i+1, decs[i], gc[i], got[i])
					}
				}
				if vc := values(t, c, all...); !slices.Equal(vc, vb) {
					t.Errorf("round %d: stored by the cluster variant %q, by the batch %q", round, vc, vb)
				}
				clustered++
			}
			if !slices.Equal(vb, vs) {
				t.Errorf("round %d: stored by the batch %q, by calls of their own %q", round, vb, vs)
			}
		}
	})
}

// TestErrorInOneDecision: a malformed stored value, or a window missing for
// a seen request, fails that decision only (-1, the message, empty scores);
// it writes nothing, and the other decisions of the call are decided and
// written.
func TestErrorInOneDecision(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		lists := [][]any{{10, 1000, 1, 240, 60000, 1}}
		win := func(client string) []string {
			return []string{"t:{" + client + "}:message:EVENT:1000:60000"}
		}
		for _, bad := range []string{"garbage", "x 1", "1 x", "-1 5", "nan 5", "inf 5", "1 2.5", "1 -5", ""} {
			c.FlushAll(ctx)
			c.Set(ctx, win("b")[0], "1 "+now+" "+bad, 0)         // the second window malformed
			c.Set(ctx, win("s")[0], "3 "+now+" seen", 0)         // seen, second window missing
			c.Set(ctx, win("u")[0], "3 "+now+" "+bad+" seen", 0) // seen, second window malformed
			got := batch(t, c, now, lists,
				decision{win("a"), 1, "a"},
				decision{win("b"), 1, "b"},
				decision{win("s"), 1, "seen"},
				decision{win("u"), 1, "seen"},
				decision{win("a"), 1, ""},
			)
			want := [][]any{
				{int64(1), int64(0), "1", "1"},
				{int64(-1), "ERR sluice ewma: malformed value at " + win("b")[0], "", ""},
				{int64(-1), "ERR sluice ewma: malformed value at " + win("s")[0], "", ""},
				{int64(-1), "ERR sluice ewma: malformed value at " + win("u")[0], "", ""},
				{int64(1), int64(0), "2", "2"},
			}
			for i := range want {
				if !slices.Equal(got[i], want[i]) {
					t.Errorf("stored %q: decision %d: %v, want %v", bad, i+1, got[i], want[i])
				}
			}
			v := values(t, c, append(append(append(win("a"), win("b")...), win("s")...), win("u")...)...)
			if wantv := []string{"2 " + now + " 2 " + now + " a", "1 " + now + " " + bad, "3 " + now + " seen", "3 " + now + " " + bad + " seen"}; !slices.Equal(v, wantv) {
				t.Errorf("stored %q: values %q, want %q", bad, v, wantv)
			}
		}
	})
}

// TestWholeCallErrors: arguments that do not follow the contract fail the
// whole call with an error reply, and nothing is written.
func TestWholeCallErrors(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		two := []string{keys[0], "t:{x}:message:EVENT:1000"}
		for name, tc := range map[string]struct {
			keys []string
			args []any
		}{
			"no args":             {keys, nil},
			"only now":            {keys, []any{now}},
			"L zero":              {keys, []any{now, 0, 1, 2, 1000, 1, 1, ""}},
			"L negative":          {keys, []any{now, -1, 1, 2, 1000, 1, 1, ""}},
			"L not a number":      {keys, []any{now, "x", 1, 2, 1000, 1, 1, ""}},
			"L fractional":        {keys, []any{now, 1.5, 1, 2, 1000, 1, 1, ""}},
			"L more than lists":   {keys, []any{now, 2, 1, 2, 1000, 1, 1, ""}},
			"L fewer than lists":  {two, []any{now, 1, 1, 2, 1000, 1, 1, 2, 1000, 1, 1, "", 2, ""}},
			"n zero":              {keys, []any{now, 1, 0, 1, ""}},
			"n not a number":      {keys, []any{now, 1, "x", 2, 1000, 1, 1, ""}},
			"n beyond the args":   {keys, []any{now, 1, 2, 2, 1000, 1, 1, ""}},
			"missing cost":        {keys, []any{now, 1, 1, 2, 1000, 1, ""}},
			"rate = cost":         {keys, []any{now, 1, 1, 1, 1000, 1, 1, ""}},
			"zero period":         {keys, []any{now, 1, 1, 2, 0, 1, 1, ""}},
			"rate not a number":   {keys, []any{now, 1, 1, "x", 1000, 1, 1, ""}},
			"negative cost":       {keys, []any{now, 1, 1, 2, 1000, -1, 1, ""}},
			"bad unused list":     {keys, []any{now, 2, 1, 2, 1000, 1, 1, 1, 1000, 1, 1, ""}},
			"index 0":             {keys, []any{now, 1, 1, 2, 1000, 1, 0, ""}},
			"index > L":           {keys, []any{now, 1, 1, 2, 1000, 1, 2, ""}},
			"index not a number":  {keys, []any{now, 1, 1, 2, 1000, 1, "x", ""}},
			"index fractional":    {keys, []any{now, 2, 1, 2, 1000, 1, 1, 3, 1000, 1, 1.5, ""}},
			"odd tail":            {keys, []any{now, 1, 1, 2, 1000, 1, 1, "", 1}},
			"no decision":         {keys, []any{now, 1, 1, 2, 1000, 1}},
			"more keys":           {two, []any{now, 1, 1, 2, 1000, 1, 1, ""}},
			"fewer keys":          {keys, []any{now, 1, 1, 2, 1000, 1, 1, "", 1, ""}},
			"no keys":             {nil, []any{now, 1, 1, 2, 1000, 1, 1, ""}},
			"fewer keys, 2 lists": {keys, []any{now, 2, 1, 2, 1000, 1, 2, 2, 1000, 1, 3, 60000, 1, 1, "", 2, ""}},
		} {
			err := ewma.Run(ctx, c, tc.keys, tc.args...).Err()
			if err == nil || !strings.HasPrefix(err.Error(), "ERR sluice ewma: ") {
				t.Errorf("%s: err = %v, want an 'ERR sluice ewma: ' reply", name, err)
			}
			if n, _ := c.DBSize(ctx).Result(); n != 0 {
				t.Errorf("%s: %d keys written", name, n)
				c.FlushAll(ctx)
			}
		}
	})
}

// TestRequestIDRepeatedInOneCall: a request id repeated in one call (a
// message in a batch twice) is charged once; the repeat answers with the
// stored scores.
func TestRequestIDRepeatedInOneCall(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		two := []string{"t:{r}:message:EVENT:1000:60000"}
		lists := [][]any{{10, 1000, 1, 240, 60000, 1}}
		got := batch(t, c, now, lists,
			decision{two, 1, "r1"}, decision{two, 1, "r1"}, decision{two, 1, "r2"}, decision{two, 1, "r1"}, decision{two, 1, ""})
		want := [][]any{
			{int64(1), int64(0), "1", "1"},
			{int64(1), int64(0), "1", "1"},
			{int64(1), int64(0), "2", "2"},
			{int64(1), int64(0), "2", "2"},
			{int64(1), int64(0), "3", "3"},
		}
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("decision %d: %v, want %v", i+1, got[i], want[i])
			}
		}
		if v := values(t, c, two...); !slices.Equal(v, []string{"3 " + now + " 3 " + now + " r2 r1"}) {
			t.Errorf("stored %q", v)
		}
	})
}

// TestRedisTIME: a zero instant takes Redis TIME and writes it; one instant
// serves every decision of the call.
func TestRedisTIME(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		other := []string{"t:{o}:message:EVENT:1000"}
		batch(t, c, "0", [][]any{{2, 1000, 1}}, decision{keys, 1, ""}, decision{other, 1, ""})
		v := values(t, c, keys[0], other[0])
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		_, atStr, _ := strings.Cut(v[0], " ")
		at, err := strconv.ParseInt(atStr, 10, 64)
		if d := tm.UnixMilli() - at; err != nil || d < 0 || d > 5000 {
			t.Errorf("stored instant %q, Redis TIME %d ms", atStr, tm.UnixMilli())
		}
		if v[1] != v[0] {
			t.Errorf("two decisions of one call stored %q and %q, want one instant", v[0], v[1])
		}
	})
}

// TestCutoff: an instant after ARGV[1]'s now is the cutoff by Redis TIME:
// a call that runs past it decides and writes nothing and replies the
// "late" error, so a message the gate already refused as unavailable is
// not charged; a call before it is decided as usual.
func TestCutoff(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		c.Del(ctx, keys...)
		past := strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10)
		err := ewma.Run(ctx, c, keys, single(now+" "+past, "", 2, 1000, 1)...).Err()
		if err == nil || !strings.HasPrefix(err.Error(), "ERR sluice late") {
			t.Fatalf("past the cutoff: %v, want the late error", err)
		}
		if n := c.Exists(ctx, keys...).Val(); n != 0 {
			t.Fatalf("past the cutoff, %d keys written", n)
		}
		future := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
		v, err := ewma.Run(ctx, c, keys, single("0 "+future, "", 2, 1000, 1)...).Slice()
		if err != nil || len(v) != 3 || v[0] != int64(1) {
			t.Fatalf("before the cutoff: %v %v, want admitted", v, err)
		}
	})
}

// TestClusterVariantArguments: the cluster variant refuses a call whose
// trailing count does not fit its arguments, or with more than one
// declared key, before it reads or writes anything.
func TestClusterVariantArguments(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	ctx := context.Background()
	args := []any{now, 1, 1, 2, 1000, 1, 1, "", 1, "", "t:{b}:x"}
	for _, tc := range []struct {
		keys []string
		last any
	}{
		{[]string{"t:{a}:x"}, 2},            // one key after the arguments, not two
		{[]string{"t:{a}:x"}, -1},           // negative
		{[]string{"t:{a}:x"}, "x"},          // not a number
		{[]string{"t:{a}:x"}, 0.5},          // not whole
		{[]string{"t:{a}:x", "t:{b}:x"}, 1}, // two declared keys
	} {
		err := ewmaCluster.Run(ctx, c, tc.keys, append(append([]any{}, args...), tc.last)...).Err()
		if err == nil || !strings.Contains(err.Error(), "ERR sluice ewma:") {
			t.Errorf("keys %v, count %v: %v, want the script's refusal", tc.keys, tc.last, err)
		}
	}
	if n, _ := c.DBSize(ctx).Result(); n != 0 {
		t.Errorf("%d keys written by refused calls", n)
	}
	if err := ewmaCluster.Run(ctx, c, []string{"t:{a}:x"}, append(append([]any{}, args...), 1)...).Err(); err != nil {
		t.Errorf("the same call with the right count: %v", err)
	}
}
