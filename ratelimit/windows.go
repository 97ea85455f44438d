package ratelimit

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Windows is a prepared set of limits: the windows one key is decided
// against, validated once when it is made and carrying what every decision
// would otherwise recompute — each window's period in milliseconds and
// cost, the key suffix of each window (":<period_ms>") and the packed
// limits a Redis store's script reads. A caller builds one per configured limit
// list at start-up (or on reload) and passes the same value to every
// decision, so a decision neither validates nor formats anything.
//
// A nil *Windows holds no windows: a key decided against it passes free
// without a store call. A Windows is immutable and safe for concurrent use.
type Windows struct {
	limits []Limit
	win    []window
	packed string // n, then rate, period_ms and cost of each window (see ScriptLimits)
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
	}
	packed := make([]byte, 0, 8*(1+3*len(limits)))
	packed = appendFloat(packed, float64(len(limits)))
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
		packed = appendFloat(packed, l.Rate)
		packed = appendFloat(packed, float64(p))
		packed = appendFloat(packed, l.cost())
		parts[i] = l.String()
		w.key += w.win[i].suffix
	}
	w.text = strings.Join(parts, ", ")
	w.packed = string(packed)
	return w, nil
}

func appendFloat(b []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
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

// ScriptLimits returns the windows as a Redis store's script reads them:
// the number of windows, then rate, period in milliseconds and cost of
// each, packed as little-endian IEEE doubles (8 bytes each, Lua's struct
// "<d"; see scripts/ewma.lua), made once here rather than by a client on
// every call. "" for nil.
func (w *Windows) ScriptLimits() string {
	if w == nil {
		return ""
	}
	return w.packed
}

// String renders the windows as in the config, "10/1s, 240/1m0s".
func (w *Windows) String() string {
	if w == nil {
		return ""
	}
	return w.text
}
