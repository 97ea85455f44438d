package scripts_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
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

// BenchmarkScriptInstructions counts the CPU instructions redis-server
// spends per decision (the whole server: reading the command, running the
// script and its commands, writing the reply), under valgrind's callgrind:
// a count, not a time, so it is the same on a busy machine as on a quiet
// one (within a fraction of a percent from run to run). Our two-window
// decision (1 s and 60 s half-lives, as shipped for EVENT) against
// redis_rate's one-window Allow, one call after another on one connection,
// 200 clients each decided again and again (their values read, decayed and
// written), reported as instr/decision and as a ratio to redis_rate:
//
//	lean, lean+id     ewma1.lua alone (without, with a request id)
//	batchK            ewma.lua deciding K clients in one call, with ids
//	clusterK          scripts.EWMACluster deciding K clients in one call
//	                  (here on one standalone server: the work of a
//	                  cluster master, less its slot checks)
//
// The small K say from how many decisions a shared call costs Redis less
// than a lean call each (redisstore's minCall and minClusterCall).
// Needs valgrind (its callgrind_control too); skipped without it. Slow:
// about two minutes.
func BenchmarkScriptInstructions(b *testing.B) {
	vg, err := exec.LookPath("valgrind")
	if err != nil {
		b.Skip("valgrind not installed")
	}
	ctl, err := exec.LookPath("callgrind_control")
	if err != nil {
		b.Skip("callgrind_control not installed")
	}
	// SLUICE_CALLGRIND_DIR keeps the dumps, one per variant in the order
	// below (cg.<pid>.1 is redis_rate's), for callgrind_annotate.
	dir := b.TempDir()
	if d := os.Getenv("SLUICE_CALLGRIND_DIR"); d != "" {
		dir = d
	}
	port := redistest.FreePort(b)
	srv := exec.Command(vg, "--tool=callgrind", "--callgrind-out-file="+filepath.Join(dir, "cg.%p"),
		"--dump-instr=no", redistest.Binary(b), "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), Protocol: 2, ReadTimeout: 10 * time.Second})
	defer c.Close()
	ctx := context.Background()
	for i := 0; c.Ping(ctx).Err() != nil; i++ {
		if i > 200 {
			b.Fatal("redis-server under valgrind did not answer")
		}
		time.Sleep(100 * time.Millisecond)
	}
	pid := strconv.Itoa(srv.Process.Pid)
	// instructions runs n decisions through call (k per call) between a
	// zeroing and a dump of callgrind's counters, and returns the
	// instructions per decision.
	instructions := func(name string, k int, call func(i int) error) float64 {
		const n = 1920
		for i := 0; i < 64; i += k { // load the script, create the keys
			if err := call(i); err != nil {
				b.Fatal(name, err)
			}
		}
		if out, err := exec.Command(ctl, "-z", pid).CombinedOutput(); err != nil {
			b.Fatalf("callgrind_control -z: %v %s", err, out)
		}
		for i := 0; i < n; i += k {
			if err := call(i); err != nil {
				b.Fatal(name, err)
			}
		}
		before, _ := filepath.Glob(filepath.Join(dir, "cg.*"))
		if out, err := exec.Command(ctl, "-d", pid).CombinedOutput(); err != nil {
			b.Fatalf("callgrind_control -d: %v %s", err, out)
		}
		var dump string
		for range 100 {
			after, _ := filepath.Glob(filepath.Join(dir, "cg.*"))
			for _, f := range after {
				if !slices.Contains(before, f) {
					dump = f
				}
			}
			if dump != "" {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if dump == "" {
			b.Fatal("no callgrind dump")
		}
		var total float64
		for range 100 {
			data, _ := os.ReadFile(dump)
			for _, line := range strings.Split(string(data), "\n") {
				if v, ok := strings.CutPrefix(line, "summary: "); ok {
					total, _ = strconv.ParseFloat(strings.Fields(v)[0], 64)
				}
			}
			if total > 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if total == 0 {
			b.Fatalf("no summary in %s", dump)
		}
		return total / n
	}
	client := func(i int) string {
		i %= 200
		return "{10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) + "}:message:EVENT"
	}
	cut := func() int64 { return time.Now().Add(time.Hour).UnixMilli() }
	lim := []any{10, 1000, 1, 240, 60000, 1}
	id := func(i int) string { return strconv.FormatInt(int64(1<<40+i), 16) + "00000" }
	rl := redis_rate.NewLimiter(c)
	lean := redis.NewScript(scripts.EWMA1)
	batch := redis.NewScript(scripts.EWMA)
	cluster := redis.NewScript(scripts.EWMACluster)
	batchCall := func(sc *redis.Script, pfx string, k int, clustered bool) func(i int) error {
		return func(i int) error {
			var keys []string
			var idx []int
			var ids []string
			for j := i; j < i+k; j++ {
				keys = append(keys, pfx+client(j)+":1000:60000")
				idx = append(idx, 1)
				ids = append(ids, id(j))
			}
			args := callArgs("0", strconv.FormatInt(cut(), 10), [][]any{lim}, idx, ids)
			args[1] = bareIndices(idx...) // admissions as the store asks for them
			if clustered {
				for _, key := range keys[1:] {
					args = append(args, key)
				}
				args = append(args, len(keys)-1)
				keys = keys[:1]
			}
			return sc.Run(ctx, c, keys, args...).Err()
		}
	}
	type variant struct {
		name string
		k    int
		call func(i int) error
	}
	vs := []variant{
		{"redis_rate", 1, func(i int) error {
			_, err := rl.Allow(ctx, "rr:"+client(i), redis_rate.PerSecond(10))
			return err
		}},
		{"lean", 1, func(i int) error {
			return lean.Run(ctx, c, []string{"a:" + client(i) + ":1000:60000"}, pack(append([]any{0, cut()}, lim...)...)).Err()
		}},
		{"lean+id", 1, func(i int) error {
			return lean.Run(ctx, c, []string{"b:" + client(i) + ":1000:60000"}, pack(append([]any{0, cut()}, lim...)...), id(i)).Err()
		}},
	}
	for _, k := range []int{2, 3, 4, 5, 6, 16, 32} {
		vs = append(vs, variant{"batch" + strconv.Itoa(k), k, batchCall(batch, "c"+strconv.Itoa(k)+":", k, false)})
	}
	for _, k := range []int{2, 3, 4, 5, 6, 16, 32} {
		vs = append(vs, variant{"cluster" + strconv.Itoa(k), k, batchCall(cluster, "d"+strconv.Itoa(k)+":", k, true)})
	}
	if os.Getenv("SLUICE_LEAN_PIECES") != "" {
		// The lean call by piece (docs/BENCHMARKS.md): scripts that do
		// part of its work, and ewma1.lua with one piece left out or
		// done another way, each called as lean+id is.
		for j, pc := range leanPieces(b) {
			sc := redis.NewScript(pc.src)
			pfx := "p" + strconv.Itoa(j) + ":"
			vs = append(vs, variant{"piece-" + pc.name, 1, func(i int) error {
				err := sc.Run(ctx, c, []string{pfx + client(i) + ":1000:60000"}, pack(append([]any{0, cut()}, lim...)...), id(i)).Err()
				if err == redis.Nil {
					return nil
				}
				return err
			}})
		}
	}
	for b.Loop() {
		var peer float64
		for _, v := range vs {
			x := instructions(v.name, v.k, v.call)
			if v.name == "redis_rate" {
				peer = x
			}
			b.ReportMetric(x, v.name+"-instr/decision")
			if peer > 0 && v.name != "redis_rate" {
				b.ReportMetric(x/peer, v.name+"/redis_rate")
			}
		}
	}
}

// leanPieces returns the scripts of SLUICE_LEAN_PIECES: part of the lean
// call's work alone, and ewma1.lua with one change each.
func leanPieces(b *testing.B) []struct{ name, src string } {
	// edit replaces each old (every one given in pairs) with its new.
	edit := func(name string, oldnew ...string) struct{ name, src string } {
		src := scripts.EWMA1
		for i := 0; i < len(oldnew); i += 2 {
			if !strings.Contains(src, oldnew[i]) {
				b.Fatalf("piece %s: ewma1.lua no longer has %q", name, oldnew[i])
			}
			src = strings.Replace(src, oldnew[i], oldnew[i+1], 1)
		}
		return struct{ name, src string }{name, src}
	}
	const set = "redis.call('SET', key, val, 'PX', format('%d', ttl))"
	return []struct{ name, src string }{
		{"return0", "return 0"},
		{"get", "redis.call('GET', KEYS[1]) return 0"},
		{"time+get+set", "redis.call('TIME') redis.call('GET', KEYS[1]) redis.call('SET', KEYS[1], 'abcdefghabcdefghabcdefgh0123456789abcdef', 'PX', '60000') return 0"},
		{"whole", scripts.EWMA1},
		edit("no-id", "local reqid = ARGV[2] or ''", "local reqid = ''"),
		edit("no-decay", "local function decay(s, t, now, p)\n", "local function decay(s, t, now, p)\n  do return s * 0.5 end\n"),
		edit("no-ttl", "ceil(p1 * log((s1 > eps and s1 or eps) / eps) / LN2) + 1\n", "60000\n",
			"ceil(p2 * log((s2 > eps and s2 or eps) / eps) / LN2) + 1\n", "60000\n"),
		edit("psetex", set, "redis.call('PSETEX', key, format('%d', ttl), val)"),
		edit("pxat", set, "redis.call('SET', key, val, 'PXAT', format('%d', clock + ttl))"),
		edit("one-id", "local IDS = 4", "local IDS = 1"),
	}
}
