package ratelimit

import "time"

// Quota is a per-actor fixed-window budget on validated events. STUB.
type Quota struct{}

// NewQuota returns a quota of events per window over DefaultQuotaSlots slots.
// events ≤ 0 or window ≤ 0 is an error; use Unlimited for no quota.
func NewQuota(events int, window time.Duration) (*Quota, error) { panic("unimplemented") }

// Exceeded reports whether actor has used its quota for the window containing
// now, and if so how long until the next window.
func (q *Quota) Exceeded(actor string, now time.Time) (bool, time.Duration) { panic("unimplemented") }

// Add charges one validated event to actor; it reports false when the actor
// was already at its limit (the event is still counted as refused, not added).
func (q *Quota) Add(actor string, now time.Time) bool { panic("unimplemented") }
