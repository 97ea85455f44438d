package ratelimit

import (
	"context"
	"time"
)

// MemoryStore is a Store in bounded process memory. STUB: signatures fixed, body to be written.
type MemoryStore struct {
	// Now is the clock used when Decide gets the zero instant; nil means time.Now.
	Now func() time.Time
}

// NewMemoryStore returns a store with at least slots slots (rounded up to a
// power of two); slots ≤ 0 means DefaultMemorySlots.
func NewMemoryStore(slots int) *MemoryStore { panic("unimplemented") }

// Decide implements Store.
func (m *MemoryStore) Decide(ctx context.Context, key string, limits []Limit, now time.Time) (Decision, error) {
	panic("unimplemented")
}
