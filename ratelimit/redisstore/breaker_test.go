package redisstore

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a settable clock for the breaker.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) add(d time.Duration) { c.ns.Add(int64(d)) }
func mustBreaker(t *testing.T, o breakerOptions) *breaker {
	t.Helper()
	b, err := newBreaker(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// trip records one non-probe round trip, checking the breaker let it through.
func trip(t *testing.T, b *breaker, o outcome) {
	t.Helper()
	probe, ok := b.allow()
	if !ok || probe {
		t.Fatalf("closed breaker: allow %v probe %v", ok, probe)
	}
	b.record(false, o)
}

func TestBreakerOpensOnFailureRate(t *testing.T) {
	clk := newFakeClock()
	b := mustBreaker(t, breakerOptions{Failures: 3, CoolDown: time.Second, now: clk.now})
	// 2 failures in 3: the rate is over half, but fewer than 3 failures.
	trip(t, b, outcomeFailed)
	trip(t, b, outcomeOK)
	trip(t, b, outcomeFailed)
	if b.state() != breakerClosed {
		t.Fatalf("state %v after 2 failures, want closed", b.state())
	}
	// Not consecutive, and still opens: 3 failures of 5 round trips.
	trip(t, b, outcomeOK)
	trip(t, b, outcomeFailed)
	if b.state() != breakerOpen {
		t.Fatalf("state %v after 3 failures of 5, want open", b.state())
	}
	for range 1000 {
		if _, ok := b.allow(); ok {
			t.Fatal("open breaker let a call through")
		}
	}
	// The first probe comes after a tenth of the cool-down.
	clk.add(99 * time.Millisecond)
	if _, ok := b.allow(); ok || b.state() != breakerOpen {
		t.Fatal("let a call through before the first cool-down ended")
	}
	clk.add(time.Millisecond)
	if b.state() != breakerHalfOpen {
		t.Fatalf("state %v after the first cool-down, want half-open", b.state())
	}
}

// TestBreakerProbesBackOff: the first probe of an outage comes after a
// tenth of CoolDown, so decisions resume within that of Redis answering;
// each failed probe doubles the wait up to CoolDown; a good probe starts
// it over.
func TestBreakerProbesBackOff(t *testing.T) {
	clk := newFakeClock()
	b := mustBreaker(t, breakerOptions{Failures: 1, CoolDown: time.Second, now: clk.now})
	b.record(false, outcomeFailed)
	for _, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		clk.add(want - time.Millisecond)
		if _, ok := b.allow(); ok {
			t.Fatalf("probe before %v", want)
		}
		clk.add(time.Millisecond)
		probe, ok := b.allow()
		if !ok || !probe {
			t.Fatalf("no probe after %v", want)
		}
		b.record(true, outcomeFailed)
	}
	clk.add(time.Second)
	if probe, ok := b.allow(); !ok || !probe {
		t.Fatal("no probe after the longest cool-down")
	}
	b.record(true, outcomeOK)
	b.record(false, outcomeFailed) // a new outage
	clk.add(100 * time.Millisecond)
	if probe, ok := b.allow(); !ok || !probe {
		t.Fatal("a new outage does not start the backoff over")
	}
}

// TestBreakerRateBelowHalfStaysClosed: a few failed round trips among many
// answered ones (one stalled batch, a reset connection) are not an outage.
func TestBreakerRateBelowHalfStaysClosed(t *testing.T) {
	clk := newFakeClock()
	b := mustBreaker(t, breakerOptions{now: clk.now})
	for range 20 {
		for range 2 {
			trip(t, b, outcomeOK)
			clk.add(10 * time.Millisecond)
		}
		trip(t, b, outcomeFailed)
	}
	if b.state() != breakerClosed {
		t.Fatalf("state %v with a third of round trips failing, want closed", b.state())
	}
}

// TestBreakerWindowForgets: failures older than the window do not add up
// with new ones.
func TestBreakerWindowForgets(t *testing.T) {
	clk := newFakeClock()
	b := mustBreaker(t, breakerOptions{Failures: 5, Window: time.Second, now: clk.now})
	for range 10 {
		for range 4 {
			trip(t, b, outcomeFailed)
		}
		clk.add(1100 * time.Millisecond)
	}
	if b.state() != breakerClosed {
		t.Fatalf("state %v: 4 failures a window never reach 5, want closed", b.state())
	}
	trip(t, b, outcomeFailed)
	for range 4 {
		trip(t, b, outcomeFailed)
	}
	if b.state() != breakerOpen {
		t.Fatalf("state %v after 5 failures in a window, want open", b.state())
	}
}

func TestBreakerHalfOpenLetsOneProbe(t *testing.T) {
	clk := newFakeClock()
	b := mustBreaker(t, breakerOptions{Failures: 1, CoolDown: time.Second, now: clk.now})
	b.record(false, outcomeFailed)
	clk.add(time.Second)

	var probes atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if probe, ok := b.allow(); ok {
					if !probe {
						t.Error("half-open let a non-probe through")
					}
					probes.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := probes.Load(); n != 1 {
		t.Fatalf("%d probes through a half-open breaker, want 1", n)
	}

	// The probe fails: open for another cool-down.
	b.record(true, outcomeFailed)
	if b.state() != breakerOpen {
		t.Fatalf("state %v after a failed probe, want open", b.state())
	}
	clk.add(time.Second)
	probe, ok := b.allow()
	if !ok || !probe {
		t.Fatal("no probe after the second cool-down")
	}
	// The probe succeeds: closed, with a fresh window, and calls flow.
	b.record(true, outcomeOK)
	if b.state() != breakerClosed {
		t.Fatalf("state %v after a good probe, want closed", b.state())
	}
	for range 10 {
		if probe, ok := b.allow(); !ok || probe {
			t.Fatal("closed breaker refused or probed")
		}
	}
}

func TestBreakerCallerGaveUp(t *testing.T) {
	clk := newFakeClock()
	b := mustBreaker(t, breakerOptions{Failures: 2, CoolDown: time.Second, now: clk.now})
	for range 10 {
		b.record(false, outcomeIgnored)
	}
	if b.state() != breakerClosed {
		t.Fatal("callers giving up opened the breaker")
	}
	b.record(false, outcomeFailed)
	b.record(false, outcomeFailed)
	clk.add(time.Second)
	probe, ok := b.allow()
	if !ok || !probe {
		t.Fatal("no probe")
	}
	// The probe's caller gives up: the slot is handed back, still half-open.
	b.record(true, outcomeIgnored)
	if probe, ok := b.allow(); !ok || !probe {
		t.Fatal("probe slot not handed back after the caller gave up")
	}
}

func TestBreakerDisabled(t *testing.T) {
	b := mustBreaker(t, breakerOptions{Failures: -1})
	for range 100 {
		b.record(false, outcomeFailed)
	}
	if _, ok := b.allow(); !ok || b.state() != breakerClosed {
		t.Fatal("disabled breaker opened")
	}
}

func TestBreakerStateString(t *testing.T) {
	for s, want := range map[breakerState]string{breakerClosed: "closed", breakerOpen: "open", breakerHalfOpen: "half-open", 7: "breakerState(7)"} {
		if s.String() != want {
			t.Errorf("%d: %q, want %q", int(s), s.String(), want)
		}
	}
}
