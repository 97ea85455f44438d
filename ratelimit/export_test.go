package ratelimit

import (
	"context"
	"time"
)

// DecideScores is MemoryStore.Decide with each window's score after the
// decision, for the conformance suite (storetest.Scorer); the store exports
// nothing for tests alone.
func DecideScores(m *MemoryStore, _ context.Context, key string, ws *Windows, now time.Time) (Decision, []float64, error) {
	out := make([]float64, ws.Len())
	return m.decide(key, ws, now, out), out, nil
}

// SlotsOf returns the size of m's table.
func SlotsOf(m *MemoryStore) int {
	m.once.Do(m.init)
	return len(m.slots)
}
