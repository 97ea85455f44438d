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

	"github.com/sluice-relay/sluice/internal/scripts"
)

var ewma1 = redis.NewScript(scripts.EWMA1)

// lean is the ARGV of ewma1.lua deciding one message at instant at with
// cutoff cut against limits (rate, half-life, cost, ...), without a
// request id, asking for the value with an admission ('s': the reply
// ewma.lua gives).
func lean(at, cut string, limits ...any) []any {
	return []any{pack(append([]any{at, cut}, limits...)...), "", "s"}
}

// TestLeanEqualsBatch: over random stored values (decayed, fresh, ahead of
// now, junk, a window short, a window long, carrying request ids) and limit
// lists of one and two windows, ewma1.lua replies and stores exactly what
// ewma.lua does for one decision, without a request id, with a new one and
// with one already kept; a list of three windows it refuses whole, writing
// nothing (the store sends such a decision as ewma.lua's).
func TestLeanEqualsBatch(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(3, 4))
		lists := [][]any{
			{2, 1000, 1},
			{10, 1000, 1, 240, 60000, 1},
			{5, 1000, 1, 50, 10000, 1, 500, 100000, 2.5},
			{1.0001, 3600000, 1},
		}
		periods := []string{"1000", "60000", "100000"}
		nowms, _ := strconv.ParseInt(now, 10, 64)
		for round := 0; round < 600; round++ {
			l := lists[rng.IntN(len(lists))]
			n := len(l) / 3
			ks := []string{"t:{c}:" + strings.Join(periods[:n], ":")}
			scores := randomScores(rng, l)
			at := nowms - int64(rng.IntN(5000)) + 300
			seeds := []string{""}
			switch x := rng.IntN(14); {
			case x == 0:
				seeds[0] = "junk"
			case x == 1 && n > 1:
				seeds[0] = value(at, scores[:n-1]) // a window short
			case x == 2 && n == 1:
				seeds[0] = value(at, append(scores, 3)) // a window long: its 8 bytes read as ids
			case x == 12:
				// a score no gate writes, in either window
				bad := slices.Clone(scores)
				bad[rng.IntN(n)] = []float64{math.Inf(1), math.NaN(), -1}[rng.IntN(3)]
				seeds[0] = value(at, bad)
			case x == 13:
				seeds[0] = value(at, scores)
				seeds[0] = pack(float64(at)+0.5) + seeds[0][8:] // a write time not in whole ms
			case x < 4:
				seeds[0] = value(at, scores, "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb")
			case x < 9:
				seeds[0] = value(at, scores)
			}
			seed := func() { reseed(c, ks, seeds) }
			seed()
			id := []string{"", "", "cccccccccccccccc", "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"}[rng.IntN(5)]
			want, err := ewma.Run(ctx, c, ks, single(now, id, l...)...).Slice()
			if err != nil {
				t.Fatal(err)
			}
			vw := values(t, c, ks...)
			tw := ttls(c, ks)
			seed()
			largs := lean(now, "0", l...)
			largs[1] = id
			got, err := ewma1.Run(ctx, c, ks, largs...).Slice()
			if n > 2 {
				if err == nil || !strings.HasPrefix(err.Error(), "ERR sluice ewma: want one key") {
					t.Fatalf("round %d: three windows: %v %v, want the call refused", round, got, err)
				}
				if vg := values(t, c, ks...); !slices.Equal(vg, seeds) {
					t.Fatalf("round %d: three windows refused, yet stored %q (seeded %q)", round, vg, seeds)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			vg := values(t, c, ks...)
			if !slices.Equal(got, want) || !slices.Equal(vg, vw) {
				t.Fatalf("round %d %q id %q: lean %v stored %q; batch %v stored %q", round, seeds, id, got, vg, want, vw)
			}
			for i, tg := range ttls(c, ks) {
				if d := tg - tw[i]; (tg < 0) != (tw[i] < 0) || d > time.Second || d < -time.Second {
					t.Fatalf("round %d: TTL of %s %v, the batch script's %v", round, ks[i], tg, tw[i])
				}
			}
		}
	})
}

