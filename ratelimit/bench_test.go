package ratelimit_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// benchKeys are realistic message keys: many clients, one type.
var benchKeys = func() []string {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = messageKey("2001:db8:"+strconv.FormatInt(int64(i), 16)+"::/64", "EVENT")
	}
	return keys
}()

var benchLimits = map[string]*ratelimit.Windows{
	// Generous: the common case, every message admitted.
	"windows=1": ratelimit.MustWindows(ratelimit.PerPeriod(1e9, time.Second)),
	"windows=2": ratelimit.MustWindows(ratelimit.PerPeriod(1e9, time.Second), ratelimit.PerPeriod(1e10, time.Minute)),
	// Tight: most messages refused, so the wait is computed.
	"windows=2/refusing": ratelimit.MustWindows(ratelimit.PerPeriod(2, time.Second), ratelimit.PerPeriod(4, time.Minute)),
}

// goroutineSeq hands each RunParallel goroutine its own starting point.
var goroutineSeq atomic.Int64

// reportCPU adds cpu-ns/op, the process's CPU time per op since start (see
// processCPU). Call it with the CPU time read after b.ResetTimer.
func reportCPU(b *testing.B, start time.Duration) {
	if cpu := processCPU() - start; cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkMemoryStoreDecide measures one decision through the Store
// interface: no allocation, admitted or refused.
func BenchmarkMemoryStoreDecide(b *testing.B) {
	for _, name := range []string{"windows=1", "windows=2", "windows=2/refusing"} {
		limits := benchLimits[name]
		b.Run(name, func(b *testing.B) {
			var s ratelimit.Store = ratelimit.NewMemoryStore(0)
			ctx := context.Background()
			b.ReportAllocs()
			cpu := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				i := int(goroutineSeq.Add(1)) * 997
				for pb.Next() {
					i++
					s.Decide(ctx, benchKeys[i&4095], limits, t0.Add(time.Duration(i)*time.Microsecond))
				}
			})
			reportCPU(b, cpu)
		})
	}
}

// BenchmarkLimiterAllow is the gate's hot path over the memory store:
// local table lookup, then the store's allocation-free decision.
func BenchmarkLimiterAllow(b *testing.B) {
	lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), nil)
	limits := benchLimits["windows=2"]
	ctx := context.Background()
	b.ReportAllocs()
	cpu := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		i := int(goroutineSeq.Add(1)) * 997
		for pb.Next() {
			i++
			lim.AllowAt(ctx, benchKeys[i&4095], limits, t0.Add(time.Duration(i)*time.Microsecond))
		}
	})
	reportCPU(b, cpu)
}

// BenchmarkLimiterBlockedFlood: clients already refused keep sending; the
// local table answers, so the store is called ≈ 0 times per message.
func BenchmarkLimiterBlockedFlood(b *testing.B) {
	store := &countingStore{inner: ratelimit.NewMemoryStore(0)}
	lim := ratelimit.NewLimiter(store, nil)
	limits := ratelimit.MustWindows(ratelimit.PerPeriod(2, time.Hour))
	ctx := context.Background()
	flooders := benchKeys[:64]
	for _, k := range flooders {
		for range 3 {
			lim.AllowAt(ctx, k, limits, t0)
		}
	}
	before := store.calls.Load()
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		i := int(goroutineSeq.Add(1))
		for pb.Next() {
			i++
			d, _ := lim.AllowAt(ctx, flooders[i&63], limits, t1)
			if d.Allowed {
				b.Error("a blocked client was admitted")
				return
			}
		}
	})
	reportCPU(b, cpu)
	b.ReportMetric(float64(store.calls.Load()-before)/float64(b.N), "storecalls/op")
}

// BenchmarkQuota is one check and one charge, as the gate does for an EVENT
// the relay accepted, over many actors.
func BenchmarkQuota(b *testing.B) {
	q, _ := ratelimit.NewQuota(600, time.Minute)
	b.ReportAllocs()
	cpu := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		i := int(goroutineSeq.Add(1)) * 997
		for pb.Next() {
			i++
			k := benchKeys[i&4095]
			at := t0.Add(time.Duration(i) * time.Microsecond)
			if over, _ := q.ExceededAt(k, at); !over {
				q.AddAt(k, at)
			}
		}
	})
	reportCPU(b, cpu)
}
