package relay

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// negOpen is a canonical NEG-OPEN for id (an empty set's first message).
func negOpen(id string) string { return `["NEG-OPEN","` + id + `",{},"6100000200"]` }

// TestGateSyncCap: the NIP-77 syncs one client holds open at the relay
// are capped across its connections. A NEG-OPEN reusing an open id
// replaces that sync and takes no place; a NEG-CLOSE, the relay's NEG-ERR
// (or go-nostr's NEG-ERROR, which khatru sends) and a closed connection
// free places; a NEG-OPEN past the cap is answered NEG-ERR and never
// reaches the relay.
func TestGateSyncCap(t *testing.T) {
	rec := newRecorder()
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxSyncs: 2}).Wrap(rec))
	c1, c2 := dialRaw(t, url), dialRaw(t, url)
	// forwarded reports whether c's frame reached the relay: a frame the
	// gate refuses is answered at once; one it forwards is not, and the
	// echo behind it comes back first.
	pings := 0
	forwarded := func(c *websocket.Conn, frame string) bool {
		t.Helper()
		_ = c.WriteMessage(websocket.TextMessage, []byte(frame))
		pings++
		ping := `["EOSE","ping` + strings.Repeat("!", pings) + `"]`
		_ = c.WriteMessage(websocket.TextMessage, recorderCmd("echo", ping))
		_ = c.WriteMessage(websocket.TextMessage, []byte(`["CLOSE","echo"]`))
		got := readText(t, c)
		if got == ping {
			return true
		}
		if want := `["NEG-ERR",` + frame[len(`["NEG-OPEN",`):strings.Index(frame, ",{")] + `,"blocked: too many open syncs (at most 2); send NEG-CLOSE for one first"]`; got != want {
			t.Fatalf("%s answered %s, want %s", frame, got, want)
		}
		if next := readText(t, c); next != ping {
			t.Fatalf("after the refusal: %s", next)
		}
		return false
	}
	steps := []struct {
		c    *websocket.Conn
		name string
		do   func() bool
		want bool
	}{
		{c1, "a", func() bool { return forwarded(c1, negOpen("a")) }, true},
		{c1, "a again (replaces a)", func() bool { return forwarded(c1, negOpen("a")) }, true},
		{c2, "b on the second connection", func() bool { return forwarded(c2, negOpen("b")) }, true},
		{c2, "c past the cap", func() bool { return forwarded(c2, negOpen("c")) }, false},
		{c1, "NEG-CLOSE a", func() bool { return forwarded(c1, `["NEG-CLOSE","a"]`) }, true},
		{c2, "c in a's place", func() bool { return forwarded(c2, negOpen("c")) }, true},
		{c1, "d past the cap", func() bool { return forwarded(c1, negOpen("d")) }, false},
	}
	for _, st := range steps {
		if got := st.do(); got != st.want {
			t.Fatalf("%s: forwarded %v, want %v", st.name, got, st.want)
		}
	}
	// The relay ends b (as khatru labels it) and c.
	for _, end := range []string{`["NEG-ERROR","b","closed"]`, `["NEG-ERR","c","blocked: no"]`} {
		_ = c2.WriteMessage(websocket.TextMessage, recorderCmd("echo", end))
		if got := readText(t, c2); got != end {
			t.Fatalf("relay's %s came back as %s", end, got)
		}
	}
	if !forwarded(c1, negOpen("d")) || !forwarded(c1, negOpen("e")) {
		t.Fatal("the places the relay freed were not given back")
	}
	if forwarded(c1, negOpen("f")) {
		t.Fatal("f forwarded past the cap")
	}
	// A closed connection frees its places: c1 holds d and e; once it is
	// closed, c2 has both.
	c1.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !forwarded(c2, negOpen("g")) {
		if time.Now().After(deadline) {
			t.Fatal("the closed connection's syncs still count")
		}
		time.Sleep(10 * time.Millisecond) // polls, up to 5 s: the gate sees the real socket's close on its own goroutine
	}
	if !forwarded(c2, negOpen("h")) || forwarded(c2, negOpen("i")) {
		t.Fatal("after the close: want exactly two places")
	}
	for _, f := range rec.frames(0) {
		if strings.Contains(f, `"NEG-OPEN","f"`) || strings.Contains(f, `"NEG-OPEN","i"`) {
			t.Fatalf("a refused NEG-OPEN reached the relay: %s", f)
		}
	}
}

