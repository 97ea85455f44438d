package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Windows is a prepared set of limits: the windows one key is decided
// against, validated once when it is made and carrying what every decision
// would otherwise recompute — each window's period in milliseconds and
// cost, the key suffix of each window (":<period_ms>") and the script
// arguments a Redis store sends. A caller builds one per configured limit
// list at start-up (or on reload) and passes the same value to every
// decision, so a decision neither validates nor formats anything.
//
// A nil *Windows holds no windows: a key decided against it passes free
// without a store call. A Windows is immutable and safe for concurrent use.
type Windows struct {
	limits []Limit
	win    []window
	args   []any
	text   string
	key    string // ":<period_ms>" of every window, in order (see KeySuffix)
}

// window is one limit in the form a decision reads it.
type window struct {
	rate, cost, periodMs float64
	period               uint64 // whole milliseconds: the key suffix and the memory store's slot
	suffix               string // ":" and period in ms
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
		args:   make([]any, 0, 1+3*len(limits)),
	}
	w.args = append(w.args, strconv.Itoa(len(limits)))
	parts := make([]string, len(limits))
	for i, l := range limits {
		p := uint64(l.Period / time.Millisecond)
		w.win[i] = window{
			rate:     l.Rate,
			cost:     l.cost(),
			periodMs: float64(p),
			period:   p,
			suffix:   ":" + strconv.FormatUint(p, 10),
		}
		// Plain decimals ('f'), never an exponent: Redis's Lua reads both,
		// but miniredis's Lua reads "1e+09" as nil, and the tests run on
		// both. Formatted here once, not by a client on every call.
		w.args = append(w.args,
			strconv.FormatFloat(l.Rate, 'f', -1, 64),
			strconv.FormatUint(p, 10),
			strconv.FormatFloat(l.cost(), 'f', -1, 64))
		parts[i] = l.String()
		w.key += w.win[i].suffix
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

// Limit returns window i's limit.
func (w *Windows) Limit(i int) Limit { return w.limits[i] }

// Suffix returns what a store appends to a key for window i:
// ":<period_ms>" (see Store).
func (w *Windows) Suffix(i int) string { return w.win[i].suffix }

// KeySuffix returns what a store that keeps every window of a key in one
// value appends to the key: each window's Suffix in order,
// ":<period_ms>:<period_ms>...", so that another list of periods (a
// window added, removed or reordered) names another value rather than
// misreading this one. For one window it is Suffix(0). "" for nil.
func (w *Windows) KeySuffix() string {
	if w == nil {
		return ""
	}
	return w.key
}

// ScriptArgs returns the windows as a Redis store's script reads them: the
// number of windows, then rate, period in milliseconds and cost of each, as
// decimal strings already boxed in interfaces, so that a call appends them
// without converting or allocating. The slice is shared: do not modify it.
func (w *Windows) ScriptArgs() []any {
	if w == nil {
		return nil
	}
	return w.args
}

// String renders the windows as in the config, "10/1s, 240/1m0s".
func (w *Windows) String() string {
	if w == nil {
		return ""
	}
	return w.text
}
