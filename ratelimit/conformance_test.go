package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// TestConformanceMemory runs the cross-store suite against MemoryStore. The
// table is large (2^20 slots) so that the suite's few keys never share a
// slot: sharing is the memory store's documented trade, not a disagreement.
func TestConformanceMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Scorer { return memoryScorer(ratelimit.NewMemoryStore(1 << 20)) })
}

// TestMemoryWaitIsExactSeeds runs the exact-wait property over more seeds
// than the suite does; the memory store is fast enough for it.
func TestMemoryWaitIsExactSeeds(t *testing.T) {
	for seed := uint64(2); seed < 12; seed++ {
		storetest.WaitIsExact(t, ratelimit.NewMemoryStore(1<<20), seed, 300)
	}
}

// memoryScorer is m as the conformance suite reads a store: decisions with
// their scores.
func memoryScorer(m *ratelimit.MemoryStore) storetest.Scorer {
	return func(ctx context.Context, key string, ws *ratelimit.Windows, now time.Time) (ratelimit.Decision, []float64, error) {
		return ratelimit.DecideScores(m, ctx, key, ws, now)
	}
}
