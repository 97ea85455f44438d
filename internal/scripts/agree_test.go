package scripts_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/scripts"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// realRedis returns a client of a redis-server of the test's own: what the
// tests below pin is Redis's Lua (its C pow, its number parsing), which
// miniredis's Lua does not have.
func realRedis(t *testing.T) *redis.Client {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestEmbeddedScriptsLoad: each embedded source compiles in a real Redis,
// under the SHA1 that go-redis (and so the store's EVALSHA) sends for it,
// and run by that SHA1 it decides a known sequence: rate 2, cost 1,
// half-life 1 s at one instant admits twice and then refuses for exactly
// 1000 ms; 1000 ms later it admits again.
func TestEmbeddedScriptsLoad(t *testing.T) {
	c := realRedis(t)
	ctx := context.Background()
	for _, sc := range []struct {
		name, src string
		args      func(at string) []any
	}{
		{"ewma.lua", scripts.EWMA, func(at string) []any { return single(at, "", 2, 1000, 1) }},
		{"ewma1.lua", scripts.EWMA1, func(at string) []any { return lean(at, "0", 2, 1000, 1) }},
	} {
		sum := sha1.Sum([]byte(sc.src))
		want := hex.EncodeToString(sum[:])
		got, err := c.ScriptLoad(ctx, sc.src).Result()
		if err != nil {
			t.Fatalf("%s: SCRIPT LOAD: %v", sc.name, err)
		}
		if got != want || redis.NewScript(sc.src).Hash() != want {
			t.Fatalf("%s: Redis loaded it as %s, its SHA1 is %s, go-redis sends %s", sc.name, got, want, redis.NewScript(sc.src).Hash())
		}
		c.FlushAll(ctx)
		later := strconv.FormatInt(mustInt(now)+1000, 10)
		steps := []struct {
			at   string
			want string
		}{{now, "1 0 1"}, {now, "1 0 2"}, {now, "0 1000 2"}, {later, "1 0 2"}}
		for i, st := range steps {
			v, err := c.EvalSha(ctx, got, keys, sc.args(st.at)...).Slice()
			if err != nil {
				t.Fatalf("%s: step %d: %v", sc.name, i+1, err)
			}
			if s := text(v, 1); s != st.want {
				t.Errorf("%s: step %d at %s: %v, want %s", sc.name, i+1, st.at, v, st.want)
			}
		}
	}
}

func mustInt(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		panic(err)
	}
	return n
}

// TestLeanSharesPieces: both scripts are composed with the one decay, the
// one wait search, the one search for a kept request id and the one read
// of the clock (decay.lua, waitms.lua, keptid.lua, clock.lua), with no
// include left unresolved and no second copy of any of them. (Their
// reading of a stored value, written for one or two windows, is pinned by
// TestLeanEqualsBatch instead.)
func TestLeanSharesPieces(t *testing.T) {
	for name, src := range map[string]string{"ewma.lua": scripts.EWMA, "ewma1.lua": scripts.EWMA1, "cluster": scripts.EWMACluster} {
		if strings.Contains(src, "#include") {
			t.Errorf("%s: an include is left unresolved", name)
		}
		for _, piece := range []string{"\nlocal function decay\\(s, t, now, p\\)\n", "\nwaitms = function\\(now, s, at, p, c, r\\)\n", "\nlocal function kept\\(v, idat, reqid\\)\n", "\n  local tm = redis.call\\('TIME'\\)\n", "find\\(v, reqid, k, true\\)"} {
			if n := len(regexp.MustCompile(piece).FindAllString(src, -1)); n != 1 {
				t.Errorf("%s: %d copies of %q, want 1", name, n, piece)
			}
		}
	}
}

