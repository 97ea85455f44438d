package relay

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/relay/policy"
)

// eoseRelay is an upstream that records the frames it receives and
// answers a NEG-OPEN whose id is "eose-<id>" with ["EOSE","<id>"]: the
// test says when the relay has answered a REQ. (A NEG-OPEN, because it
// takes no place among the subscriptions the test fills.)
type eoseRelay struct {
	mu   sync.Mutex
	cond *sync.Cond
	got  []string
}

func newEOSERelay() *eoseRelay {
	r := &eoseRelay{}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (r *eoseRelay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	c, err := (&websocket.Upgrader{}).Upgrade(w, req, nil)
	if err != nil {
		return
	}
	defer c.Close()
	for {
		_, data, err := c.ReadMessage()
		if err != nil {
			return
		}
		r.mu.Lock()
		r.got = append(r.got, string(data))
		r.cond.Broadcast()
		r.mu.Unlock()
		const ask = `["NEG-OPEN","eose-`
		if s := string(data); strings.HasPrefix(s, ask) {
			id := s[len(ask) : strings.IndexByte(s[len(ask):], '"')+len(ask)]
			_ = c.WriteMessage(websocket.TextMessage, []byte(`["EOSE","`+id+`"]`))
		}
	}
}

// frames waits until the relay has received n frames, for at most 5s,
// and returns what it has.
func (r *eoseRelay) frames(n int) []string {
	timeout := time.AfterFunc(5*time.Second, func() {
		r.mu.Lock()
		r.got = append(r.got, "(timed out)")
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer timeout.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.got) < n {
		r.cond.Wait()
	}
	return append([]string(nil), r.got...)
}

// khatru adds a REQ's listeners only once their stored events are sent,
// so a CLOSE it handles before then removes nothing and the listeners
// stay. A CLOSE that comes before the relay's EOSE must therefore not free
// the subscription's place: it stays taken until the relay has answered,
// and the gate then sends the relay another CLOSE, which frees it. (The
// place was freed at once: REQ then CLOSE, repeated, held any number of
// listeners at khatru past max_subscriptions.)
func TestGateCloseBeforeEOSEKeepsPlace(t *testing.T) {
	rel := newEOSERelay()
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxSubscriptions: 2})
	c := dialRaw(t, serve(t, g.Wrap(rel)))
	write := func(f string) {
		t.Helper()
		if err := c.WriteMessage(websocket.TextMessage, []byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	write(`["REQ","a",{}]`)
	write(`["CLOSE","a"]`) // before the relay's EOSE
	write(`["REQ","b",{}]`)
	write(`["REQ","c",{}]`)                // a's place is still taken: refused
	write(`["NEG-OPEN","eose-a",{},"61"]`) // the relay answers a now
	write(`["NEG-OPEN","eose-z",{},"61"]`) // and then z, which was never opened
	if got := readText(t, c); !strings.HasPrefix(got, `["CLOSED","c","blocked: too many open subscriptions`) {
		t.Fatalf("REQ c past the cap, a closed before its EOSE: got %s first, want CLOSED c blocked", got)
	}
	// The client closed a: the relay's EOSE for it does not reach it.
	if got := readText(t, c); got != `["EOSE","z"]` {
		t.Fatalf("got %s, want the relay's EOSE for z (and none for a, closed)", got)
	}
	// The relay has answered a: the gate closes it there again before
	// the client's next frame, and that frees its place.
	write(`["REQ","c",{}]`)
	got := rel.frames(7)
	// The second CLOSE a goes before the client's next frame once the
	// gate has read the EOSE: before NEG-OPEN eose-z or after it.
	want := []string{`["REQ","a",{}]`, `["CLOSE","a"]`, `["REQ","b",{}]`, `["NEG-OPEN","eose-a",{},"61"]`, `["NEG-OPEN","eose-z",{},"61"]`, `["CLOSE","a"]`, `["REQ","c",{}]`}
	early := []string{`["REQ","a",{}]`, `["CLOSE","a"]`, `["REQ","b",{}]`, `["NEG-OPEN","eose-a",{},"61"]`, `["CLOSE","a"]`, `["NEG-OPEN","eose-z",{},"61"]`, `["REQ","c",{}]`}
	if g := strings.Join(got, " "); g != strings.Join(want, " ") && g != strings.Join(early, " ") {
		t.Fatalf("relay got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// CLOSE and NEG-CLOSE are free. One that names no subscription or sync
// open at the relay has nothing to close there and is not forwarded: each
// costs khatru a goroutine (and a CLOSE the lock every REQ and connection
// takes), and a client could send them without end. A CLOSE of an open
// subscription goes once; the same CLOSE again does not.
func TestGateCloseOfNothingNotForwarded(t *testing.T) {
	rec := newRecorder()
	rec.eose = true
	c := dialRaw(t, serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}).Wrap(rec)))
	write := func(f string) {
		t.Helper()
		if err := c.WriteMessage(websocket.TextMessage, []byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	for range 1000 {
		write(`["CLOSE","nothing"]`)
		write(`["NEG-CLOSE","nothing"]`)
	}
	write(`["REQ","a",{}]`)
	if got := readText(t, c); got != `["EOSE","a"]` {
		t.Fatalf("REQ a answered %s", got)
	}
	write(`["CLOSE","a"]`)
	write(`["CLOSE","a"]`)
	write(`["REQ","b",{}]`)
	if got := readText(t, c); got != `["EOSE","b"]` {
		t.Fatalf("REQ b answered %s", got)
	}
	want := []string{`["REQ","a",{}]`, `["CLOSE","a"]`, `["REQ","b",{}]`}
	if got := rec.frames(len(want)); strings.Join(got, " ") != strings.Join(want, " ") {
		if len(got) > 5 {
			got = append(got[:5], fmt.Sprintf("… (%d frames)", len(got)))
		}
		t.Fatalf("relay got %q, want %q", got, want)
	}
}

// A connection remembers the last maxGone ids closed for its client, and
// no more: the oldest is forgotten first, a REQ under an id forgets it, and
// an id the gate never opened is not remembered.
func TestSubTableGoneBounded(t *testing.T) {
	var s subTable
	id := func(i int) []byte { return []byte(fmt.Sprint("sub-", i)) }
	for i := range maxGone + 1 {
		if !s.open(id(i), 100, 0, time.Time{}) {
			t.Fatalf("open %d refused", i)
		}
		s.answered(id(i))
	}
	if s.remove([]byte("never")) || s.isGone([]byte("never")) {
		t.Fatal("an id never opened was removed or remembered")
	}
	for i := range maxGone + 1 {
		if !s.remove(id(i)) {
			t.Fatalf("remove %d: not open", i)
		}
	}
	if s.isGone(id(0)) {
		t.Errorf("the oldest of %d closed ids is still remembered", maxGone+1)
	}
	for i := 1; i <= maxGone; i++ {
		if !s.isGone(id(i)) {
			t.Errorf("closed id %d forgotten", i)
		}
	}
	if n := s.nGone.Load(); n != maxGone {
		t.Errorf("%d ids remembered, want %d", n, maxGone)
	}
	// Closed again and again, an id takes one place among them.
	s.open(id(5), 100, 0, time.Time{})
	if s.isGone(id(5)) {
		t.Error("an id opened again is still remembered as closed")
	}
	s.remove(id(5))
	s.open(id(5), 100, 0, time.Time{})
	s.remove(id(5))
	if n := s.nGone.Load(); n != maxGone || !s.isGone(id(5)) || !s.isGone(id(1)) {
		t.Errorf("after closing one id twice: %d remembered, 5 %v, 1 %v", n, s.isGone(id(5)), s.isGone(id(1)))
	}
}
