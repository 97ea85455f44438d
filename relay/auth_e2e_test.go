//go:build !race

package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// authConn dials url and returns the connection and the challenge khatru
// sent on it.
func authConn(t *testing.T, url string) (*websocket.Conn, string) {
	t.Helper()
	c := dialRaw(t, url)
	var env nostr.AuthEnvelope
	if err := env.FromJSON(readText(t, c)); err != nil || env.Challenge == nil {
		t.Fatalf("no challenge: %v", err)
	}
	return c, *env.Challenge
}

// send writes frame and returns the one answer.
func send(t *testing.T, c *websocket.Conn, frame []byte) string {
	t.Helper()
	if err := c.WriteMessage(websocket.TextMessage, frame); err != nil {
		t.Fatal(err)
	}
	return readText(t, c)
}

// NIP-42 is verified by the gate, never inferred from an OK: the spoof
// that bound any pubkey (an AUTH khatru cannot parse, carrying the id of an
// ordinary event then sent twice, so that khatru's OK true for that id
// looked like the AUTH's) binds nothing, and neither does a signed AUTH
// with a wrong challenge, relay, time, id or signature. A correct one,
// accepted by khatru, makes the allow-listed pubkey exempt. In relay mode
// and proxy mode.
func TestE2EAuthVerified(t *testing.T) {
	victimSK, victim := newKey(t)
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(3.5, time.Minute)}
	l.Message[wire.TypeAUTH] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Second)}
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			clk := nostrtest.NewClock()
			clk.Set(time.Now()) // khatru checks created_at against its own clock
			opts := Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &l, Identity: policy.Identity{AllowPubkeys: []string{victim}}}}
			url := hostileTarget(t, mode, negKhatru(t), opts)

			// The spoof.
			c, _ := authConn(t, url)
			attackerSK, _ := newKey(t)
			e := nostrtest.Note(t, attackerSK, "ordinary")
			spoof := `["AUTH",{"id":"` + e.ID + `","pubkey":"` + victim + `","kind":22242}]`
			if got := send(t, c, []byte(spoof)); !strings.HasPrefix(got, `["OK","`+e.ID+`",false,"invalid: `) {
				t.Fatalf("spoofed AUTH answered %s", got)
			}
			for range 2 {
				if got := send(t, c, eventFrameOf(t, e)); !strings.HasPrefix(got, `["OK","`+e.ID+`",true`) {
					t.Fatalf("ordinary event answered %s", got)
				}
			}
			admitted := 0
			for i := range 50 {
				ev := nostrtest.Note(t, attackerSK, "flood "+string(rune('a'+i%26))+string(rune('a'+i/26)))
				if strings.HasPrefix(send(t, c, eventFrameOf(t, ev)), `["OK","`+ev.ID+`",true`) {
					admitted++
				}
			}
			if admitted != 1 { // 3 in the burst, 2 spent on the re-sent event
				t.Errorf("after the spoof %d of 50 EVENTs passed a 3/60s limit, want 1", admitted)
			}

			// Signed AUTHs that are wrong in one way each.
			c2, ch := authConn(t, url)
			now := clk.Now()
			wrong := map[string]func() []byte{
				"challenge": func() []byte { f, _ := signedAuth(t, victimSK, ch+"x", url, now); return []byte(f) },
				"relay":     func() []byte { f, _ := signedAuth(t, victimSK, ch, "ws://elsewhere.example", now); return []byte(f) },
				"time":      func() []byte { f, _ := signedAuth(t, victimSK, ch, url, now.Add(-11*time.Minute)); return []byte(f) },
				"id": func() []byte {
					f, _ := signedAuth(t, victimSK, ch, url, now)
					return []byte(strings.Replace(f, `"content":""`, `"content":"x"`, 1))
				},
				"sig": func() []byte {
					f, _ := signedAuth(t, victimSK, ch, url, now)
					i := strings.Index(f, `"sig":"`) + 7
					// Its first byte changed (one signature in 256 begins
					// with 00: writing 00 over it left it valid).
					b := "00"
					if f[i:i+2] == b {
						b = "ff"
					}
					return []byte(f[:i] + b + f[i+2:])
				},
			}
			for what, frame := range wrong {
				if got := send(t, c2, frame()); !strings.Contains(got, `,false,"invalid: AUTH`) && !strings.Contains(got, `,false,"invalid: event id does not match its content"`) {
					t.Errorf("AUTH with a wrong %s answered %s", what, got)
				}
			}
			// Still bound to nothing: the EVENT budget (spent) applies.
			ev := nostrtest.Note(t, victimSK, "not yet")
			if got := send(t, c2, eventFrameOf(t, ev)); !strings.Contains(got, "rate-limited:") {
				t.Fatalf("EVENT before a valid AUTH answered %s", got)
			}

			// The real thing.
			f, id := signedAuth(t, victimSK, ch, url, now)
			if got := send(t, c2, []byte(f)); strings.TrimSpace(got) != okFor(id, true, "") {
				t.Fatalf("valid AUTH answered %s", got)
			}
			for i := range 20 {
				ev := nostrtest.Note(t, victimSK, "member "+string(rune('a'+i)))
				if got := send(t, c2, eventFrameOf(t, ev)); !strings.HasPrefix(got, `["OK","`+ev.ID+`",true`) {
					t.Fatalf("allow-listed, authenticated EVENT %d answered %s", i, got)
				}
			}
		})
	}
}