// TestPowIsNotExp2 measures what ewma.lua's header says: in Redis's Lua,
// 2^-x (the ^ operator, C pow) and Go's math.Exp2(-x) differ in the last
// bit for a sizeable share of the x a decision meets (x = elapsed ms / half-
// life ms), never by more; and such a last bit decides an admission at an
// exact boundary and moves a wait by 1 ms. (That is why the scripts compute
// 2^-x by Go's steps instead, see TestScriptsAgreeWithGo.) It fails if the
// measurement no longer says so, so that the header is revisited.
func TestPowIsNotExp2(t *testing.T) {
	c := realRedis(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	periods := []int64{1000, 60000, 3600000, 86400000, 7, 333}
	const n = 20000
	xs := make([]float64, n)
	args := make([]any, n)
	for i := range xs {
		p := periods[rng.IntN(len(periods))]
		dt := 1 + rng.Int64N(50*p)
		xs[i] = float64(dt) / float64(p)
		args[i] = strconv.FormatInt(dt, 10) + " " + strconv.FormatInt(p, 10)
	}
	pow := redis.NewScript(`
local out = {}
for i = 1, #ARGV do
  local sp = string.find(ARGV[i], ' ', 1, true)
  local x = tonumber(string.sub(ARGV[i], 1, sp - 1)) / tonumber(string.sub(ARGV[i], sp + 1))
  out[i] = string.format('%.17g', 2 ^ (-x))
end
return out`)
	got, err := pow.Run(ctx, c, nil, args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	var differ, beyond int
	var example float64
	for i, s := range got {
		lua, _ := strconv.ParseFloat(s, 64)
		goes := math.Exp2(-xs[i])
		if lua == goes {
			continue
		}
		differ++
		if example == 0 {
			example = xs[i]
		}
		if lua != math.Nextafter(goes, lua) {
			beyond++
		}
	}
	t.Logf("Redis Lua 2^-x and Go math.Exp2(-x) differ for %d of %d x (%.1f%%), %d of them by more than one ulp; e.g. x = %v",
		differ, n, 100*float64(differ)/n, beyond, example)
	if differ == 0 || beyond > 0 {
		t.Fatalf("%d of %d differ, %d by more than one ulp: ewma.lua's header (about one in ten, in the last bit) is stale", differ, n, beyond)
	}

	// A boundary that pow and Exp2 decide differently. With score 1 and a
	// cost of 2^-10 the sums d+c are exact, so the rate min(d)+c admits one
	// and refuses the other at that instant; 1 ms before, both refuse, and
	// the wait told is 1 ms by one and 2 ms by the other.
	decide := redis.NewScript(`
local s, t, p, c, r = 1, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for i = 5, #ARGV do
  local d = s * 2 ^ (-((tonumber(ARGV[i]) - t) / p))
  out[#out + 1] = (d + c <= r) and 1 or 0
end
return out`)
	const cost = 1.0 / 1024
	t0 := mustInt(now)
	found := 0
	for i := 0; i < n && found < 20; i++ {
		sp := strings.IndexByte(args[i].(string), ' ')
		dt, p := mustInt(args[i].(string)[:sp]), mustInt(args[i].(string)[sp+1:])
		lua, _ := strconv.ParseFloat(got[i], 64)
		goes := math.Exp2(-xs[i])
		if lua == goes || goes < 2*cost {
			continue
		}
		rate := min(lua, goes) + cost
		at := t0 - dt
		flags, err := decide.Run(ctx, c, nil, at, p, cost, strconv.FormatFloat(rate, 'g', -1, 64), t0-1, t0, t0+1).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		// Go: refused at t0-1, admitted at t0 only if its value is the smaller.
		goAdmits := goes+cost <= rate
		if flags[0] != 0 || flags[2] != 1 || (flags[1] == 1) == goAdmits {
			continue // 1 ms moved the score by less than expected: not a clean boundary
		}
		found++
		goWait, luaWait := 2, 1
		if goAdmits {
			goWait, luaWait = 1, 2
		}
		if found == 1 {
			t.Logf("score 1 at %d, half-life %d ms, cost 2^-10, rate %v: at %d Lua's pow %s, Go's Exp2 %s; wait told at %d: %d ms by pow, %d ms by Exp2",
				at, p, rate, t0, map[bool]string{true: "admits", false: "refuses"}[flags[1] == 1],
				map[bool]string{true: "admits", false: "refuses"}[goAdmits], t0-1, luaWait, goWait)
		}
	}
	if found == 0 {
		t.Fatal("no boundary that pow and Exp2 decide differently")
	}
	t.Logf("%d such boundaries among the first differing x", found)
}

// seedLimit is the limit whose decision from rest writes score s at a
// window of period p in the memory store: the way to give the Go reference
// an arbitrary stored score.
func seedLimit(s float64, p time.Duration) ratelimit.Limit {
	return ratelimit.Limit{Rate: 2*s + 1, Period: p, Cost: s}
}

// TestScriptsAgreeWithGo: on a random table of limits (one to three
// windows; rates barely above the cost to ten thousand times it; half-lives
// of 1 ms to a week) and stored scores (one instant per round, 0 to many
// half-lives old), both scripts in a real Redis decide
// exactly what ratelimit.MemoryStore decides: the same admission, the same
// wait to the ms and the same scores to the last bit. Each round decides at
// a random instant, then 1 ms before the wait it was told and at the wait
// (the exact boundary, where a last bit of 2^-x decides). It fails on the
// scripts' former 2^-x (C pow) within a few rounds.
func TestScriptsAgreeWithGo(t *testing.T) {
	c := realRedis(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 8))
	periods := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, time.Minute, time.Hour, 7 * 24 * time.Hour}
	t0 := mustInt(now)
	boundaries := 0
	for round := 0; round < 400; round++ {
		mem := ratelimit.NewMemoryStore(1024)
		var list []ratelimit.Limit
		key := "g:{" + strconv.Itoa(round) + "}"
		var scores []float64
		args := []any{}
		used := map[time.Duration]bool{}
		var seeds []ratelimit.Limit
		// Written up to a week before t0 (or just after it): up to
		// thousands of half-lives for the short windows, a fraction of one
		// for the long.
		at := t0 - rng.Int64N([]int64{3, 3000, 300000, 7 * 86400000}[rng.IntN(4)]) + rng.Int64N(3)
		for w := 1 + rng.IntN(3); w > 0; w-- {
			p := periods[rng.IntN(len(periods))]
			if used[p] {
				continue
			}
			used[p] = true
			cost := []float64{1, 0.25, 3, 1.0 / 3}[rng.IntN(4)]
			rate := cost * (1 + math.Pow(10, rng.Float64()*4-3)) // 1.001c .. 11c
			if rng.IntN(4) == 0 {
				rate = cost * (1 + 1e-9)
			}
			list = append(list, ratelimit.Limit{Rate: rate, Period: p, Cost: cost})
			key += ":" + strconv.FormatInt(p.Milliseconds(), 10)
			args = append(args, rate, p.Milliseconds(), cost)
			// A stored score up to a little above the rate.
			s := rng.Float64() * rate * 1.2
			seeds = append(seeds, seedLimit(s, p))
			scores = append(scores, s)
		}
		// Every window in one key's value, as the scripts keep them.
		ks := []string{key}
		c.Set(ctx, key, value(at, scores), 0)
		// One decision of every window from rest writes the seeds in the
		// memory store (in one call, so that its windows take the slots the
		// decisions below look in).
		limits := storetest.MustWindows(list...)
		if _, err := mem.Decide(ctx, "m", storetest.MustWindows(seeds...), time.UnixMilli(at)); err != nil {
			t.Fatal(err)
		}
		seeded := map[string]string{}
		for _, k := range ks {
			seeded[k] = c.Get(ctx, k).Val()
		}
		// decideAll decides at instant at by Go, by ewma.lua and by
		// ewma1.lua (the latter two on the same stored values: ewma.lua's
		// writes are undone before ewma1.lua runs), and fails on any
		// difference; it returns Go's decision.
		decideAll := func(at int64) ratelimit.Decision {
			want, err := mem.Decide(ctx, "m", limits, time.UnixMilli(at))
			if err != nil {
				t.Fatal(err)
			}
			before := map[string]string{}
			for _, k := range ks {
				before[k] = c.Get(ctx, k).Val()
			}
			atStr := strconv.FormatInt(at, 10)
			batchReply, err := ewma.Run(ctx, c, ks, single(atStr, "", args...)...).Slice()
			if err != nil {
				t.Fatal(err)
			}
			after := map[string]string{}
			for _, k := range ks {
				after[k] = c.Get(ctx, k).Val()
				c.Set(ctx, k, before[k], 0)
			}
			// ewma1.lua decides one or two windows; with three, ewma.lua's
			// writes stand (the store sends such a decision as ewma.lua's).
			leanReply := batchReply
			if len(list) <= 2 {
				leanReply, err = ewma1.Run(ctx, c, ks, lean(atStr, "0", args...)...).Slice()
				if err != nil {
					t.Fatal(err)
				}
			} else {
				for _, k := range ks {
					c.Set(ctx, k, after[k], 0)
				}
			}
			for _, k := range ks {
				if v := c.Get(ctx, k).Val(); v != after[k] {
					t.Fatalf("round %d at %d: %s stored %q by ewma1.lua, %q by ewma.lua", round, at, k, v, after[k])
				}
			}
			// Decisions against Go's; scores between the two scripts
			// (Go's own scores are compared with the scripts' to the last
			// bit by redisstore's storetest.Agree runs).
			bd, bs := fromReply(t, batchReply, len(list))
			ld, ls := fromReply(t, leanReply, len(list))
			for name, got := range map[string]ratelimit.Decision{"ewma.lua": bd, "ewma1.lua": ld} {
				if got != want {
					t.Fatalf("round %d %v, seeded %q, at %d (t0%+d): %s decided %+v, Go %+v",
						round, limits, seeded, at, at-t0, name, got, want)
				}
			}
			if !slices.Equal(bs, ls) || len(bs) != len(list) {
				t.Fatalf("round %d at %d: ewma.lua scores %v, ewma1.lua %v", round, at, bs, ls)
			}
			return want
		}
		d := decideAll(t0)
		if d.Allowed {
			continue
		}
		w := d.Wait.Milliseconds()
		if w > 1 {
			if early := decideAll(t0 + w - 1); early.Allowed {
				t.Fatalf("round %d: admitted 1 ms before the wait it was told", round)
			}
		}
		if on := decideAll(t0 + w); !on.Allowed {
			t.Fatalf("round %d: refused after exactly the wait it was told", round)
		}
		boundaries++
	}
	if boundaries < 100 {
		t.Fatalf("only %d rounds reached a boundary: the table is too easy", boundaries)
	}
}

