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

// TestE2EFramesKhatruReadsDifferently: khatru (go-nostr's default parser)
// reads the label as the text between a frame's first two quotes and
// parses binary frames as text, so a gate that charged [0,"EVENT",{…}] or
// a binary ["EVENT",{…}] to OTHER would let EVENTs past the EVENT limits
// and the actor quota; and with negentropy on, khatru panics (taking the
// whole process down) on [1,"X"] or [",",1]. The gate peeks binary frames
// like text, and answers frames that are not shaped as a Nostr message
// itself.
func TestE2EFramesKhatruReadsDifferently(t *testing.T) {
	kr := newKhatru(t)
	kr.Negentropy = true
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
	l.Message[wire.TypeOther] = []ratelimit.Limit{ratelimit.PerPeriod(1e6, time.Second)}
	g := newGate(t, Options{Policy: policy.Config{Limits: &l}})
	url := serve(t, g.Wrap(kr))
	c := dialRaw(t, url)

	// Frames that crashed khatru: answered by the gate, the relay lives.
	for _, crash := range []string{`[1,"X"]`, `[",",1]`} {
		_ = c.WriteMessage(websocket.TextMessage, []byte(crash))
		if got := readText(t, c); got != `["NOTICE","`+"invalid: not a Nostr message"+`"]` {
			t.Fatalf("%s answered %s", crash, got)
		}
	}

	sk := nostr.GeneratePrivateKey()
	e1, e2, e3 := nostrtest.Note(t, sk, "one"), nostrtest.Note(t, sk, "two"), nostrtest.Note(t, sk, "three")
	frame := func(e nostr.Event) []byte { b, _ := nostr.EventEnvelope{Event: e}.MarshalJSON(); return b }
	_ = c.WriteMessage(websocket.TextMessage, frame(e1))
	if got := readText(t, c); !strings.HasPrefix(got, `["OK","`+e1.ID+`",true`) {
		t.Fatalf("first EVENT answered %s", got)
	}
	// The EVENT budget (a burst of 1) is spent: neither spelling below may
	// get an event stored.
	disguised := append([]byte(`[0,"EVENT",`), frame(e2)[len(`["EVENT",`):]...)
	_ = c.WriteMessage(websocket.TextMessage, disguised)
	if got := readText(t, c); got != `["NOTICE","`+"invalid: not a Nostr message"+`"]` {
		t.Errorf("[0,\"EVENT\",{…}] answered %s", got)
	}
	_ = c.WriteMessage(websocket.BinaryMessage, frame(e3))
	if got := readText(t, c); !strings.HasPrefix(got, `["OK","`+e3.ID+`",false,"rate-limited: `) {
		t.Errorf("binary EVENT answered %s, want it charged as an EVENT and refused", got)
	}

	// The relay is alive and stored only the first event.
	r := connect(t, url)
	if got := query(t, r, nostr.Filter{Authors: []string{e1.PubKey}}); len(got) != 1 || got[0] != e1.ID {
		t.Errorf("relay holds %v, want only %s", got, e1.ID)
	}
}
