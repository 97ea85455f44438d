package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// benchGoroutines decide at once in BenchmarkRedis, in every sub-benchmark
// alike (8 × GOMAXPROCS, as RunParallel with SetParallelism(8) would).
var benchGoroutines = 8 * runtime.GOMAXPROCS(0)

// benchClients is how many distinct clients the traffic cycles through.
const benchClients = 100000

var benchKeys = func() []string {
	k := make([]string, benchClients)
	for i := range k {
		k[i] = messageKey("10."+strconv.Itoa(i>>16)+"."+strconv.Itoa(i>>8&255)+"."+strconv.Itoa(i&255), "EVENT")
	}
	return k
}()

// BenchmarkRedis runs, against one redis-server on loopback and at the
// same concurrency (benchGoroutines), our
// two-window decision and redis_rate/v10's one-window GCRA Allow as the
// peer: each on a plain client and through go-redis's auto-pipeliner, and
// ours with its own batching (Options.Batch). Metrics: ops/s (the figure to
// compare); redis-µs/op, the server's own time in script calls per decision
// (INFO commandstats; a batched call decides several); client-cpu-µs/op and
// server-cpu-µs/op, the CPU time this process and redis-server spent per
// decision (redis-server runs commands on one thread, so ops/s can never
// pass 1e6 / server-cpu-µs/op; and on a 2-core machine the two share the
// cores); admitted-%; calls/pipeline, the mean batch size with
// Options.Batch, and direct-%, the share of decisions that went out alone.
func BenchmarkRedis(b *testing.B) {
	e := newBenchEnv(b)
	twoWindows := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute))
	oneWindow := storetest.MustWindows(twoWindows.Limit(0))
	b.Run("Decide2Windows", e.decide(twoWindows, Options{}, false, benchGoroutines))
	b.Run("RedisRateAllow1Window", e.rate(false, benchGoroutines))
	b.Run("Decide1Window", e.decide(oneWindow, Options{}, false, benchGoroutines))
	b.Run("Decide2WindowsBatch32x2", e.decide(twoWindows, Options{Batch: 32, batchWorkers: 2}, false, benchGoroutines))
	b.Run("Decide1WindowBatch32x2", e.decide(oneWindow, Options{Batch: 32, batchWorkers: 2}, false, benchGoroutines))
	b.Run("Decide2WindowsGoRedisAutoPipeline", e.decide(twoWindows, Options{}, true, benchGoroutines))
	b.Run("RedisRateAllow1WindowGoRedisAutoPipeline", e.rate(true, benchGoroutines))
	b.Run("GoRedisPing", e.ping(false, benchGoroutines))
	b.Run("RawPing", e.ping(true, benchGoroutines))
}

// BenchmarkRedisConcurrency runs the pair that matters — our two-window
// decision as the binary runs it (Batch 32, 2 workers) and the peer's
// one-window Allow — side by side at 1 to 256 goroutines: a relay's load is
// many connections deciding at once, and where each peer stands depends on
// how many.
func BenchmarkRedisConcurrency(b *testing.B) {
	e := newBenchEnv(b)
	twoWindows := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute))
	for _, g := range []int{1, 4, 16, 64, 256} {
		name := "goroutines=" + strconv.Itoa(g)
		b.Run("Decide2WindowsBatch32x1/"+name, e.decide(twoWindows, Options{Batch: 32, batchWorkers: 1}, false, g))
		b.Run("Decide2WindowsBatch32x2/"+name, e.decide(twoWindows, Options{Batch: 32, batchWorkers: 2}, false, g))
		b.Run("Decide2WindowsBatch32x4/"+name, e.decide(twoWindows, Options{Batch: 32, batchWorkers: 4}, false, g))
		b.Run("Decide2WindowsBatch32x2NoRetries/"+name, e.decide(twoWindows, Options{Batch: 32, batchWorkers: 2}, false, g, "?max_retries=-1"))
		b.Run("RedisRateAllow1Window/"+name, e.rate(false, g))
		b.Run("RedisRateAllow1WindowGoRedisAutoPipeline/"+name, e.rate(true, g))
	}
}

// benchEnv is one redis-server, or the masters of a cluster, and an admin
// client per server for its statistics.
type benchEnv struct {
	url    string          // what NewClient is given
	admin  *redis.Client   // admins[0]
	admins []*redis.Client // one per server (per master on a cluster)
}

func newBenchEnv(b *testing.B) *benchEnv {
	srv := redistest.Start(b)
	return newBenchEnvOn(b, srv.URL(), srv.Addr())
}

func newBenchEnvOn(b *testing.B, url string, addrs ...string) *benchEnv {
	e := &benchEnv{url: url}
	for _, a := range addrs {
		admin := redis.NewClient(&redis.Options{Addr: a})
		b.Cleanup(func() { _ = admin.Close() })
		e.admins = append(e.admins, admin)
	}
	e.admin = e.admins[0]
	return e
}