// TestGateRefusedSyncClosedAtRelay: a NEG-OPEN refused (here by its rate
// limit) whose id names a sync open at the relay is answered NEG-ERR, and
// the gate sends the relay a NEG-CLOSE for it, so the relay does not go on
// with what the client was told is over; its place is freed.
func TestGateRefusedSyncClosedAtRelay(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeNEGOPEN] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
	rec := newRecorder()
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &l}, MaxSyncs: 1}).Wrap(rec))
	c := dialRaw(t, url)
	_ = c.WriteMessage(websocket.TextMessage, []byte(negOpen("x")))
	_ = c.WriteMessage(websocket.TextMessage, []byte(negOpen("x")))
	got := readText(t, c)
	if !strings.HasPrefix(got, `["NEG-ERR","x","rate-limited: slow down; retry in `) {
		t.Fatalf("second NEG-OPEN x answered %s", got)
	}
	frames := rec.frames(2)
	if want := []string{negOpen("x"), `["NEG-CLOSE","x"]`}; !slices.Equal(frames, want) {
		t.Fatalf("the relay got %q, want %q", frames, want)
	}
}

// TestGateRefusedNegMsgClosesSync: a NEG-MSG the gate refuses (here by its
// rate limit) is answered NEG-ERR, after which NIP-77 has the sync closed:
// a client need send no NEG-CLOSE for it (this one does not). So the gate
// closes the sync at the relay (NEG-CLOSE) and frees its place in the
// client's count; kept, every refused NEG-MSG would have held a place until
// the connection ended, and a client at the cap could sync no more on any
// connection.
func TestGateRefusedNegMsgClosesSync(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeNEGMSG] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
	rec := newRecorder()
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &l}, MaxSyncs: 1}).Wrap(rec))
	c := dialRaw(t, url)
	negMsg := `["NEG-MSG","x","6100000200"]`
	for _, f := range []string{negOpen("x"), negMsg, negMsg} {
		_ = c.WriteMessage(websocket.TextMessage, []byte(f))
	}
	if got := readText(t, c); !strings.HasPrefix(got, `["NEG-ERR","x","rate-limited: slow down; retry in `) {
		t.Fatalf("second NEG-MSG x answered %s", got)
	}
	// x is over for the client: its place is free for y.
	_ = c.WriteMessage(websocket.TextMessage, []byte(negOpen("y")))
	frames := rec.frames(4)
	if want := []string{negOpen("x"), negMsg, `["NEG-CLOSE","x"]`, negOpen("y")}; !slices.Equal(frames, want) {
		t.Fatalf("the relay got %q, want %q", frames, want)
	}
}

// TestGateNegMsgOfNothingNotForwarded: a NEG-MSG whose id names no sync
// the gate counts open (never opened, or closed by a NEG-CLOSE) is answered
// NEG-ERR "closed: …" and never reaches the relay, where it would keep
// alive a sync the gate no longer counts (a NEG-CLOSE right behind its
// NEG-OPEN reaches khatru's handler first: TestE2ESyncCapKhatru). An
// allow-listed client's syncs are not counted, so its NEG-MSGs all go.
func TestGateNegMsgOfNothingNotForwarded(t *testing.T) {
	const closed = `["NEG-ERR","x","` + reasonNoSync + `"]`
	msg := `["NEG-MSG","x","6100000200"]`
	rec := newRecorder()
	c := dialRaw(t, serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}).Wrap(rec)))
	for _, f := range []string{msg, negOpen("x"), msg, `["NEG-CLOSE","x"]`, msg} {
		_ = c.WriteMessage(websocket.TextMessage, []byte(f))
	}
	for range 2 {
		if got := readText(t, c); got != closed {
			t.Fatalf("NEG-MSG of no open sync answered %s, want %s", got, closed)
		}
	}
	// The echo behind them: the relay has had all it will get.
	_ = c.WriteMessage(websocket.TextMessage, recorderCmd("echo", `["EOSE","ping"]`))
	if got := readText(t, c); got != `["EOSE","ping"]` {
		t.Fatalf("echo answered %s", got)
	}
	want := []string{negOpen("x"), msg, `["NEG-CLOSE","x"]`}
	if got := rec.frames(4); !slices.Equal(got[:min(3, len(got))], want) || len(got) != 4 {
		t.Fatalf("the relay got %q, want %q and the echo", got, want)
	}

	rec = newRecorder()
	c = dialRaw(t, serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}, Identity: policy.Identity{AllowIPs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}}}).Wrap(rec)))
	_ = c.WriteMessage(websocket.TextMessage, []byte(msg))
	if got := rec.frames(1); !slices.Equal(got, []string{msg}) {
		t.Fatalf("allow-listed: the relay got %q, want %q", got, msg)
	}
}
