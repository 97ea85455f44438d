package relay

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// TestHintsDocExamples plays every nostr-exchange block of docs/hints.md
// against a gate in front of a relay that answers every REQ with EOSE and
// every EVENT with OK true, in a synctest bubble (so "wait 1s" and
// "# after 1s" are exact), and checks that each reply is the one the
// document shows, byte for byte.
func TestHintsDocExamples(t *testing.T) {
	blocks := exchangeBlocks(t, "../docs/hints.md")
	if len(blocks) < 6 {
		t.Fatalf("%d nostr-exchange blocks in docs/hints.md, want every example", len(blocks))
	}
	for i, b := range blocks {
		t.Run(strconv.Itoa(i+1), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { playExchange(t, b) })
		})
	}
}

// exchangeBlocks returns the lines of every ```nostr-exchange block of the
// file at path.
func exchangeBlocks(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks [][]string
	var cur []string
	in := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```nostr-exchange":
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			blocks = append(blocks, cur)
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// exchangeLimits reads a block's "# limits: REQ 2/1s; max_delay 0s" line.
func exchangeLimits(t *testing.T, line string) policy.Limits {
	t.Helper()
	spec, ok := strings.CutPrefix(line, "# limits:")
	if !ok {
		t.Fatalf("first line %q, want # limits: …", line)
	}
	var l policy.Limits
	for _, part := range strings.Split(spec, ";") {
		name, val, _ := strings.Cut(strings.TrimSpace(part), " ")
		if name == "max_delay" {
			d, err := time.ParseDuration(val)
			if err != nil {
				t.Fatal(err)
			}
			l.MaxDelay = d
			continue
		}
		rate, period, _ := strings.Cut(val, "/")
		r, err := strconv.ParseFloat(rate, 64)
		if err != nil {
			t.Fatalf("%q: %v", part, err)
		}
		p, err := time.ParseDuration(period)
		if err != nil {
			t.Fatalf("%q: %v", part, err)
		}
		w := []ratelimit.Limit{ratelimit.PerPeriod(r, p)}
		if name == "connection" {
			l.Connection = w
			continue
		}
		found := false
		for typ := range wire.Type(wire.NumTypes) {
			if typ.String() == name {
				l.Message[typ], found = w, true
			}
		}
		if !found {
			t.Fatalf("%q: no such message type", part)
		}
	}
	return l
}

// playExchange runs one block (see docs/hints.md, "Examples").
func playExchange(t *testing.T, lines []string) {
	l := exchangeLimits(t, lines[0])
	rec := newRecorder()
	rec.eose = true
	rec.answerOK = func(hex32) bool { return true }
	g := newGate(t, Options{Limiter: ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), time.Now), Policy: policy.Config{Limits: &l}})
	pn, url := servePipe(t, g.Wrap(rec))
	start := time.Now()
	var c *websocket.Conn
	dial := func() (*websocket.Conn, *http.Response, error) {
		d := websocket.Dialer{NetDialContext: pn.dial, HandshakeTimeout: 5 * time.Second}
		return d.Dial(url, nil)
	}
	var refused *http.Response // the last connect's refusal
	for n, line := range lines[1:] {
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case line == "connect":
			conn, resp, err := dial()
			refused = nil
			if err != nil {
				if resp == nil {
					t.Fatalf("line %d: %v", n+2, err)
				}
				refused = resp
				continue
			}
			t.Cleanup(func() { conn.Close() })
			c = conn
		case strings.HasPrefix(line, "wait "):
			d, err := time.ParseDuration(strings.TrimPrefix(line, "wait "))
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(d)
		case strings.HasPrefix(line, "> "):
			if c == nil {
				conn, _, err := dial()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { conn.Close() })
				c = conn
			}
			if err := c.WriteMessage(websocket.TextMessage, []byte(strings.TrimPrefix(line, "> "))); err != nil {
				t.Fatalf("line %d: %v", n+2, err)
			}
		case strings.HasPrefix(line, "< HTTP "):
			// < HTTP 429 Retry-After: 1 <body>
			f := strings.SplitN(strings.TrimPrefix(line, "< HTTP "), " ", 4)
			if refused == nil {
				t.Fatalf("line %d: the upgrade was accepted, want %q", n+2, line)
			}
			body, _ := io.ReadAll(refused.Body)
			if strconv.Itoa(refused.StatusCode) != f[0] || f[1] != "Retry-After:" || refused.Header.Get("Retry-After") != f[2] || strings.TrimSpace(string(body)) != f[3] {
				t.Errorf("line %d: got HTTP %d Retry-After: %q %q, want %q", n+2, refused.StatusCode, refused.Header.Get("Retry-After"), body, line)
			}
			refused = nil
		case strings.HasPrefix(line, "< "):
			want, after, timed := strings.Cut(strings.TrimPrefix(line, "< "), "# after ")
			want = strings.TrimSpace(want)
			_, got, err := c.ReadMessage()
			if err != nil {
				t.Fatalf("line %d: %v, want %s", n+2, err, want)
			}
			if string(got) != want {
				t.Errorf("line %d: got %s, want %s", n+2, got, want)
			}
			if timed {
				d, err := time.ParseDuration(strings.TrimSpace(after))
				if err != nil {
					t.Fatal(err)
				}
				if el := time.Since(start); el < d-time.Millisecond || el > d+time.Millisecond {
					t.Errorf("line %d: answered after %v, want %v", n+2, el, d)
				}
			}
		default:
			t.Fatalf("line %d: %q is not an exchange line", n+2, line)
		}
		if refused != nil && !strings.HasPrefix(strings.TrimSpace(lines[min(n+2, len(lines)-1)]), "< HTTP") {
			t.Fatalf("line %d: upgrade refused (%d), want it accepted", n+2, refused.StatusCode)
		}
	}
}
