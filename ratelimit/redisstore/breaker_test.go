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
func mustBreaker(t *testing.T, o BreakerOptions) *breaker {
	t.Helper()
	b, err := newBreaker(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	clk := newFakeClock()
	b := mustBreaker(t, BreakerOptions{Failures: 3, CoolDown: time.Second, now: clk.now})
	fail := func() {
		t.Helper()
		probe, ok := b.allow()
		if !ok {
			t.Fatal("refused while closed")
		}
		b.done(probe, false, false)
	}
	fail()
	fail()
	// A success in between resets the count: failures must be consecutive.
	b.done(false, true, false)
	fail()
	fail()
	if b.state() != BreakerClosed {
		t.Fatalf("state %v after 2 consecutive failures, want closed", b.state())
	}
	fail()
	if b.state() != BreakerOpen {
		t.Fatalf("state %v after 3, want open", b.state())
	}
	for range 1000 {
		if _, ok := b.allow(); ok {
			t.Fatal("open breaker let a call through")
		}
	}
	clk.add(999 * time.Millisecond)
	if _, ok := b.allow(); ok || b.state() != BreakerOpen {
		t.Fatal("let a call through before the cool-down ended")
	}
	clk.add(time.Millisecond)
	if b.state() != BreakerHalfOpen {
		t.Fatalf("state %v after the cool-down, want half-open", b.state())
	}
}

func TestBreakerHalfOpenLetsOneProbe(t *testing.T) {
	clk := newFakeClock()
	b := mustBreaker(t, BreakerOptions{Failures: 1, CoolDown: time.Second, now: clk.now})
	b.done(false, false, false)
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
	b.done(true, false, false)
	if b.state() != BreakerOpen {
		t.Fatalf("state %v after a failed probe, want open", b.state())
	}
	clk.add(time.Second)
	probe, ok := b.allow()
	if !ok || !probe {
		t.Fatal("no probe after the second cool-down")
	}
	// The probe succeeds: closed, and calls flow.
	b.done(true, true, false)
	if b.state() != BreakerClosed {
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
	b := mustBreaker(t, BreakerOptions{Failures: 2, CoolDown: time.Second, now: clk.now})
	for range 10 {
		b.done(false, false, true)
	}
	if b.state() != BreakerClosed {
		t.Fatal("callers giving up opened the breaker")
	}
	b.done(false, false, false)
	b.done(false, false, false)
	clk.add(time.Second)
	probe, ok := b.allow()
	if !ok || !probe {
		t.Fatal("no probe")
	}
	// The probe's caller gives up: the slot is handed back, still half-open.
	b.done(true, false, true)
	if probe, ok := b.allow(); !ok || !probe {
		t.Fatal("probe slot not handed back after the caller gave up")
	}
}

func TestBreakerDisabled(t *testing.T) {
	b := mustBreaker(t, BreakerOptions{Failures: -1})
	for range 100 {
		b.done(false, false, false)
	}
	if _, ok := b.allow(); !ok || b.state() != BreakerClosed {
		t.Fatal("disabled breaker opened")
	}
}

func TestBreakerStateString(t *testing.T) {
	for s, want := range map[BreakerState]string{BreakerClosed: "closed", BreakerOpen: "open", BreakerHalfOpen: "half-open", 7: "BreakerState(7)"} {
		if s.String() != want {
			t.Errorf("%d: %q, want %q", int(s), s.String(), want)
		}
	}
}
