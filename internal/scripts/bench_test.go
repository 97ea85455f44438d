package scripts_test

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/scripts"
)

// BenchmarkScriptCPU measures what a two-window decision (1 s and 60 s
// half-lives, what sluice ships for EVENT) costs Redis itself: the
// usec_per_call of EVALSHA in INFO commandstats, reported as redis-us/op,
// on a redis-server of the benchmark's own. The client's round trip is not
// in that figure; it is the script's share of Redis's one command thread.
//
//	admitted   two windows read, decayed and written (1 ms later each call,
//	           a request id searched among the kept ones and kept)
//	refused    a full budget: two windows read and decayed, a wait searched
//
// for the batch script (one decision with a request id) and the lean one.
func BenchmarkScriptCPU(b *testing.B) { benchCPU(b, scripts.EWMA, scripts.EWMA1) }

// benchCPU is BenchmarkScriptCPU for the given sources of ewma.lua and
// ewma1.lua (to compare a rewrite with the file it replaces).
func benchCPU(b *testing.B, batchSrc, leanSrc string) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	ctx := context.Background()
	// Rates a benchmark's calls never reach on the admitted path, and the
	// refused path's first window full.
	limits := []any{1000000000, 1000, 1, 1000000000, 60000, 1}
	full := []any{50, 1000, 1, 600, 60000, 1}
	ids := []string{"0123456789abcdef", "1123456789abcdef", "2123456789abcdef", "3123456789abcdef", "4123456789abcdef"}
	for _, sc := range []struct {
		name string
		src  string
		args func(now int64, id string, limits []any) []any
	}{
		{"batch", batchSrc, func(now int64, id string, limits []any) []any {
			return []any{pack(append([]any{now, 0, 1, 2}, limits...)...), indices(1), id}
		}},
		{"lean", leanSrc, func(now int64, _ string, limits []any) []any {
			return []any{pack(append([]any{now, 0}, limits...)...)}
		}},
	} {
		s := redis.NewScript(sc.src)
		if err := s.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		const t0 = int64(1767322800000)
		b.Run(sc.name+"/admitted", func(b *testing.B) {
			c.FlushAll(ctx)
			ks := []string{"b:{free}:1000:60000"}
			c.ConfigResetStat(ctx)
			for i := range b.N {
				v, err := s.EvalSha(ctx, c, ks, sc.args(t0+int64(i), ids[i%len(ids)], limits)...).Slice()
				if err != nil || v[0] != int64(0) {
					b.Fatal(v, err)
				}
			}
			b.ReportMetric(evalshaUsec(b, c), "redis-us/op")
		})
		b.Run(sc.name+"/refused", func(b *testing.B) {
			c.FlushAll(ctx)
			ks := []string{"b:{full}:1000:60000"}
			c.Set(ctx, ks[0], value(t0-10, []float64{49.75, 300}), 0)
			c.ConfigResetStat(ctx)
			for i := range b.N {
				v, err := s.EvalSha(ctx, c, ks, sc.args(t0+int64(i%7), "0123456789abcdef", full)...).Slice()
				if w, _ := v[0].(int64); err != nil || w < 1 {
					b.Fatal(v, err)
				}
			}
			b.ReportMetric(evalshaUsec(b, c), "redis-us/op")
		})
	}
}

// evalshaUsec reads usec_per_call of EVALSHA from INFO commandstats.
func evalshaUsec(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			for _, f := range strings.Split(strings.TrimSpace(rest), ",") {
				if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
					u, err := strconv.ParseFloat(v, 64)
					if err != nil {
						b.Fatal(err)
					}
					return u
				}
			}
		}
	}
	b.Fatalf("no cmdstat_evalsha in %q", info)
	return 0
}

