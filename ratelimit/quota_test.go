package ratelimit_test

import (
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluice-relay/sluice/ratelimit"
)

func TestNewQuotaValidates(t *testing.T) {
	for _, tt := range []struct {
		events int
		window time.Duration
	}{
		{0, time.Minute}, {-1, time.Minute}, {10, 0}, {10, -time.Second},
		{ratelimit.MaxQuotaEvents + 1, time.Minute},
	} {
		if q, err := ratelimit.NewQuota(tt.events, tt.window); !errors.Is(err, ratelimit.ErrInvalidQuota) || q != nil {
			t.Errorf("NewQuota(%d, %v) = %v, %v; want ErrInvalidQuota", tt.events, tt.window, q, err)
		}
	}
	q, err := ratelimit.NewQuota(600, time.Minute)
	if err != nil || q.Events() != 600 || q.Window() != time.Minute || (q.Events() == 0) {
		t.Fatalf("NewQuota(600, 1m) = %+v, %v", q, err)
	}
}

func TestQuotaLimitAndNextWindow(t *testing.T) {
	q, _ := ratelimit.NewQuota(3, time.Minute)
	w0 := t0.Add(10 * time.Second) // t0 is on a minute boundary
	alice := "alice-pubkey"
	for i := range 3 {
		if ex, _ := q.ExceededAt(alice, w0); ex {
			t.Fatalf("event %d: exceeded before the limit", i)
		}
		if !q.AddAt(alice, w0) {
			t.Fatalf("event %d: refused before the limit", i)
		}
	}
	ex, wait := q.ExceededAt(alice, w0)
	if !ex || wait != 50*time.Second {
		t.Fatalf("after 3: Exceeded = %v %v, want true, 50s until the next window", ex, wait)
	}
	if q.AddAt(alice, w0.Add(49*time.Second)) {
		t.Fatal("fourth event in the window was admitted")
	}
	// The next window starts afresh.
	w1 := t0.Add(time.Minute)
	if ex, _ := q.ExceededAt(alice, w1); ex {
		t.Fatal("exceeded in the next window")
	}
	for i := range 3 {
		if !q.AddAt(alice, w1) {
			t.Fatalf("next window, event %d refused", i)
		}
	}
	if q.AddAt(alice, w1) {
		t.Fatal("next window: fourth admitted")
	}
	// A late caller still in the old window does not roll the slot back to
	// it and get a fresh count there.
	if q.AddAt(alice, w0) {
		t.Fatal("a late event from the old window reset the new one")
	}
	if ex, wait := q.ExceededAt(alice, w0); !ex || wait != 110*time.Second {
		t.Fatalf("late Exceeded = %v %v, want the newer window's end, 110s away", ex, wait)
	}
}

func TestQuotaUnlimited(t *testing.T) {
	var nilQuota *ratelimit.Quota
	for _, q := range []*ratelimit.Quota{nilQuota} {
		if !(q.Events() == 0) || q.Events() != 0 || q.Window() != 0 {
			t.Fatalf("%v: not unlimited", q)
		}
		for i := range 100_000 {
			if !q.AddAt("one-actor", t0) {
				t.Fatalf("event %d refused", i)
			}
		}
		if ex, wait := q.ExceededAt("one-actor", t0); ex || wait != 0 {
			t.Fatalf("Exceeded = %v %v", ex, wait)
		}
	}
}

// TestQuotaDistinctActorsAllocateNothing: the table is fixed, whoever comes.
func TestQuotaDistinctActorsAllocateNothing(t *testing.T) {
	q, _ := ratelimit.NewQuota(600, time.Minute)
	actors := make([]string, 10_000)
	for i := range actors {
		actors[i] = "npub" + strconv.Itoa(i*7919)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	allocs := testing.AllocsPerRun(1, func() {
		for _, a := range actors {
			q.AddAt(a, t0)
			q.ExceededAt(a, t0)
		}
	})
	runtime.GC()
	runtime.ReadMemStats(&after)
	if allocs != 0 {
		t.Errorf("10,000 actors: %v allocations, want 0", allocs)
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 64<<10 {
		t.Errorf("10,000 actors grew the heap by %d bytes", grew)
	}
	// The table is an array inside the Quota: its size is fixed by type.
	if size := unsafe.Sizeof(*q); size > 16<<10 {
		t.Errorf("a Quota is %d bytes", size)
	}
}

// TestQuotaRotatingActorsAreBounded: an attacker minting a name per event
// gets at most slots × limit events a window, and honest use of the table
// means more than half of that bound is reachable — it is a bound, not a stop.
func TestQuotaRotatingActorsAreBounded(t *testing.T) {
	const limit = 5
	q, _ := ratelimit.NewQuota(limit, time.Minute)
	admitted := 0
	buf := make([]byte, 0, 32)
	for i := range 200_000 {
		buf = strconv.AppendInt(append(buf[:0], "rotating-"...), int64(i), 10)
		if q.AddAt(string(buf), t0) {
			admitted++
		}
	}
	bound := ratelimit.QuotaSlots * limit
	if admitted > bound || admitted <= bound/2 {
		t.Fatalf("200,000 rotating actors admitted %d times, want in (%d, %d]", admitted, bound/2, bound)
	}
	// And the next window, the same bound again.
	admitted = 0
	for i := range 200_000 {
		buf = strconv.AppendInt(append(buf[:0], "rotating-"...), int64(i), 10)
		if q.AddAt(string(buf), t0.Add(time.Minute)) {
			admitted++
		}
	}
	if admitted > bound || admitted <= bound/2 {
		t.Fatalf("next window: %d admitted", admitted)
	}
}

// TestQuotaConcurrentExact: goroutines racing on one actor in one window
// are admitted exactly the limit; a lost compare-and-swap would admit more.
func TestQuotaConcurrentExact(t *testing.T) {
	const limit = 50_000 // enough contended updates that a lost one shows
	q, _ := ratelimit.NewQuota(limit, time.Minute)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10_000 {
				if q.AddAt("shared-actor", t0) {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != limit {
		t.Fatalf("admitted %d of 80,000, want exactly %d", got, limit)
	}
}

// TestQuotaConcurrent: goroutines race over few actors across a window
// rollover; no window ever admits more than the limit per slot, and
// together they fill it exactly.
func TestQuotaConcurrent(t *testing.T) {
	const limit = 50
	q, _ := ratelimit.NewQuota(limit, time.Second)
	var perWindow [3]atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				w := (i + g) % 3
				// Instants interleave windows 0, 1 and 2 out of order.
				if q.AddAt("shared-actor", t0.Add(time.Duration(w)*time.Second+time.Duration(i)*time.Millisecond)) {
					perWindow[w].Add(1)
				}
				q.ExceededAt("shared-actor", t0)
			}
		}()
	}
	wg.Wait()
	total := perWindow[0].Load() + perWindow[1].Load() + perWindow[2].Load()
	// Late callers are charged to the newer window, so the split between
	// windows varies, but each window admits at most the limit and the
	// slot never loses a count: three windows admit at most 3 × limit,
	// and at least the last window's full limit.
	if total > 3*limit || total < limit {
		t.Fatalf("admitted %d across 3 windows, want between %d and %d", total, limit, 3*limit)
	}
}