// client is a client as sluice builds one (NewClient), for both peers
// alike; query is added to the URL ("?max_retries=-1": the lean store).
func (e *benchEnv) client(b *testing.B, query ...string) *redis.Client {
	c, ok := e.universal(b, query...).(*redis.Client)
	if !ok {
		b.Fatal("not a plain client")
	}
	return c
}

// universal is client for any URL, a cluster's included.
func (e *benchEnv) universal(b *testing.B, query ...string) redis.UniversalClient {
	u, err := NewClient(e.url + strings.Join(query, ""))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = u.Close() })
	return u
}

// BenchmarkRedisClusterConcurrency is BenchmarkRedisConcurrency on a
// three-master cluster (startCluster): our two-window decision as the
// binary runs it and redis_rate's one-window Allow, both through the
// ClusterClient NewClient builds. On a cluster a script call carries one
// decision (its key is in its client's slot); a batch is one pipeline per
// master. Besides the totals, m<i>-redis-µs/op is master i's time in
// script calls per decision of the whole run (INFO commandstats), so the
// three add up to redis-µs/op; the busiest master is what a given
// decisions/s needs of each.
func BenchmarkRedisClusterConcurrency(b *testing.B) {
	addrs := startCluster(b)
	e := newBenchEnvOn(b, "redis+cluster://"+strings.Join(addrs, ","), addrs...)
	twoWindows := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute))
	for _, g := range []int{1, 4, 16, 64, 256} {
		name := "goroutines=" + strconv.Itoa(g)
		b.Run("Decide2WindowsBatch32x1/"+name, e.decide(twoWindows, Options{Batch: 32, batchWorkers: 1}, false, g))
		b.Run("Decide2WindowsBatch32x2/"+name, e.decide(twoWindows, Options{Batch: 32, batchWorkers: 2}, false, g))
		b.Run("RedisRateAllow1Window/"+name, e.rate(false, g))
	}
}

// BenchmarkRoomFrame: the usual EVENT with the actor quota on (one window
// budget and the actor's room, DecideAll) against the EVENT's window alone,
// as the binary's store decides them (Batch 32), at 64 goroutines, on one
// Redis (the room in the frame's own call) and on a 3-master cluster (the
// room a decision of its own beside the window's). Every actor has room,
// so nothing is refunded: what reading the room with each frame costs.
func BenchmarkRoomFrame(b *testing.B) {
	for _, where := range []string{"standalone", "cluster"} {
		b.Run(where, func(b *testing.B) {
			var e *benchEnv
			if where == "cluster" {
				addrs := startCluster(b)
				e = newBenchEnvOn(b, "redis+cluster://"+strings.Join(addrs, ","), addrs...)
			} else {
				e = newBenchEnv(b)
			}
			w := storetest.MustWindows(ratelimit.PerPeriod(1000, time.Second))
			room := &ratelimit.Room{Events: 1 << 20, Window: time.Minute}
			for _, withRoom := range []bool{false, true} {
				name := "Window"
				if withRoom {
					name = "WindowAndRoom"
				}
				b.Run(name, func(b *testing.B) {
					s := newStore(b, e.universal(b), Options{Timeout: time.Second, Batch: 32})
					b.Cleanup(func() { _ = s.Close() })
					e.parallel(b, 64, s, func(ctx context.Context, key string) (bool, error) {
						budgets := []ratelimit.Budget{{Key: key, Windows: w}}
						if withRoom {
							budgets = append(budgets, ratelimit.Budget{Key: "{q:" + key + "}:quota:60000", Room: room})
						}
						d, err := s.DecideAll(ctx, budgets, time.Time{})
						return d.Allowed, err
					})
				})
			}
		})
	}
}

// parallel runs call from g goroutines (exactly: RunParallel cannot run
// fewer than GOMAXPROCS) over the benchmark keys and reports the metrics. call reports whether the request was
// admitted: admitted-% is reported so that a comparison can check both
// peers mostly admit (a refusal writes nothing and costs a different
// amount).
func (e *benchEnv) parallel(b *testing.B, g int, s *Store, call func(ctx context.Context, key string) (bool, error)) {
	ctx := context.Background()
	var next atomic.Uint64
	var failed, admitted atomic.Int64
	for _, a := range e.admins {
		if err := a.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	b.ReportAllocs()
	cpu0, srv0 := processCPU(b), e.serverCPU(b)
	b.ResetTimer()
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			i := next.Add(7919)
			var ok int64
			for left.Add(-1) >= 0 {
				i++
				if allowed, err := call(ctx, benchKeys[i%benchClients]); err != nil {
					failed.Add(1)
				} else if allowed {
					ok++
				}
			}
			admitted.Add(ok)
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "client-cpu-µs/op")
	b.ReportMetric(float64((e.serverCPU(b)-srv0).Microseconds())/float64(b.N), "server-cpu-µs/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	var total float64
	for i, a := range e.admins {
		us := evalshaMicros(b, a)
		total += us
		if len(e.admins) > 1 {
			b.ReportMetric(us/float64(b.N), "m"+strconv.Itoa(i)+"-redis-µs/op")
		}
	}
	b.ReportMetric(total/float64(b.N), "redis-µs/op")
	b.ReportMetric(100*float64(admitted.Load())/float64(b.N), "admitted-%")
	if s != nil && s.batch != nil {
		b.ReportMetric(float64(s.batch.calls.Load())/float64(max(s.batch.pipelines.Load(), 1)), "calls/pipeline")
		b.ReportMetric(100*float64(s.batch.direct.Load())/float64(b.N), "direct-%")
	}
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d calls failed", n, b.N)
	}
}

