package ratelimit

import (
	"fmt"
	"strings"
	"time"
)

// Windows is a prepared set of limits: the windows one key is decided
// against, validated once when it is made, with what every decision would
// otherwise recompute (each window's period in milliseconds and cost). A
// caller builds one per configured limit list at start-up (or on reload)
// and passes the same value to every decision, so a decision neither
// validates nor formats anything.
//
// A nil *Windows holds no windows: a key decided against it passes free
// without a store call. A Windows is immutable and safe for concurrent use.
type Windows struct {
	limits []Limit
	win    []window
	text   string
}

// window is one limit in the form a decision reads it.
type window struct {
	rate, cost, periodMs float64
	period               uint64 // whole milliseconds: the memory store's slot
}

// NewWindows validates limits with ValidateLimits and prepares them. The
// limits are copied: changing the slice afterwards changes nothing. No
// limits gives an empty, non-nil Windows that passes free, like nil.
func NewWindows(limits ...Limit) (*Windows, error) {
	if err := ValidateLimits(limits); err != nil {
		return nil, err
	}
	w := &Windows{
		limits: append([]Limit(nil), limits...),
		win:    make([]window, len(limits)),
	}
	parts := make([]string, len(limits))
	for i, l := range limits {
		p := uint64(l.Period / time.Millisecond)
		w.win[i] = window{rate: l.Rate, cost: l.cost(), periodMs: float64(p), period: p}
		parts[i] = l.String()
	}
	w.text = strings.Join(parts, ", ")
	return w, nil
}

// MustWindows is NewWindows for limits known to be valid, such as
// literals in a program or a test; it panics on an invalid list.
func MustWindows(limits ...Limit) *Windows {
	w, err := NewWindows(limits...)
	if err != nil {
		panic(fmt.Sprintf("ratelimit: MustWindows: %v", err))
	}
	return w
}

// Len returns the number of windows; 0 for nil.
func (w *Windows) Len() int {
	if w == nil {
		return 0
	}
	return len(w.win)
}

// Limits returns a copy of the limits w was made from, in order.
func (w *Windows) Limits() []Limit {
	if w == nil {
		return nil
	}
	return append([]Limit(nil), w.limits...)
}

// Limit returns window i's limit, without the copy Limits makes: a store
// that encodes the windows for its backend reads them one by one.
func (w *Windows) Limit(i int) Limit { return w.limits[i] }

// String renders the windows as in the config, "10/1s, 240/1m0s".
func (w *Windows) String() string {
	if w == nil {
		return ""
	}
	return w.text
}