// reseed empties Redis and stores seeds[i] (unless "") at ks[i].
func reseed(c *redis.Client, ks, seeds []string) {
	ctx := context.Background()
	c.FlushAll(ctx)
	for i, v := range seeds {
		if v != "" {
			c.Set(ctx, ks[i], v, 0)
		}
	}
}

// randomScores returns a score for each window of the limit list l
// (rate, half-life, cost, ...), up to a little over its rate.
func randomScores(rng *rand.Rand, l []any) []float64 {
	var scores []float64
	for i := range len(l) / 3 {
		r, _ := l[3*i].(int)
		scores = append(scores, rng.Float64()*float64(max(r, 1)+1))
	}
	return scores
}

// TestLeanCutoff: past its cutoff ewma1.lua writes nothing and says so;
// before it, it decides by Redis TIME.
func TestLeanCutoff(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		c.Del(ctx, keys...)
		past := strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10)
		err := ewma1.Run(ctx, c, keys, lean(now, past, 2, 1000, 1)...).Err()
		if err == nil || !strings.HasPrefix(err.Error(), "ERR sluice late") {
			t.Fatalf("past the cutoff: %v, want the late error", err)
		}
		if n := c.Exists(ctx, keys...).Val(); n != 0 {
			t.Fatalf("past the cutoff, %d keys written", n)
		}
		future := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
		v, err := ewma1.Run(ctx, c, keys, lean("0", future, 2, 1000, 1)...).Slice()
		if err != nil || text(v, 1) != "1 0 1" {
			t.Fatalf("before the cutoff: %v %v, want admitted", v, err)
		}
		if err := ewma1.Run(ctx, c, keys, pack(0, 0, 2, 1000)).Err(); err == nil || !strings.HasPrefix(err.Error(), "ERR sluice ewma:") {
			t.Fatalf("a missing cost: %v, want a refusal", err)
		}
	})
}

func ttls(c *redis.Client, ks []string) []time.Duration {
	out := make([]time.Duration, len(ks))
	for i, k := range ks {
		out[i] = c.PTTL(context.Background(), k).Val()
	}
	return out
}

// TestLeanBareAdmission: without 's', ewma1.lua answers an admission (and
// a repeat of an admitted request id) with the integer 0 alone, and stores
// exactly what it stores with 's'; a refusal keeps its wait and scores;
// any other ARGV[3] is refused whole.
func TestLeanBareAdmission(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		l := []any{2.5, 1000, 1, 240, 60000, 1}
		run := func(scores bool, id string) (any, string) {
			t.Helper()
			args := lean(now, "0", l...)
			args[1] = id
			if !scores {
				args = args[:2]
			}
			r, err := ewma1.Run(ctx, c, keys[:1], args...).Result()
			if err != nil {
				t.Fatal(err)
			}
			return r, values(t, c, keys[0])[0]
		}
		for _, id := range []string{"", "dddddddddddddddd"} {
			c.Del(ctx, keys...)
			withS, vs := run(true, id)
			c.Del(ctx, keys...)
			bare, vb := run(false, id)
			if bare != int64(0) || vb != vs {
				t.Fatalf("id %q: bare admission %#v stored %q; with 's' %v stored %q", id, bare, vb, withS, vs)
			}
			if id != "" {
				if again, v := run(false, id); again != int64(0) || v != vb {
					t.Fatalf("a repeated id: %#v stored %q, want 0 and %q", again, v, vb)
				}
			}
		}
		c.Del(ctx, keys...)
		run(false, "") // 1 of 2.5
		if r, _ := run(false, ""); r != int64(0) {
			t.Fatalf("second of a burst of 2: %#v", r)
		}
		refused, _ := run(false, "")
		if a, ok := refused.([]any); !ok || len(a) != 2 || a[0].(int64) < 1 {
			t.Fatalf("a refusal without 's': %#v, want {wait, scores}", refused)
		}
		for _, bad := range []string{"S", "x", ""} {
			args := append(lean(now, "0", l...)[:2], bad)
			if err := ewma1.Run(ctx, c, keys[:1], args...).Err(); err == nil || !strings.HasPrefix(err.Error(), "ERR sluice ewma:") {
				t.Fatalf("ARGV[3] %q: %v, want a refusal", bad, err)
			}
		}
	})
}

