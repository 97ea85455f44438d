package relay

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestCutLogBounded: the lines for cut connections are bounded per gate —
// cutLogBurst at once, then cutLogRate a second — and the first line after
// a gap says how many cuts went unlogged.
func TestCutLogBounded(t *testing.T) {
	var l cutLog
	t0 := time.Now()
	logged := 0
	for range cutLogBurst + 10 {
		if _, ok := l.allow(t0); ok {
			logged++
		}
	}
	if logged != cutLogBurst {
		t.Fatalf("%d lines of %d cuts at once, want %d", logged, cutLogBurst+10, cutLogBurst)
	}
	if _, ok := l.allow(t0.Add(500 * time.Millisecond)); ok {
		t.Fatal("a line half a repayment later")
	}
	n, ok := l.allow(t0.Add(1100 * time.Millisecond))
	if !ok || n != 11 {
		t.Fatalf("a second later: %v, %d left out; want a line and 11", ok, n)
	}
	if n, ok := l.allow(t0.Add(time.Hour)); !ok || n != 0 {
		t.Fatalf("an hour later: %v, %d", ok, n)
	}
}

// TestCutLogLine: the line names what the caller gave and, after cuts
// that went unlogged, how many.
func TestCutLogLine(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var l cutLog
	for range cutLogBurst + 3 {
		l.info(log, "closing client", "client", "192.0.2.1", "reason", "too many refused frames")
	}
	if got := strings.Count(buf.String(), "closing client"); got != cutLogBurst {
		t.Fatalf("%d lines, want %d", got, cutLogBurst)
	}
	l.mu.Lock()
	l.last = l.last.Add(-time.Hour) // as if an hour had passed
	l.mu.Unlock()
	buf.Reset()
	l.info(log, "closing slow client", "client", "192.0.2.2")
	if s := buf.String(); !strings.Contains(s, "client=192.0.2.2") || !strings.Contains(s, "cuts_not_logged_before=3") {
		t.Fatalf("line after the gap: %q", s)
	}
}
