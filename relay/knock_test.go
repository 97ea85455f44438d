package relay

import (
	"context"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// knockSide is a clientSide without sockets: it counts the gate's replies
// and records how the connection was ended.
type knockSide struct {
	replies int
	ended   bool
	code    int
	text    string
}

func (s *knockSide) reply([]byte) bool   { s.replies++; return true }
func (s *knockSide) toRelay([]byte) bool { return true }
func (s *knockSide) shut(_, _ bool, code int, text string) {
	s.ended, s.code, s.text = true, code, text
}

// TestKnockCutBoundary: a client refused from the limiter's local table
// knockBurst times in a row is still served; the next local refusal cuts
// it (1008, with the wait). The refusal the store made first, which told
// the client its wait, is not a knock. decide is the one decision of both
// modes, so this holds behind Wrap and Proxy alike. In a synctest bubble
// the clock stands still, so no knock is repaid between frames.
func TestKnockCutBoundary(t *testing.T) {
	for _, typ := range []struct {
		name  string
		frame string
		lim   wire.Type
	}{
		// A type's own windows (admit), and a frame the gate answers
		// itself, charged to the catch-all (chargeAnswered).
		{"EVENT", `["EVENT",` + goNostrEvent + `]`, wire.TypeEVENT},
		{"unmatched CLOSE", `["CLOSE","nothing-open"]`, wire.TypeOther},
	} {
		t.Run(typ.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var l policy.Limits
				l.Message[typ.lim] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
				g := newGate(t, Options{Limiter: memLimiter(nostrtest.NewClock()), Policy: policy.Config{Limits: &l}})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				side := &knockSide{}
				c := &conn{g: g, side: side, ctx: ctx, cancel: cancel, closing: make(chan struct{}), who: "203.0.113.7", addr: netip.MustParseAddr("203.0.113.7")}
				frame := []byte(typ.frame)

				// One admitted, one refused by the store (its wait told).
				for i := range 2 {
					if _, ok := c.decide(frame); !ok {
						t.Fatalf("frame %d ended the connection", i+1)
					}
				}
				if side.replies != 1 {
					t.Fatalf("%d replies to the first two frames, want 1 (the store's refusal)", side.replies)
				}
				for i := 1; i <= knockBurst; i++ {
					if _, ok := c.decide(frame); !ok || side.ended {
						t.Fatalf("cut after %d local refusals, want %d allowed", i, knockBurst)
					}
				}
				if _, ok := c.decide(frame); ok || !side.ended {
					t.Fatalf("not cut after %d local refusals", knockBurst+1)
				}
				if side.code != closeSlowClient || side.text != "sluice: too many refused frames; retry in 3600s" {
					t.Errorf("cut with (%d, %q), want (%d, the wait)", side.code, side.text, closeSlowClient)
				}
				if side.replies != 1+knockBurst+1 {
					t.Errorf("%d replies, want one per refused frame (%d)", side.replies, 1+knockBurst+1)
				}
			})
		})
	}
}
