package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fiatjaf/eventstore/badger"
	"github.com/fiatjaf/khatru"
	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy/storage/vector"
)

// BenchmarkSyncCost: what one NIP-77 sync over everything (["NEG-OPEN",id,
// {},…]) costs khatru on the badger store sluice relay uses, with the
// store's own negentropy bound (16,777,216) against max_sync_events'
// default (100,000), on a store of 1,000 and of 100,000 events: peak heap
// above the idle process while the syncs are built (sampled every 2 ms),
// the heap the open syncs keep, and CPU time per sync. Each op is one
// NEG-OPEN on one connection; the syncs stay open until the benchmark
// ends. Slow (the 100,000-event store takes a while to fill):
//
//	go test ./cmd/sluice -run '^$' -bench SyncCost -benchtime 4x
func BenchmarkSyncCost(b *testing.B) {
	for _, events := range []int{1000, 100_000} {
		for _, bound := range []int{16_777_216, defaultMaxSyncEvents} {
			b.Run(fmt.Sprintf("events=%d/bound=%d", events, bound), func(b *testing.B) {
				syncCost(b, events, bound)
			})
		}
	}
}

func syncCost(b *testing.B, events, bound int) {
	db := &badger.BadgerBackend{Path: b.TempDir(), MaxLimitNegentropy: bound}
	if err := db.Init(); err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	ctx := context.Background()
	for i := range events {
		// Not signed: the store does not check, and signing 100,000
		// events would be most of the run.
		ev := nostr.Event{Kind: 1, PubKey: pk, CreatedAt: nostr.Timestamp(1_700_000_000 + i),
			Tags: nostr.Tags{}, Content: strings.Repeat("x", 200) + strconv.Itoa(i), Sig: strings.Repeat("0", 128)}
		ev.ID = ev.GetID()
		if err := db.SaveEvent(ctx, &ev); err != nil {
			b.Fatal(err)
		}
	}
	kr := khatru.NewRelay()
	kr.QueryEvents = append(kr.QueryEvents, db.QueryEvents)
	kr.Negentropy = true
	srv := httptest.NewServer(kr)
	defer srv.Close()
	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	v := vector.New()
	v.Seal()
	start := negentropy.New(v, 1024*1024).Start()

	base := liveHeap()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
		}
	}()
	cpu0 := processCPUTime(b)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := c.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf(`["NEG-OPEN","s%d",{},%q]`, i, start))); err != nil {
			b.Fatal(err)
		}
		if _, reply, err := c.ReadMessage(); err != nil || !strings.HasPrefix(string(reply), `["NEG-MSG"`) {
			b.Fatalf("NEG-OPEN %d: %.60s %v", i, reply, err)
		}
	}
	b.StopTimer()
	cpu := processCPUTime(b) - cpu0
	close(stop)
	<-sampled
	kept := liveHeap()
	mb := func(n uint64) float64 { return float64(n) / 1e6 }
	b.ReportMetric(mb(peak.Load()-min(peak.Load(), base)), "peak-heap-MB")
	b.ReportMetric(mb(kept-min(kept, base))/float64(b.N), "kept-MB/sync")
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/sync")
}

// liveHeap is the heap in use after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// processCPUTime is this process's user and system CPU time.
func processCPUTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
