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

// Test-only names for unexported constants and instant-taking forms.
const (
	DefaultMemorySlots = defaultMemorySlots
	QuotaSlots         = quotaSlots
)

// AllowAt is Allow at the instant now (the zero now: the Limiter's clock).
func (l *Limiter) AllowAt(ctx context.Context, key string, windows *Windows, now time.Time) (Decision, error) {
	return l.allowAt(ctx, key, windows, now)
}

// ExceededAt and AddAt are Exceeded and Add at the instant now.
func (q *Quota) ExceededAt(actor string, now time.Time) (bool, time.Duration) {
	return q.exceeded(actor, now)
}

func (q *Quota) AddAt(actor string, now time.Time) bool { return q.add(actor, now) }

// NewLimiterSlots is NewLimiter with a refused-until table of slots
// entries.
func NewLimiterSlots(store Store, clock Clock, slots int) *Limiter {
	return newLimiter(store, clock, slots)
}

// MustWindows is NewWindows for limits known to be valid; it panics on an
// invalid list.
func MustWindows(limits ...Limit) *Windows {
	w, err := NewWindows(limits...)
	if err != nil {
		panic(err)
	}
	return w
}

// Limits returns the limits w was made from.
func (w *Windows) Limits() []Limit {
	if w == nil {
		return nil
	}
	return w.limits
}

// MaxQuotaEvents is the largest events-per-window NewQuota accepts.
const MaxQuotaEvents = maxQuotaEvents
