package ratelimit

import (
	"context"
	"time"
)

// Limiter is a Store plus a bounded local table of clients already told to
// wait. STUB: signatures fixed, body to be written.
type Limiter struct{}

// LimiterOptions configures a Limiter. The zero value is usable.
type LimiterOptions struct {
	// Now is the clock; nil means time.Now, and then the store's own clock
	// decides (Redis TIME) while the local table uses time.Now.
	Now func() time.Time
	// BlockedSlots sizes the local refused-until table; 0 means a default.
	BlockedSlots int
}

// NewLimiter returns a Limiter over store.
func NewLimiter(store Store, opts LimiterOptions) *Limiter { panic("unimplemented") }

// Allow decides one message for key against limits. A refusal is a Decision;
// err != nil (wrapping ErrUnavailable) only when the store failed.
func (l *Limiter) Allow(ctx context.Context, key string, limits []Limit) (Decision, error) {
	panic("unimplemented")
}
