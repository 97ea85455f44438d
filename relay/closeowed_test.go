package relay

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/relay/policy"
)

// The CLOSE the gate owes the relay for a subscription closed for the
// client (here by the relay's own CLOSED) goes at once, not before the
// client's next frame: until the relay has it, it matches every event
// published against the subscription's listeners and writes each match
// out for the gate to drop. Sent while the client sends nothing — reading
// what it is sent, or reading nothing with a backlog behind it — in both
// modes; a REQ the client then sends under the same id reaches the relay
// after the CLOSE.
func TestGateClosesOwedAtOnce(t *testing.T) {
	for _, mode := range shapeModes {
		for _, behind := range []bool{false, true} {
			name := mode.name + "/reading"
			if behind {
				name = mode.name + "/behind"
			}
			t.Run(name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
					rec := newRecorder()
					rec.eose = true
					pn, url := mode.serve(t, g, rec)
					c := pn.dialWS(t, url)
					send := func(frame []byte) {
						if err := c.WriteMessage(websocket.TextMessage, frame); err != nil {
							t.Fatal(err)
						}
					}
					send([]byte(`["REQ","s",{}]`))
					if got := readText(t, c); got != `["EOSE","s"]` {
						t.Fatalf("REQ answered %s", got)
					}
					// The relay closes s; for a client behind, after a
					// NOTICE of 256 KiB that it does not read.
					cmd := "echo"
					if behind {
						cmd = "echo-behind"
					}
					send(recorderCmd(cmd, `["CLOSED","s","error: gone"]`))
					if !behind {
						for _, want := range []string{`["CLOSED","s","error: gone"]`, `["EOSE","echo"]`} {
							if got := readText(t, c); got != want {
								t.Fatalf("got %.80s, want %s", got, want)
							}
						}
					}
					synctest.Wait()
					got := rec.frames(3)
					if len(got) < 3 || got[2] != `["CLOSE","s"]` {
						t.Fatalf("with the client silent, the relay got %.200q; want the gate's CLOSE s third", got)
					}
					if behind {
						for _, want := range []string{`["NOTICE","xxx`, `["CLOSED","s","error: gone"]`, `["EOSE","echo-behind"]`} {
							if got := readText(t, c); !strings.HasPrefix(got, want) {
								t.Fatalf("got %.80s, want %s", got, want)
							}
						}
					}
					send([]byte(`["REQ","s",{}]`))
					if got := readText(t, c); got != `["EOSE","s"]` {
						t.Fatalf("REQ s again answered %s", got)
					}
					if got := rec.frames(4); len(got) != 4 || got[3] != `["REQ","s",{}]` {
						t.Fatalf("relay got %.200q; want REQ s after the CLOSE", got)
					}
				})
			})
		}
	}
}

// takeClosed hands out the ids marked closed and frees their places, but
// for keep (a REQ under that id is being decided: unmarked, its places
// kept) and skip (a REQ under that id is decided and not yet written
// behind Proxy: left marked, for its CLOSE to follow the REQ).
func TestSubTableTakeClosedKeepSkip(t *testing.T) {
	var s subTable
	marks := 0
	s.onMark = func() { marks++ }
	now := time.Now()
	for _, id := range []string{"a", "b", "c"} {
		if !s.open([]byte(id), 10, 0, now) {
			t.Fatalf("open %s", id)
		}
		s.answered([]byte(id))
		s.closedByRelay([]byte(id))
	}
	if s.marked.Load() != 3 || marks != 3 {
		t.Fatalf("%d marked, %d told, want 3 and 3", s.marked.Load(), marks)
	}
	if got := s.takeClosed(nil, []byte("a"), []byte("b")); len(got) != 1 || string(got[0]) != "c" {
		t.Fatalf("took %q, want c alone", got)
	}
	if s.marked.Load() != 1 || s.places != 2 {
		t.Fatalf("%d marked, %d places after the first take; want b marked, a's and b's places", s.marked.Load(), s.places)
	}
	if got := s.takeClosed(nil, nil, nil); len(got) != 1 || string(got[0]) != "b" {
		t.Fatalf("took %q, want b", got)
	}
	if s.marked.Load() != 0 || s.places != 1 {
		t.Fatalf("%d marked, %d places at the end; want a's place alone", s.marked.Load(), s.places)
	}
}

// A REQ the relay leaves unanswered past reqHold is given up and its
// client told CLOSED, unless the client closed it already: then there is
// nothing to tell (the relay still gets its CLOSE).
func TestSubTableExpireTellsOnlyOpen(t *testing.T) {
	var s subTable
	now := time.Now()
	for _, id := range []string{"open", "closed"} {
		if !s.open([]byte(id), 10, 0, now) {
			t.Fatalf("open %s", id)
		}
	}
	if !s.remove([]byte("closed")) {
		t.Fatal("the client's CLOSE of an unanswered REQ was not forwarded")
	}
	told, _ := s.expire(nil, now.Add(reqHold+time.Second))
	if len(told) != 1 || string(told[0]) != "open" {
		t.Fatalf("told the client CLOSED for %q, want open alone", told)
	}
	if s.marked.Load() != 2 || s.places != 0 {
		t.Fatalf("%d marked, %d places after the give-up; want both marked, none held", s.marked.Load(), s.places)
	}
}
