//go:build !race

// Left out of -race builds with the other end-to-end tests (see e2e_test.go).

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/nbd-wtf/go-nostr/nip77/negentropy"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy/storage/vector"
	"github.com/sluice-relay/sluice/internal/nostrtest"
)

// TestE2ESyncMemoryBounded: NIP-77 syncs (NEG-OPEN) cost sluice relay
// memory in proportion to max_sync_events, not to the event store's own
// bound. Without max_sync_events, eventstore's badger backend allows
// 16,777,216 events per sync and allocates its result slice at that size
// whatever matches, so one client's burst of syncs could take the relay
// down (BenchmarkSyncCost; docs/BENCHMARKS.md, "NIP-77 syncs on the event
// store (`max_sync_events`)").
// Here 10 NEG-OPENs for everything, one after another, must leave the
// process's peak resident memory (VmHWM) under 256 MB.
func TestE2ESyncMemoryBounded(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/PID/status")
	}
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	writeConfig(t, cfg, "limits: {message: {NEG-OPEN: [{rate: 1000, period: 1s}]}, syncs: 10}\n")
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))
	c := dialRaw(t, ctx, p.url())
	c.challenge()
	// One event, so that the sync has something to cover.
	sk, _ := newKey(t)
	if ok, reason := c.publish(nostrtest.Note(t, sk, "synced")); !ok {
		t.Fatalf("EVENT refused: %s", reason)
	}

	v := vector.New()
	v.Seal()
	start := negentropy.New(v, 1024*1024).Start()
	for i := range 10 {
		frame := fmt.Sprintf(`["NEG-OPEN","sync%d",{},%q]`, i, start)
		if err := c.c.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
			t.Fatal(err)
		}
		if msg := c.read(); len(msg) < 2 || string(msg[0]) != `"NEG-MSG"` {
			t.Fatalf("NEG-OPEN %d answered %s", i, msg)
		}
	}
	peak := vmHWM(t, p.cmd.Process.Pid)
	t.Logf("peak resident memory after 10 syncs: %d MB", peak>>20)
	if peak > 256<<20 {
		t.Fatalf("peak resident memory %d MB after 10 NEG-OPENs, want under 256 MB", peak>>20)
	}
}

// vmHWM returns process pid's peak resident set size, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}
