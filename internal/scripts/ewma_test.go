package scripts_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/scripts"
)

// servers runs f against a real redis-server. (Not miniredis: its Lua has
// no struct library, which the scripts pack their numbers with.)
func servers(t *testing.T, f func(t *testing.T, c *redis.Client)) {
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

// callArgs is the ARGV of ewma.lua deciding at instant at with cutoff cut
// against the limit lists (rate, half-life, cost, ...): the numbers packed,
// the decisions' list indices (1-based), their request ids when any is
// not "".
func callArgs(at, cut string, lists [][]any, idx []int, ids []string) []any {
	nums := []any{at, cut, len(lists)}
	for _, l := range lists {
		nums = append(nums, len(l)/3)
		nums = append(nums, l...)
	}
	args := []any{pack(nums...), indices(idx...)}
	if slices.ContainsFunc(ids, func(id string) bool { return id != "" }) {
		for _, id := range ids {
			args = append(args, id)
		}
	}
	return args
}

// indices packs list indices as ewma.lua's ARGV[2] reads them.
// Every admission is replied with its value (the top bit, withValue).
func indices(idx ...int) string { return packIndices(withValue, idx) }

// bareIndices is indices with admissions replied 0, 0, as the store sends.
func bareIndices(idx ...int) string { return packIndices(0, idx) }

// withValue is the index bit that asks for an admission's value.
const withValue = 1 << 15

func packIndices(bit int, idx []int) string {
	b := make([]byte, 0, 2*len(idx))
	for _, i := range idx {
		i |= bit
		b = append(b, byte(i), byte(i>>8))
	}
	return string(b)
}

// single is the ARGV of a call that decides one message at instant at
// (with a cutoff after a space, if any) against the windows limits (rate,
// half-life, cost, ...).
func single(at, reqid string, limits ...any) []any {
	at, cut, _ := strings.Cut(at, " ")
	if cut == "" {
		cut = "0"
	}
	return callArgs(at, cut, [][]any{limits}, []int{1}, []string{reqid})
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

func decArgs(at string, lists [][]any, decs []decision) []any {
	var idx []int
	var ids []string
	for _, d := range decs {
		idx = append(idx, d.list)
		ids = append(ids, d.id)
	}
	return callArgs(at, "0", lists, idx, ids)
}

// batch decides decs in one call at instant at; lists are the call's limit
// lists, each (rate, half-life, cost, ...). It returns each decision's
// reply (2 entries each).
func batch(t *testing.T, c *redis.Client, at string, lists [][]any, decs ...decision) [][]any {
	t.Helper()
	var ks []string
	for _, d := range decs {
		ks = append(ks, d.keys...)
	}
	v, err := ewma.Run(context.Background(), c, ks, decArgs(at, lists, decs)...).Slice()
	if err != nil {
		t.Fatalf("batch of %d: %v", len(decs), err)
	}
	if len(v) != 2*len(decs) {
		t.Fatalf("batch of %d decisions: %d entries %v", len(decs), len(v), v)
	}
	out := make([][]any, len(decs))
	for i := range decs {
		out[i], v = v[:2], v[2:]
	}
	return out
}

var ewmaCluster = redis.NewScript(scripts.EWMACluster)

// clusterBatch is batch through scripts.EWMACluster: the first decision's
// key declared, the others after the arguments, then their count. ok is
// false where the server does not run the shebang.
func clusterBatch(t *testing.T, c *redis.Client, at string, lists [][]any, decs ...decision) (out [][]any, ok bool) {
	t.Helper()
	if err := ewmaCluster.Load(context.Background(), c).Err(); err != nil {
		return nil, false
	}
	args := decArgs(at, lists, decs)
	for _, d := range decs[1:] {
		args = append(args, d.keys[0])
	}
	args = append(args, len(decs)-1)
	v, err := ewmaCluster.Run(context.Background(), c, decs[0].keys, args...).Slice()
	if err != nil {
		t.Fatalf("cluster batch of %d: %v", len(decs), err)
	}
	if len(v) != 2*len(decs) {
		t.Fatalf("cluster batch of %d decisions: %d entries", len(decs), len(v))
	}
	for range decs {
		out, v = append(out, v[:2]), v[2:]
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

// texts renders replies of n windows each (see text).
func texts(rs [][]any, n int) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = text(r, n)
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
		if text(first, 1) != "1 0 1" {
			t.Fatalf("first reply %q, want 1 0 1", text(first, 1))
		}
		if !slices.Equal(first, again) {
			t.Errorf("repeat of req-1 replied %q, first %q", again, first)
		}
		if v := show(values(t, c, keys[0])[0], 1, 5); v != now+" 1 req-1" {
			t.Errorf("stored %q after one request run twice, want score 1 and the id", v)
		}
		// Without an id the same call charges twice: the hazard the id removes.
		run(t, c, "")
		if v := show(values(t, c, keys[0])[0], 1, 5); v != now+" 2 req-1" {
			t.Errorf("stored %q, want score 2", v)
		}
	})
}

// TestRequestIDsKept: the value keeps the last 4 admitted ids, newest
// first; a repeat of any of them charges nothing and answers with every
// window's stored score; an id pushed out of the list charges again (the
// documented limit of the guard).
func TestRequestIDsKept(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		two := []string{"t:{d}:message:EVENT:1000:60000"}
		call := func(id string) string {
			v, err := ewma.Run(ctx, c, two, single(now, id, 100, 1000, 1, 1000, 60000, 1)...).Slice()
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return text(v, 2)
		}
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			call(id)
		}
		if v := show(values(t, c, two[0])[0], 2, 1); v != now+" 5 5 e d c b" {
			t.Errorf("stored %q, want both windows at score 5 and ids e d c b", v)
		}
		if r := call("b"); r != "1 0 5 5" {
			t.Errorf("repeat of b: %q, want 1 0 5 5", r)
		}
		if v := show(values(t, c, two[0])[0], 2, 1); v != now+" 5 5 e d c b" {
			t.Errorf("repeat of b charged: %q", v)
		}
		if r := call("a"); r != "1 0 6 6" {
			t.Errorf("a, pushed out of the list, is charged as new: got %q", r)
		}
	})
}

