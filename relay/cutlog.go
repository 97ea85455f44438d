package relay

import (
	"log/slog"
	"sync"
	"time"
)

// Cut connections are logged at info, one line each, but bounded per gate:
// a client can have itself cut as fast as its connection budget lets it
// reconnect (about 8 a second from one address by default), and one after
// another from a rotating set of addresses, so one line per cut would let
// a client write the operator's log at its own pace. Past cutLogBurst lines,
// repaid at cutLogRate a second, a cut is counted instead (the
// sluice_disconnects_total metric counts every one), and the next line
// logged says how many were left out before it.
const (
	cutLogBurst = 20
	cutLogRate  = 1.0
)

// cutLog is the bound, shared by every connection of a gate.
type cutLog struct {
	mu         sync.Mutex
	spent      float64
	last       time.Time // monotonic
	suppressed int
}

// info logs msg with args as a cut of a connection, unless the bound is
// spent.
func (l *cutLog) info(log *slog.Logger, msg string, args ...any) {
	if n, ok := l.allow(time.Now()); ok {
		if n > 0 {
			args = append(args, "cuts_not_logged_before", n)
		}
		log.Info(msg, args...)
	}
}

// allow takes one line at now: false when the bound is spent (the line is
// counted as left out); true with the number left out since the last line.
func (l *cutLog) allow(now time.Time) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() {
		l.spent = max(0, l.spent-now.Sub(l.last).Seconds()*cutLogRate)
	}
	l.last = now
	if l.spent+1 > cutLogBurst {
		l.suppressed++
		return 0, false
	}
	l.spent++
	n := l.suppressed
	l.suppressed = 0
	return n, true
}
