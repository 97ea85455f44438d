//go:build !race

// Left out of -race builds with the other end-to-end tests (see e2e_test.go).

package relay

import (
	"strings"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy/storage/vector"
	"github.com/sluice-relay/sluice/relay/policy"
)

// TestE2ESyncCapKhatru: the cap against a real khatru (negentropy on), in
// relay and proxy mode: two syncs answered by khatru's NEG-MSG, a third
// refused by the gate with NEG-ERR, and after a NEG-CLOSE a new one is
// khatru's again. A NEG-MSG for a sync the gate does not count open is
// answered by the gate's NEG-ERR and never reaches khatru: khatru handles a
// NEG-CLOSE sent right behind its NEG-OPEN first and then stores the sync,
// which NEG-MSGs forwarded would keep alive past the cap.
func TestE2ESyncCapKhatru(t *testing.T) {
	v := vector.New()
	v.Seal()
	start := negentropy.New(v, 1024*1024).Start()
	open := func(id string) string { return `["NEG-OPEN","` + id + `",{"kinds":[1]},"` + start + `"]` }
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			url := hostileTarget(t, mode, negKhatru(t), Options{Policy: policy.Config{Limits: generous()}, MaxSyncs: 2})
			c := dialRaw(t, url)
			if got := readText(t, c); !strings.HasPrefix(got, `["AUTH",`) {
				t.Fatalf("first frame %s, want khatru's challenge", got)
			}
			step := func(frame, wantPrefix string) {
				t.Helper()
				_ = c.WriteMessage(websocket.TextMessage, []byte(frame))
				if got := readText(t, c); !strings.HasPrefix(got, wantPrefix) {
					t.Fatalf("%.60s… answered %.120s, want %s…", frame, got, wantPrefix)
				}
			}
			step(open("a"), `["NEG-MSG","a",`)
			step(open("b"), `["NEG-MSG","b",`)
			step(open("c"), `["NEG-ERR","c","blocked: too many open syncs (at most 2)`)
			_ = c.WriteMessage(websocket.TextMessage, []byte(`["NEG-CLOSE","a"]`))
			step(open("c"), `["NEG-MSG","c",`)
			closed := `["NEG-ERR","d","closed: no sync open under this id`
			_ = c.WriteMessage(websocket.TextMessage, []byte(`["NEG-CLOSE","c"]`))
			_ = c.WriteMessage(websocket.TextMessage, []byte(open("d")))
			step(`["NEG-CLOSE","d"]`, `["NEG-MSG","d",`)
			step(`["NEG-MSG","d","`+start+`"]`, closed)
			step(`["NEG-MSG","zz","`+start+`"]`, strings.ReplaceAll(closed, `"d"`, `"zz"`))
		})
	}
}
