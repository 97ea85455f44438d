package relay

import (
	"bytes"
	"log/slog"
	"net/http"
	"os"
	"regexp"
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

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fail2banRegex reads the text-format failregex of docs/operations.md and
// makes it a Go regexp, <ADDR> standing for an address.
func fail2banRegex(t *testing.T) *regexp.Regexp {
	t.Helper()
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^failregex = (\^.*)$`).FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/operations.md has no text-format failregex")
	}
	return regexp.MustCompile(strings.Replace(string(m[1]), "<ADDR>", `(?P<addr>[0-9a-f.:]+)`, 1))
}

// TestPenaltyBanInProcess: without a shared store the penalty box is the
// process's own: a connection's invalid frames reaching the threshold ban
// its client, the connection is closed with the wait, one log line (the
// one docs/operations.md's fail2ban filter matches) says so, and every
// further upgrade is refused 429 with the ban's remaining time.
func TestPenaltyBanInProcess(t *testing.T) {
	var logs syncBuffer
	var banned []string
	var mu sync.Mutex
	obs := &policy.Observer{Ban: func(key string, _ time.Duration) {
		mu.Lock()
		banned = append(banned, key)
		mu.Unlock()
	}}
	g := newGate(t, Options{
		Policy:   policy.Config{Limits: &policy.Limits{}, Penalty: &ratelimit.Penalty{Threshold: 2, Ban: 90 * time.Second}},
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		Observer: obs,
	})
	url := serve(t, g.Wrap(newRecorder()))
	c := dialRaw(t, url)
	// Sixteen invalid frames make the two points of the threshold.
	for range 16 {
		if err := c.WriteMessage(websocket.TextMessage, []byte(`["EVENT",{}]`)); err != nil {
			break
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var err error
	for err == nil {
		_, _, err = c.ReadMessage()
	}
	if ce, ok := err.(*websocket.CloseError); !ok || ce.Code != websocket.ClosePolicyViolation || !strings.Contains(ce.Text, "retry in 90s") {
		t.Fatalf("the violating connection ended with %v, want 1008 telling the ban", err)
	}
	for range 5 {
		conn, code, ra := upgrade(t, url)
		if conn != nil || code != http.StatusTooManyRequests || (ra != "90" && ra != "89") {
			t.Fatalf("a banned client's upgrade: admitted %v, %d, Retry-After %q", conn != nil, code, ra)
		}
	}
	var lines []string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "msg=banned") {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d ban lines, want one:\n%s", len(lines), logs.String())
	}
	re := fail2banRegex(t)
	m := re.FindStringSubmatch(lines[0])
	if m == nil || m[re.SubexpIndex("addr")] != "127.0.0.1" {
		t.Fatalf("the fail2ban regex %q does not find the address in %q", re, lines[0])
	}
	mu.Lock()
	defer mu.Unlock()
	if len(banned) != 1 || banned[0] != "127.0.0.1" {
		t.Fatalf("Observer.Ban saw %v, want the one ban", banned)
	}
}

// TestPenaltyKnockingBans: a connection cut for knocking is a whole point:
// with a threshold of one, the cut bans the client, and its next upgrade is
// refused 429 with the ban's time rather than admitted and cut again.
func TestPenaltyKnockingBans(t *testing.T) {
	clk := nostrtest.NewClock()
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
	g := newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &l, Penalty: &ratelimit.Penalty{Threshold: 1, Ban: 10 * time.Minute}}})
	url := serve(t, g.Wrap(newRecorder()))
	event := []byte(`["EVENT",` + goNostrEvent + `]`)
	c := dialRaw(t, url)
	go func() {
		for range 10 * knockBurst {
			if c.WriteMessage(websocket.TextMessage, event) != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var err error
	for err == nil {
		_, _, err = c.ReadMessage()
	}
	if ce, ok := err.(*websocket.CloseError); !ok || ce.Code != websocket.ClosePolicyViolation {
		t.Fatalf("the knocking connection ended with %v, want 1008", err)
	}
	conn, code, ra := upgrade(t, url)
	if conn != nil || code != http.StatusTooManyRequests || ra != "600" {
		t.Fatalf("after the knocking cut: admitted %v, %d, Retry-After %q; want 429 and 600", conn != nil, code, ra)
	}
	clk.Advance(10 * time.Minute)
	if conn, code, _ := upgrade(t, url); conn == nil {
		t.Fatalf("after the ban: refused %d", code)
	}
}
