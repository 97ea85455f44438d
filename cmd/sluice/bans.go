package main

import (
	"slices"
	"sync"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// maxBans is how many bans a banList shows: the ones ending last.
const maxBans = 64

// banList is the penalty box's bans this process knows of (started here,
// or learnt from the shared store at an upgrade; fed by Observer.Ban), for
// /top and the status page. Fixed-size: past maxBans the ban ending first
// makes room. Safe for concurrent use.
type banList struct {
	mu    sync.Mutex
	clock ratelimit.Clock
	bans  map[string]time.Time // key → end, on clock
}

// Ban is one ban of a banList.
type Ban struct {
	Key string `json:"key"`
	// RetryAfter is the ban's remaining time in whole seconds, rounded
	// up: the Retry-After a banned upgrade is told.
	RetryAfter int64     `json:"retry_after_seconds"`
	Until      time.Time `json:"until"`
}

func newBanList(clock ratelimit.Clock) *banList {
	return &banList{clock: clock, bans: make(map[string]time.Time)}
}

// add records that key is banned for wait from now.
func (b *banList) add(key string, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	b.prune(now)
	if _, ok := b.bans[key]; !ok && len(b.bans) >= maxBans {
		first := ""
		for k, t := range b.bans {
			if first == "" || t.Before(b.bans[first]) {
				first = k
			}
		}
		delete(b.bans, first)
	}
	b.bans[key] = now.Add(wait)
}

// prune drops the bans that have ended. b.mu is held.
func (b *banList) prune(now time.Time) {
	for k, t := range b.bans {
		if !now.Before(t) {
			delete(b.bans, k)
		}
	}
}

// active returns the bans that last, ending last first. Until is on the
// wall clock.
func (b *banList) active() []Ban {
	b.mu.Lock()
	now := b.clock.Now()
	b.prune(now)
	wall := time.Now()
	out := make([]Ban, 0, len(b.bans))
	for k, t := range b.bans {
		left := t.Sub(now)
		out = append(out, Ban{Key: k, RetryAfter: int64((left + time.Second - 1) / time.Second), Until: wall.Add(left).UTC().Truncate(time.Second)})
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(x, y Ban) int { return y.Until.Compare(x.Until) })
	return out
}