// TestRequestIDWholeMatch: a request id matches a kept id only whole, at a
// boundary of the kept ids (which are of one width), not across two.
func TestRequestIDWholeMatch(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		call := func(id string) string {
			v, err := ewma.Run(ctx, c, keys, single(now, id, 100, 1000, 1)...).Slice()
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			return text(v, 1)
		}
		call("xab")
		call("cde") // kept: "cdexab"
		for i, id := range []string{"dex", "exa", "bcd"} {
			if r := call(id); r != "1 0 "+strconv.Itoa(3+i) {
				t.Errorf("%q (not kept) was not charged: %q", id, r)
			}
		}
		if r := call("cde"); r != "1 0 5" {
			t.Errorf("a kept id was charged again: %q", r)
		}
		if v := show(values(t, c, keys[0])[0], 1, 3); v != now+" 5 bcd exa dex cde" {
			t.Errorf("stored %q", v)
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
		if text(r, 1) != "0 1000 2" {
			t.Fatalf("third at one instant: %q, want 0 1000 2", text(r, 1))
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
		if g := texts(got, 1); !slices.Equal(g, []string{"1 0 1", "1 0 2", "0 1000 2"}) {
			t.Errorf("decisions %q, want 1 0 1, 1 0 2, 0 1000 2", g)
		}
		if v := show(values(t, c, keys[0])[0], 1, 1); v != now+" 2" {
			t.Errorf("stored %q, want 2 at now", v)
		}
		if r := run(t, c, ""); !slices.Equal(r, got[2]) {
			t.Errorf("a call of its own after the batch: %q, the batch's third %q", r, got[2])
		}

		// Two windows with a decayed score, a wait that is not round, and
		// ids: the batch and three calls of their own (on another client
		// with the same stored values) agree on every reply and value.
		lists = [][]any{{3.5, 1000, 1, 50, 60000, 1}}
		const at = 1767322799700 // 300 ms before now
		b := []string{"t:{e}:message:EVENT:1000:60000"}
		s := []string{"t:{f}:message:EVENT:1000:60000"}
		for _, ks := range [][]string{b, s} {
			c.Set(ctx, ks[0], value(at, []float64{1.5, 7.25}, "zz"), 0)
		}
		got = batch(t, c, now, lists, decision{b, 1, "x1"}, decision{b, 1, "x2"}, decision{b, 1, "x3"})
		sep := alone(t, c, now, lists, decision{s, 1, "x1"}, decision{s, 1, "x2"}, decision{s, 1, "x3"})
		for i := range got {
			if !slices.Equal(got[i], sep[i]) {
				t.Errorf("decision %d: batch %q, alone %q", i+1, got[i], sep[i])
			}
		}
		if got[0][0] != int64(0) || got[1][0] != int64(0) || got[2][0] == int64(0) {
			t.Errorf("want admitted, admitted, refused: %q", texts(got, 2))
		}
		if w, _ := got[2][0].(int64); w <= 1 || w%1000 == 0 {
			t.Errorf("wait %v: the test wants one that is not a whole period", got[2][0])
		}
		vb, vs := values(t, c, b...), values(t, c, s...)
		if !slices.Equal(vb, vs) {
			t.Errorf("stored by the batch %q, by calls of their own %q", vb, vs)
		}
		if v := show(vb[0], 2, 2); !strings.HasPrefix(v, now+" ") || !strings.HasSuffix(v, " x2 x1 zz") {
			t.Errorf("stored %q, want t now and the ids x2 x1 zz", v)
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
			c.Set(ctx, "t:{a}:message:EVENT:1000", value(1767322799500, []float64{1.25}, "a0"), 0)
			c.Set(ctx, "t:{d}:message:EVENT:1000", value(now, []float64{2}), 0) // full: refused
			c.Set(ctx, "t:{b}:message:EVENT:1000:60000", value(1767322799900, []float64{9.5, 100}), 0)
			c.Set(ctx, "t:{e}:message:EVENT:1000:60000:100000", value(1767322799000, []float64{3, 40, 480}), 0)
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
				t.Errorf("decision %d: batch %q, alone %q", i+1, got[i], sep[i])
			}
			if got[i][0] != int64(0) {
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
		clustered, refused, admitted := 0, 0, 0
		defer func() {
			if clustered == 0 {
				t.Error("the cluster variant never ran on redis-server")
			}
			if refused == 0 || admitted == 0 {
				t.Errorf("%d refused, %d admitted: the test wants both", refused, admitted)
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
					var scores []float64
					for i := range n {
						r, _ := lists[l-1][3*i].(int)
						scores = append(scores, rng.Float64()*float64(max(r, 1)+1))
					}
					at := nowms - int64(rng.IntN(5000)) + 300
					switch x := rng.IntN(12); {
					case x == 0:
						seeds[ks[0]] = "junk"
					case x == 1 && n > 1:
						seeds[ks[0]] = value(at, scores[1:])
					case x < 4:
						seeds[ks[0]] = value(at, scores, "id"+strconv.Itoa(rng.IntN(6)), "zzz")
					case x < 9:
						seeds[ks[0]] = value(at, scores)
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
					t.Errorf("round %d decision %d %v: batch %q, alone %q", round, i+1, decs[i], got[i], sep[i])
				}
				switch got[i][0] {
				case int64(0):
					admitted++
				case int64(-1):
				default:
					refused++
				}
			}
			// The cluster variant, on the same table, to the last byte.
			seed()
			if gc, ok := clusterBatch(t, c, now, lists, decs...); ok {
				for i := range decs {
					if !slices.Equal(gc[i], got[i]) {
						t.Errorf("round %d decision %d %v: cluster variant %q, batch %q", round, i+1, decs[i], gc[i], got[i])
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

// TestErrorInOneDecision: a malformed stored value (too short for the
// list's windows, a score negative or not finite, t negative, fractional or
// not finite), also one holding a seen request id, fails that decision only
// (-1 and the message); it writes nothing, and the other decisions of the
// call are decided and written.
func TestErrorInOneDecision(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		lists := [][]any{{10, 1000, 1, 240, 60000, 1}}
		win := func(client string) []string {
			return []string{"t:{" + client + "}:message:EVENT:1000:60000"}
		}
		nan, inf := math.NaN(), math.Inf(1)
		for _, bad := range []string{
			"garbage", "", "1 " + now + " 1 " + now, // digits, as earlier versions wrote
			value(now, []float64{1}),         // a window short
			value(now, []float64{1, -1}),     // a negative score
			value(now, []float64{1, nan}),    // not a number
			value(now, []float64{inf, 1}),    // infinite
			value(-5, []float64{1, 1}),       // t negative
			value(2.5, []float64{1, 1}),      // t fractional
			value(nan, []float64{1, 1}),      // t not a number
			value(1e300, []float64{1, 1}),    // t past 2^53
			value(now, []float64{1})[:15],    // cut inside a number
			value(now, []float64{1, 1})[:23], // cut inside the last one
		} {
			// (A cut value with ids after it reads as a whole one: only
			// the script writes values, and it never cuts one.)
			seen := bad + "seen"
			if len(seen) >= 24 && len(bad) < 24 {
				seen = value(nan, []float64{1, 1}) + "seen"
			}
			c.FlushAll(ctx)
			c.Set(ctx, win("b")[0], bad, 0)
			c.Set(ctx, win("u")[0], seen, 0) // seen, and malformed
			got := batch(t, c, now, lists,
				decision{win("a"), 1, "aaaa"},
				decision{win("b"), 1, "bbbb"},
				decision{win("u"), 1, "seen"},
				decision{win("a"), 1, ""},
			)
			wantr := []string{
				"1 0 1 1",
				"-1 ERR sluice ewma: malformed value at " + win("b")[0],
				"-1 ERR sluice ewma: malformed value at " + win("u")[0],
				"1 0 2 2",
			}
			if g := texts(got, 2); !slices.Equal(g, wantr) {
				t.Errorf("stored %q: decisions %q, want %q", bad, g, wantr)
			}
			v := values(t, c, win("a")[0], win("b")[0], win("u")[0])
			if show(v[0], 2, 4) != now+" 2 2 aaaa" || v[1] != bad || v[2] != seen {
				t.Errorf("stored %q: values %q, %q, %q", bad, show(v[0], 2, 4), v[1], v[2])
			}
		}
		// A value holding ids longer than the windows is not malformed.
		c.FlushAll(ctx)
		c.Set(ctx, win("s")[0], value(now, []float64{3, 3}, "seen"), 0)
		if g := texts(batch(t, c, now, lists, decision{win("s"), 1, "seen"}), 2); g[0] != "1 0 3 3" {
			t.Errorf("a seen id: %q, want 1 0 3 3", g[0])
		}
	})
}

// TestWholeCallErrors: arguments that do not follow the contract fail the
// whole call with an error reply, and nothing is written.
func TestWholeCallErrors(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		two := []string{keys[0], "t:{x}:message:EVENT:1000"}
		nan, inf := math.NaN(), math.Inf(1)
		one := indices(1)
		for name, tc := range map[string]struct {
			keys []string
			args []any
		}{
			"no args":              {keys, nil},
			"no indices":           {keys, []any{pack(now, 0, 1, 1, 2, 1000, 1)}},
			"header short":         {keys, []any{pack(now, 0), one}},
			"L zero":               {keys, []any{pack(now, 0, 0, 1, 2, 1000, 1), one}},
			"L negative":           {keys, []any{pack(now, 0, -1, 1, 2, 1000, 1), one}},
			"L not a number":       {keys, []any{pack(now, 0, nan, 1, 2, 1000, 1), one}},
			"L fractional":         {keys, []any{pack(now, 0, 1.5, 1, 2, 1000, 1), one}},
			"L more than lists":    {keys, []any{pack(now, 0, 2, 1, 2, 1000, 1), one}},
			"L fewer than lists":   {two, []any{pack(now, 0, 1, 1, 2, 1000, 1, 1, 2, 1000, 1), indices(1, 2)}},
			"bytes after lists":    {keys, []any{pack(now, 0, 1, 1, 2, 1000, 1) + "x", one}},
			"n zero":               {keys, []any{pack(now, 0, 1, 0, 2, 1000, 1), one}},
			"n not a number":       {keys, []any{pack(now, 0, 1, nan, 2, 1000, 1), one}},
			"n beyond the numbers": {keys, []any{pack(now, 0, 1, 2, 2, 1000, 1), one}},
			"missing cost":         {keys, []any{pack(now, 0, 1, 1, 2, 1000), one}},
			"rate = cost":          {keys, []any{pack(now, 0, 1, 1, 1, 1000, 1), one}},
			"rate infinite":        {keys, []any{pack(now, 0, 1, 1, inf, 1000, 1), one}},
			"rate not a number":    {keys, []any{pack(now, 0, 1, 1, nan, 1000, 1), one}},
			"zero period":          {keys, []any{pack(now, 0, 1, 1, 2, 0, 1), one}},
			"fractional period":    {keys, []any{pack(now, 0, 1, 1, 2, 1000.5, 1), one}},
			"negative cost":        {keys, []any{pack(now, 0, 1, 1, 2, 1000, -1), one}},
			"cost not a number":    {keys, []any{pack(now, 0, 1, 1, 2, 1000, nan), one}},
			"bad unused list":      {keys, []any{pack(now, 0, 2, 1, 2, 1000, 1, 1, 1, 1000, 1), one}},
			"now fractional":       {keys, []any{pack(1.5, 0, 1, 1, 2, 1000, 1), one}},
			"now not a number":     {keys, []any{pack(nan, 0, 1, 1, 2, 1000, 1), one}},
			"now past 2^53":        {keys, []any{pack(1e300, 0, 1, 1, 2, 1000, 1), one}},
			"cutoff fractional":    {keys, []any{pack(now, 0.5, 1, 1, 2, 1000, 1), one}},
			"cutoff not a number":  {keys, []any{pack(now, nan, 1, 1, 2, 1000, 1), one}},
			"index 0":              {keys, []any{pack(now, 0, 1, 1, 2, 1000, 1), indices(0)}},
			"index > L":            {keys, []any{pack(now, 0, 1, 1, 2, 1000, 1), indices(2)}},
			"index 257 of 1":       {keys, []any{pack(now, 0, 1, 1, 2, 1000, 1), indices(257)}},
			"index odd bytes":      {keys, []any{pack(now, 0, 1, 1, 2, 1000, 1), "\x01"}},
			"no decision":          {keys, []any{pack(now, 0, 1, 1, 2, 1000, 1), ""}},
			"ids for some":         {two, []any{pack(now, 0, 1, 1, 2, 1000, 1), indices(1, 1), "a"}},
			"ids too many":         {keys, []any{pack(now, 0, 1, 1, 2, 1000, 1), one, "a", "b"}},
			"more keys":            {two, []any{pack(now, 0, 1, 1, 2, 1000, 1), one}},
			"fewer keys":           {keys, []any{pack(now, 0, 1, 1, 2, 1000, 1), indices(1, 1)}},
			"no keys":              {nil, []any{pack(now, 0, 1, 1, 2, 1000, 1), one}},
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
		want := []string{"1 0 1 1", "1 0 1 1", "1 0 2 2", "1 0 2 2", "1 0 3 3"}
		if g := texts(got, 2); !slices.Equal(g, want) {
			t.Errorf("decisions %q, want %q", g, want)
		}
		if v := show(values(t, c, two...)[0], 2, 2); v != now+" 3 3 r2 r1" {
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
		if len(v[0]) < 16 {
			t.Fatalf("stored %q", v[0])
		}
		at := int64(unpack(v[0], 1)[0])
		if d := tm.UnixMilli() - at; d < 0 || d > 5000 {
			t.Errorf("stored instant %d, Redis TIME %d ms", at, tm.UnixMilli())
		}
		if v[1] != v[0] {
			t.Errorf("two decisions of one call stored %q and %q, want one instant", v[0], v[1])
		}
	})
}

// TestCutoff: the cutoff is an instant by Redis TIME: a call that runs past
// it decides and writes nothing and replies the "late" error, so a message
// the gate already refused as unavailable is not charged; a call before it
// is decided as usual.
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
		if err != nil || text(v, 1) != "1 0 1" {
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
	args := []any{pack(now, 0, 1, 1, 2, 1000, 1), indices(1, 1), "t:{b}:x"}
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

// TestBareAdmissionsInOneCall: a decision whose list index lacks the top
// bit (withValue) has its admission, and a repeat of a kept id, replied
// 0, 0 instead of 0 and the value; it is decided and written exactly as one
// with the bit (the same stored values, the same refusal), in a call where
// the two kinds are mixed too, and on the cluster variant.
func TestBareAdmissionsInOneCall(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		lists := [][]any{{2.5, 1000, 1, 50, 60000, 1}}
		const at = 1767322799700
		// Per key: admitted x1, x1 again (a kept id), admitted x2, refused.
		ids := []string{"x1", "x1", "x2", "x3"}
		call := func(sc *redis.Script, key string, bits []int, cluster bool) [][]any {
			t.Helper()
			c.Set(ctx, key, value(at, []float64{0.25, 7.25}, "zz"), 0)
			ks := []string{key, key, key, key}
			b := make([]byte, 0, 8)
			for _, bit := range bits {
				b = append(b, 1, byte((1|bit)>>8))
			}
			args := callArgs(now, "0", lists, []int{1, 1, 1, 1}, ids)
			args[1] = string(b)
			if cluster {
				args = append(args, ks[1], ks[2], ks[3], 3)
				ks = ks[:1]
			}
			v, err := sc.Run(ctx, c, ks, args...).Slice()
			if err != nil {
				t.Fatal(err)
			}
			if len(v) != 8 {
				t.Fatalf("%d entries: %v", len(v), v)
			}
			return [][]any{v[0:2], v[2:4], v[4:6], v[6:8]}
		}
		all := []int{withValue, withValue, withValue, withValue}
		none := []int{0, 0, 0, 0}
		mixed := []int{0, withValue, 0, withValue}
		scs := []*redis.Script{ewma, ewmaCluster}
		for i, sc := range scs {
			if i == 1 && ewmaCluster.Load(ctx, c).Err() != nil {
				continue // a server without the shebang
			}
			tag := strconv.Itoa(i)
			full := call(sc, "t:{w"+tag+"}:message:EVENT:1000:60000", all, i == 1)
			for name, bits := range map[string][]int{"bare": none, "mixed": mixed} {
				key := "t:{" + name + tag + "}:message:EVENT:1000:60000"
				got := call(sc, key, bits, i == 1)
				for d := range got {
					want := full[d]
					if bits[d] == 0 && want[0] == int64(0) {
						want = []any{int64(0), int64(0)}
					}
					if !slices.Equal(got[d], want) {
						t.Errorf("script %d, %s, decision %d: %q, want %q", i, name, d+1, got[d], want)
					}
				}
				if vf, vg := values(t, c, "t:{w"+tag+"}:message:EVENT:1000:60000")[0], values(t, c, key)[0]; vg != vf {
					t.Errorf("script %d, %s: stored %q, with every value replied %q", i, name, vg, vf)
				}
			}
			if full[0][0] != int64(0) || full[1][0] != int64(0) || full[2][0] != int64(0) || full[3][0] == int64(0) {
				t.Errorf("script %d: want admitted, repeat, admitted, refused: %q", i, full)
			}
		}
	})
}
