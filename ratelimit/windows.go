package ratelimit

import (
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

// NewWindows validates limits and prepares them: every limit valid
// (Limit.Validate), at most MaxWindows of them, and no two with the same
// period (they would share one store key). The
// limits are copied: changing the slice afterwards changes nothing. No
// limits gives an empty, non-nil Windows that passes free, like nil.
func NewWindows(limits ...Limit) (*Windows, error) {
	if err := validateLimits(limits); err != nil {
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

// Len returns the number of windows; 0 for nil.
func (w *Windows) Len() int {
	if w == nil {
		return 0
	}
	return len(w.win)
}

// Limit returns window i's limit, in the order w was made from: a store
// that encodes the windows for its backend reads them one by one.
func (w *Windows) Limit(i int) Limit { return w.limits[i] }

// String renders the windows as in the config, "10/1s, 240/1m0s".
func (w *Windows) String() string {
	if w == nil {
		return ""
	}
	return w.text
}