// BenchmarkLuaDecay times, inside Redis's Lua (one EVAL looping 10^5
// times), one decay as the scripts compute it (ewma.lua's decay function,
// taken from the embedded source: Go's steps, a call) against the inline C
// pow (s * 2 ^ -x), which is not exact (TestPowIsNotExp2), and the bare
// loop. It reports ns per decay: what the exact arithmetic and the
// function call add to each window of each decision.
func BenchmarkLuaDecay(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	decay := regexp.MustCompile(`(?s)\nlocal function decay\(.*?\nend\n`).FindString(scripts.EWMA)
	if decay == "" {
		b.Fatal("no decay function in ewma.lua")
	}
	const loops = 100000
	pre := "local ldexp = math.ldexp\n" + decay + "local acc = 0\nfor i = 1, " + strconv.Itoa(loops) + " do\n"
	for _, bc := range []struct{ name, body string }{
		{"loop", "acc = acc + i"},
		{"pow-inline", "local x = (1767322800000 + i - 1767322790000) / 1000; acc = acc + 3 * 2 ^ (-x)"},
		{"decay", "acc = acc + decay(3, 1767322790000, 1767322800000 + i, 1000)"},
	} {
		src := pre + bc.body + "\nend\nreturn tostring(acc)"
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				if err := c.Eval(context.Background(), src, nil).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/loops, "ns/decay")
		})
	}
}

// BenchmarkScriptAgainstRedisRate measures what one decision costs Redis
// (EVALSHA usec_per_call from INFO commandstats) for the peer, redis_rate's
// one-window Allow, and for our two-window decision alone in its call: the
// lean script without and with a request id, and the batch script deciding
// one. Each round runs every variant over the same 1,500 clients
// (admitted; Redis TIME and a cutoff, as the store sends), in a rotating
// order; it reports per variant the median over rounds of its cost and of
// its ratio to the peer's in the same round, which a noisy machine moves
// far less than the costs themselves.
func BenchmarkScriptAgainstRedisRate(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	ctx := context.Background()
	rl := redis_rate.NewLimiter(c)
	client := func(i int) string {
		return "{10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) + "}:message:EVENT"
	}
	cut := func() int64 { return time.Now().Add(time.Second).UnixMilli() }
	lim := []any{10, 1000, 1, 240, 60000, 1}
	lean, batch := redis.NewScript(scripts.EWMA1), redis.NewScript(scripts.EWMA)
	var round int
	id := func(i int) string { return strconv.FormatInt(int64(1<<40+i+round<<20), 16) + "00000" }
	variants := []struct {
		name string
		call func(i int) error
	}{
		{"redis_rate", func(i int) error {
			_, err := rl.Allow(ctx, "rr:"+client(i), redis_rate.PerSecond(10))
			return err
		}},
		{"lean", func(i int) error {
			return lean.Run(ctx, c, []string{"a:" + client(i) + ":1000:60000"}, pack(append([]any{0, cut()}, lim...)...)).Err()
		}},
		{"lean+id", func(i int) error {
			return lean.Run(ctx, c, []string{"b:" + client(i) + ":1000:60000"}, pack(append([]any{0, cut()}, lim...)...), id(i)).Err()
		}},
		{"batch1+id", func(i int) error {
			return batch.Run(ctx, c, []string{"c:" + client(i) + ":1000:60000"}, pack(append([]any{0, cut(), 1, 2}, lim...)...), indices(1), id(i)).Err()
		}},
	}
	const perRound = 1500
	for b.Loop() {
		us := make([][]float64, len(variants))
		for round = 0; round < 20; round++ {
			for j := range variants {
				v := (j + round) % len(variants)
				c.ConfigResetStat(ctx)
				for i := range perRound {
					if err := variants[v].call(i); err != nil {
						b.Fatal(variants[v].name, err)
					}
				}
				us[v] = append(us[v], evalshaUsec(b, c))
			}
		}
		for v := range variants {
			ratios := make([]float64, len(us[v]))
			for r := range us[v] {
				ratios[r] = us[v][r] / us[0][r]
			}
			b.ReportMetric(median(us[v]), variants[v].name+"-redis-us/op")
			if v > 0 {
				b.ReportMetric(median(ratios), variants[v].name+"/redis_rate")
			}
		}
	}
}

func median(x []float64) float64 {
	y := append([]float64(nil), x...)
	slices.Sort(y)
	return y[len(y)/2]
}