// decide benchmarks our Store deciding limits, at g goroutines.
func (e *benchEnv) decide(limits *ratelimit.Windows, opts Options, ap bool, g int, query ...string) func(b *testing.B) {
	return func(b *testing.B) {
		u := e.universal(b, query...)
		opts.Timeout = time.Second
		s := newStore(b, u, opts)
		b.Cleanup(func() { _ = s.Close() })
		if ap {
			c := u.(*redis.Client)
			// Not an option of the Store: go-redis's auto-pipeliner does
			// not bound a call by its deadline (see batch.go). Measured
			// for comparison only.
			p, err := c.AutoPipeline()
			if err != nil {
				b.Fatal(err)
			}
			s.client = p
		}
		e.parallel(b, g, s, func(ctx context.Context, key string) (bool, error) {
			d, err := s.Decide(ctx, key, limits, time.Time{})
			return d.Allowed, err
		})
	}
}

// rate benchmarks the peer, redis_rate's Allow, at g goroutines.
func (e *benchEnv) rate(ap bool, g int) func(b *testing.B) {
	return func(b *testing.B) {
		u := e.universal(b)
		var lim *redis_rate.Limiter
		if ap {
			p, err := u.(*redis.Client).AutoPipeline()
			if err != nil {
				b.Fatal(err)
			}
			lim = redis_rate.NewLimiter(p)
		} else {
			lim = redis_rate.NewLimiter(u)
		}
		limit := redis_rate.Limit{Rate: 10, Burst: 10, Period: time.Second}
		e.parallel(b, g, nil, func(ctx context.Context, key string) (bool, error) {
			r, err := lim.Allow(ctx, key, limit)
			return err == nil && r.Allowed > 0, err
		})
	}
}

// ping benchmarks the floor under every decision: one round trip that
// decides nothing, a PING, through the client NewClient builds or (raw) as
// bare RESP over one net.Conn per goroutine, written and read by hand. Its
// client-cpu-µs/op is what any answer from Redis costs this process on
// this machine, whatever the script or client.
func (e *benchEnv) ping(raw bool, g int) func(b *testing.B) {
	return func(b *testing.B) {
		if !raw {
			c := e.universal(b)
			e.parallel(b, g, nil, func(ctx context.Context, _ string) (bool, error) {
				return true, c.Ping(ctx).Err()
			})
			return
		}
		conns := make(chan net.Conn, g)
		for range g {
			c, err := net.Dial("tcp", e.admin.Options().Addr)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = c.Close() })
			conns <- c
		}
		ping := []byte("*1\r\n$4\r\nPING\r\n")
		e.parallel(b, g, nil, func(context.Context, string) (bool, error) {
			c := <-conns
			defer func() { conns <- c }()
			var buf [7]byte // +PONG\r\n
			if _, err := c.Write(ping); err != nil {
				return false, err
			}
			if _, err := io.ReadFull(c, buf[:]); err != nil {
				return false, err
			}
			if string(buf[:]) != "+PONG\r\n" {
				return false, errors.New("not a PONG: " + strconv.Quote(string(buf[:])))
			}
			return true, nil
		})
	}
}

// processCPU returns the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU returns the CPU time every server of e has used (see serverCPU).
func (e *benchEnv) serverCPU(b *testing.B) time.Duration {
	var d time.Duration
	for _, a := range e.admins {
		d += serverCPU(b, a)
	}
	return d
}

// serverCPU returns the CPU time (user and system) redis-server has used,
// from INFO cpu: its whole cost, reading and writing sockets included,
// where redis-µs/op is only the script's wall time.
func serverCPU(b *testing.B, c *redis.Client) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// evalshaMicros returns the server's microseconds in EVALSHA since the
// last CONFIG RESETSTAT.
func evalshaMicros(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			_, v, _ := strings.Cut(rest, "usec=")
			v, _, _ = strings.Cut(v, ",")
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// BenchmarkDecideBreakerOpen: while Redis is down and the breaker open, a
// decision is refused without a dial, a timer or an allocation.
func BenchmarkDecideBreakerOpen(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = c.Close() })
	s := newStore(b, c, Options{breaker: breakerOptions{Failures: 1, CoolDown: time.Hour}})
	limits := storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute))
	ctx := context.Background()
	if _, err := s.Decide(ctx, benchKeys[0], limits, time.Time{}); err == nil {
		b.Fatal("decided against a closed port")
	}
	if s.breakerNow() != breakerOpen {
		b.Fatalf("breaker %v", s.breakerNow())
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Decide(ctx, benchKeys[1], limits, time.Time{}); !errors.Is(err, errBreakerOpen) {
				b.Fatal(err)
			}
		}
	})
}