// TestLeanRoomEqualsBatch: a message of one or two windows with the
// quota's room going with it (KEYS[2]) is, in ewma1.lua, exactly what
// ewma.lua makes of the two as one group (the windows' decision joined
// with the room list): the same reply, entry for entry (the lean bare
// admission being the batch's four zeros), and the same stored values,
// over random window values (as TestLeanEqualsBatch) and quota values
// (none, under the quota, at it, of an older window, of a newer one,
// carrying an id, junk), with request ids new, kept and none.
func TestLeanRoomEqualsBatch(t *testing.T) {
	servers(t, func(t *testing.T, c *redis.Client) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(5, 6))
		lists := [][]any{
			{2, 1000, 1},
			{10, 1000, 1, 240, 60000, 1},
			{1.0001, 3600000, 1},
		}
		periods := []string{"1000", "60000"}
		nowms, _ := strconv.ParseInt(now, 10, 64)
		const events, window = 3, 60000
		win := nowms / window
		quota := []string{
			"", "", "",
			strconv.FormatInt(win, 10) + " 2",
			strconv.FormatInt(win, 10) + " 3",
			strconv.FormatInt(win, 10) + " 7 0123abcd",
			strconv.FormatInt(win-1, 10) + " 9",
			strconv.FormatInt(win+1, 10) + " 3",
			"junk",
		}
		refused := 0
		for round := 0; round < 600; round++ {
			l := lists[rng.IntN(len(lists))]
			n := len(l) / 3
			ks := []string{"t:{c}:" + strings.Join(periods[:n], ":"), "t:{q:alice}:quota:60000"}
			scores := randomScores(rng, l)
			at := nowms - int64(rng.IntN(5000)) + 300
			seeds := []string{"", quota[rng.IntN(len(quota))]}
			switch x := rng.IntN(8); {
			case x == 0:
				seeds[0] = "junk"
			case x < 3:
				seeds[0] = value(at, scores, "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb")
			case x < 6:
				seeds[0] = value(at, scores)
			}
			seed := func() { reseed(c, ks, seeds) }
			id := []string{"", "cccccccccccccccc", "aaaaaaaaaaaaaaaa"}[rng.IntN(3)]
			withS := rng.IntN(2) == 0
			// The batch call: the windows' list joined with the room list.
			nums := append([]any{now, "0", 2, n}, l...)
			nums = append(nums, 0, events, window)
			bit := 0
			if withS {
				bit = withValue
			}
			bargs := []any{pack(nums...), packIndices(bit, []int{1 | 1<<14, 2})}
			if id != "" {
				bargs = append(bargs, id, "")
			}
			seed()
			want, err := ewma.Run(ctx, c, ks, bargs...).Slice()
			if err != nil {
				t.Fatal(err)
			}
			vw := values(t, c, ks...)
			seed()
			largs := []any{pack(append(append([]any{now, "0"}, l...), events, window)...), id}
			if withS {
				largs = append(largs, "s")
			}
			got, err := ewma1.Run(ctx, c, ks, largs...).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got == int64(0) {
				if withS {
					t.Fatalf("round %d: a bare admission although 's' was asked", round)
				}
				got = []any{int64(0), int64(0), int64(0), int64(0)}
			}
			vg := values(t, c, ks...)
			if !slices.Equal(got.([]any), want) || !slices.Equal(vg, vw) {
				t.Fatalf("round %d %q id %q s %v: lean %v stored %q; batch %v stored %q", round, seeds, id, withS, got, vg, want, vw)
			}
			if w, _ := want[2].(int64); w > 0 {
				refused++
			}
		}
		if refused < 100 {
			t.Fatalf("the room refused in %d rounds of 600: the test does not reach it", refused)
		}
	})
}
