//go:build !race

package relay

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/relay/policy"
)

// A stock go-nostr client that opens three times the default REQ burst at
// once, on one connection, against khatru behind the gate with the
// default limits: with shaping (the default max_delay) every subscription
// gets its EOSE and none is CLOSED; without it (max_delay 0s) two bursts'
// worth are CLOSED "rate-limited". The latency is logged, not asserted:
// the budget paces the held ones, the last about 2T/ln2 after the first.
func TestE2EShapedBurst(t *testing.T) {
	def := policy.DefaultLimits()
	for _, tc := range []struct {
		name     string
		maxDelay time.Duration
		closed   int
	}{
		{"shaped", def.MaxDelay, 0},
		{"unshaped", 0, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := policy.DefaultLimits()
			lim.MaxDelay = tc.maxDelay
			g := newGate(t, Options{Policy: policy.Config{Limits: &lim}, MaxSubscriptions: 200})
			r := connect(t, serve(t, g.Wrap(newKhatru(t))))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			const n = 150 // three times REQ's default burst of 50
			var mu sync.Mutex
			closed, eose := 0, 0
			var last time.Duration
			var wg sync.WaitGroup
			start := time.Now()
			for i := range n {
				sub, err := r.Subscribe(ctx, nostr.Filters{{Kinds: []int{1}, Authors: []string{nostr.GeneratePrivateKey()}, Limit: 1 + i%100}}) // narrow: priced 1
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					select {
					case <-sub.EndOfStoredEvents:
						mu.Lock()
						eose++
						last = max(last, time.Since(start))
						mu.Unlock()
					case <-sub.ClosedReason:
						mu.Lock()
						closed++
						mu.Unlock()
					case <-ctx.Done():
					}
				}()
			}
			wg.Wait()
			if closed != tc.closed || eose != n-tc.closed {
				t.Errorf("%d CLOSED and %d EOSE, want %d and %d", closed, eose, tc.closed, n-tc.closed)
			}
			t.Logf("max_delay %v: %d CLOSED, %d EOSE, the last after %v", tc.maxDelay, closed, eose, last.Round(time.Millisecond))
		})
	}
}