// fromReply reads one decision's reply as a ratelimit.Decision and its
// scores, exact (they are packed).
func fromReply(t *testing.T, r []any, n int) (ratelimit.Decision, []float64) {
	t.Helper()
	wait, _ := r[0].(int64)
	v, _ := r[1].(string)
	if len(r) != 2 || wait < 0 || len(v) < 8+8*n {
		t.Fatalf("reply %q", r)
	}
	return ratelimit.Decision{Allowed: wait == 0, Wait: time.Duration(wait) * time.Millisecond}, unpack(v[8:], n)
}

// TestArgumentsRefusedAsGoRefuses: a limit is refused by both scripts
// (an 'ERR sluice ewma: ' reply, nothing written) exactly when
// ratelimit.Limit.Validate refuses it; and a now (or cutoff) that is not a
// whole number of ms (or past 2^53, where ms stop being exact) is refused
// too, as Go, which decides at whole ms, can never send one.
func TestArgumentsRefusedAsGoRefuses(t *testing.T) {
	c := realRedis(t)
	ctx := context.Background()
	refused := func(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "ERR sluice ewma: ") }
	check := func(what string, err error, wantRefused bool) {
		t.Helper()
		if refused(err) != wantRefused {
			t.Errorf("%s: err = %v, want refused %v", what, err, wantRefused)
		}
		if n := c.DBSize(ctx).Val(); wantRefused && n != 0 {
			t.Errorf("%s: refused, but %d keys written", what, n)
		}
		c.FlushAll(ctx)
	}
	for _, l := range [][3]string{
		{"2", "1000", "1"}, {"1.000001", "1", "1"}, {"1e3", "1000", "1"}, {"0.3", "60000", "0.1"},
		{"inf", "1000", "1"}, {"-inf", "1000", "1"}, {"nan", "1000", "1"}, {"1e309", "1000", "1"},
		{"2", "1000", "inf"}, {"2", "1000", "nan"}, {"2", "1000", "0"}, {"2", "1000", "-1"},
		{"1", "1000", "1"}, {"0.5", "1000", "1"}, {"-1", "1000", "-2"},
		{"2", "0", "1"}, {"2", "0.5", "1"}, {"2", "1.5", "1"}, {"2", "-1000", "1"}, {"2", "inf", "1"}, {"2", "nan", "1"},
	} {
		rate, _ := strconv.ParseFloat(l[0], 64)
		p, _ := strconv.ParseFloat(l[1], 64)
		cost, _ := strconv.ParseFloat(l[2], 64)
		lim := ratelimit.Limit{Rate: rate, Period: time.Duration(p * float64(time.Millisecond)), Cost: cost}
		if math.IsNaN(p) || math.IsInf(p, 0) {
			lim.Period = 0 // not a Duration at all
		}
		// A Limit's Cost 0 means 1 (the store sends EffectiveCost), so a
		// cost of 0 on the wire is no Limit at all: refused.
		goRefuses := lim.Validate() != nil || cost == 0
		what := "limit " + strings.Join(l[:], "/")
		check(what+" (ewma.lua)", ewma.Run(ctx, c, keys, pack(now, 0, 1, 1, rate, p, cost), indices(1)).Err(), goRefuses)
		check(what+" (ewma1.lua)", ewma1.Run(ctx, c, keys, pack(now, 0, rate, p, cost)).Err(), goRefuses)
	}
	for _, tc := range []struct {
		now     string
		refused bool
	}{
		{now, false}, {"0", false}, {"-5", false}, {"1767322800000.5", true}, {"0.5", true},
		{"inf", true}, {"-inf", true}, {"nan", true}, {"9007199254740992", true},
	} {
		check("now "+tc.now+" (ewma.lua)", ewma.Run(ctx, c, keys, pack(tc.now, 0, 1, 1, 2, 1000, 1), indices(1)).Err(), tc.refused)
		check("now "+tc.now+" (ewma1.lua)", ewma1.Run(ctx, c, keys, pack(tc.now, 0, 2, 1000, 1)).Err(), tc.refused)
	}
	far := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	for _, tc := range []struct {
		cutoff  string
		refused bool
	}{{far, false}, {far + ".5", true}, {"nan", true}, {"inf", true}, {"9007199254740992", true}} {
		check("cutoff "+tc.cutoff+" (ewma.lua)", ewma.Run(ctx, c, keys, pack(now, tc.cutoff, 1, 1, 2, 1000, 1), indices(1)).Err(), tc.refused)
		check("cutoff "+tc.cutoff+" (ewma1.lua)", ewma1.Run(ctx, c, keys, pack(now, tc.cutoff, 2, 1000, 1)).Err(), tc.refused)
	}
}
