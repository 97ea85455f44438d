package main

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// DefaultOffenders is how many clients an Offenders view keeps, and
// DefaultOffendersHalfLife how fast their counts fade.
const (
	DefaultOffenders         = 64
	DefaultOffendersHalfLife = time.Minute
)

// Offenders is a fixed-memory view of the clients refused most over the
// last minutes, for an operator asking who is being limited: a
// Space-Saving sketch (Metwally et al.) of a fixed number of counters
// whose counts halve every half-life. A client refused often enough to
// matter is always in the view; a count may overstate a client's refusals
// by at most its Overestimate, the count of the client it displaced. A
// million distinct clients leave it the size it was made.
//
// Feed it from Observer.Frame and Observer.Connection (their refusals).
// It is safe for concurrent use.
type Offenders struct {
	mu       sync.Mutex
	k        int
	halfLife time.Duration
	clock    ratelimit.Clock
	entries  []offender
	index    map[string]int // client → position in entries; at most k keys
	decayed  time.Time      // when counts were last decayed
}

type offender struct {
	client      string
	count, over float64
}

// Offender is one client of an Offenders view.
type Offender struct {
	Client string `json:"client"`
	// Refusals is the client's refusals, each fading by half every
	// half-life; at most Overestimate more than the truth.
	Refusals     float64 `json:"refusals"`
	Overestimate float64 `json:"overestimate"`
}

// NewOffenders returns a view of the k clients refused most (k ≤ 0 means
// DefaultOffenders), whose counts halve every halfLife (≤ 0 means
// DefaultOffendersHalfLife), on clock (nil means the real one; pass the
// Limiter's, Limiter.Now).
func NewOffenders(k int, halfLife time.Duration, clock ratelimit.Clock) *Offenders {
	if k <= 0 {
		k = DefaultOffenders
	}
	if halfLife <= 0 {
		halfLife = DefaultOffendersHalfLife
	}
	return &Offenders{k: k, halfLife: halfLife, clock: clock, entries: make([]offender, 0, k), index: make(map[string]int, k)}
}

// Add counts one refusal of client.
func (o *Offenders) Add(client string) { o.addN(client, 1) }

// addN counts n of client (a weight: the readers' view counts MiB sent).
func (o *Offenders) addN(client string, n float64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.decay()
	if i, ok := o.index[client]; ok {
		o.entries[i].count += n
		return
	}
	if len(o.entries) < o.k {
		o.index[client] = len(o.entries)
		o.entries = append(o.entries, offender{client: client, count: n})
		return
	}
	// Full: the client takes the place of the one counted least, and
	// inherits its count, which it may not have earned.
	low := 0
	for i := range o.entries {
		if o.entries[i].count < o.entries[low].count {
			low = i
		}
	}
	e := &o.entries[low]
	delete(o.index, e.client)
	*e = offender{client: client, count: e.count + n, over: e.count}
	o.index[client] = low
}

// Top returns up to n clients, most refused first (n ≤ 0: all kept).
func (o *Offenders) Top(n int) []Offender {
	o.mu.Lock()
	o.decay()
	out := make([]Offender, len(o.entries))
	for i, e := range o.entries {
		out[i] = Offender{Client: e.client, Refusals: round3(e.count), Overestimate: round3(e.over)}
	}
	o.mu.Unlock()
	slices.SortFunc(out, func(a, b Offender) int {
		switch {
		case a.Refusals > b.Refusals:
			return -1
		case a.Refusals < b.Refusals:
			return 1
		}
		return 0
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// decay fades every count by the time since the last decay, at most once
// a second; entries that fade below a thousandth leave. o.mu is held.
func (o *Offenders) decay() {
	now := o.clock.Now()
	d := now.Sub(o.decayed)
	if o.decayed.IsZero() || d < 0 {
		o.decayed = now
		return
	}
	if d < time.Second {
		return
	}
	f := math.Exp2(-d.Seconds() / o.halfLife.Seconds())
	o.decayed = now
	kept := o.entries[:0]
	for _, e := range o.entries {
		e.count *= f
		e.over *= f
		if e.count < 1e-3 {
			delete(o.index, e.client)
			continue
		}
		o.index[e.client] = len(kept)
		kept = append(kept, e)
	}
	o.entries = kept
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }
