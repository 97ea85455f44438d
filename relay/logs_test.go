package relay

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// logBuffer is a text log that tests count lines in.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many lines have the message msg.
func (b *logBuffer) count(msg string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), `"msg":"`+msg+`"`)
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(b, nil)) }

// A client refused by a budget charged after its type's windows (a kind
// class, an aggregate) is answered from the limiter's local table inside
// the charge, which the type's Refused does not see: such a refusal must
// not write a log line per frame. One per client, budget and wait, as for
// a type's own windows; else one client's flood is the log's.
func TestGateLogsLaterBudgetRefusalOncePerWait(t *testing.T) {
	generous := []ratelimit.Limit{ratelimit.PerPeriod(1000, time.Second)}
	once := []ratelimit.Limit{ratelimit.PerPeriod(1.6, time.Hour)} // a burst of 1
	reaction := withID(`["EVENT",` + strings.Replace(goNostrEvent, `"kind":1`, `"kind":7`, 1) + `]`)
	for _, tc := range []struct {
		name  string
		cfg   policy.Config
		frame func(i int) string
	}{
		{"kind class", policy.Config{
			Limits: func() (l *policy.Limits) { l = new(policy.Limits); l.Message[wire.TypeEVENT] = generous; return }(),
			Kinds:  []policy.Class{{Name: "reactions", Kinds: [][2]int{{7, 7}}, Limits: once}},
		}, func(int) string { return reaction }},
		{"aggregate", policy.Config{
			Limits:     func() (l *policy.Limits) { l = new(policy.Limits); l.Message[wire.TypeREQ] = generous; return }(),
			Aggregates: []policy.Aggregate{{Bits: 8, V4: true, Limits: once}},
		}, func(i int) string { return `["REQ","s` + string(rune('a'+i)) + `",{}]` }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuffer
			clk := nostrtest.NewClock()
			g := newGate(t, Options{Limiter: memLimiter(clk), Policy: tc.cfg, Logger: logs.logger()})
			rec := newRecorder()
			c := dialRaw(t, serve(t, g.Wrap(rec)))
			const refused = 20
			for i := range 1 + refused {
				if err := c.WriteMessage(websocket.TextMessage, []byte(tc.frame(i))); err != nil {
					t.Fatal(err)
				}
			}
			for range refused {
				if got := readText(t, c); !strings.Contains(got, "rate-limited:") {
					t.Fatalf("reply %s, want a rate-limited refusal", got)
				}
			}
			if got := rec.frames(1); len(got) != 1 {
				t.Errorf("relay got %d frames, want the first only", len(got))
			}
			if n := logs.count("rate-limited"); n != 1 {
				t.Errorf("%d refusals wrote %d rate-limited log lines, want 1 (one per client and wait)", refused, n)
			}
		})
	}
}

// In shadow mode an upgrade past the connection limit is admitted and
// logged as "would be rate-limited": once per client and wait, not once
// per upgrade, or a client that reconnects in a loop floods the log.
func TestGateLogsShadowUpgradeOncePerWait(t *testing.T) {
	var logs logBuffer
	clk := nostrtest.NewClock()
	cfg := policy.Config{Shadow: true, Limits: &policy.Limits{Connection: []ratelimit.Limit{ratelimit.PerPeriod(1.6, time.Hour)}}}
	g := newGate(t, Options{Limiter: memLimiter(clk), Policy: cfg, Logger: logs.logger()})
	url := serve(t, g.Wrap(newRecorder()))
	const upgrades = 10
	for range upgrades {
		dialRaw(t, url).Close()
	}
	if n := logs.count("upgrade would be rate-limited (shadow)"); n != 1 {
		t.Errorf("%d upgrades past the shadow limit wrote %d log lines, want 1", upgrades-1, n)
	}
	// Past the wait the store decides again, and says so once more.
	clk.Advance(2 * time.Hour)
	for range 3 {
		dialRaw(t, url).Close()
	}
	if n := logs.count("upgrade would be rate-limited (shadow)"); n != 2 {
		t.Errorf("after the wait: %d log lines, want 2", n)
	}
}
