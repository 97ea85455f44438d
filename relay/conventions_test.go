package relay

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// Stand-in upstreams: small relays that answer the way relays not written
// like khatru do (each convention was seen in a relay in use), so that
// what the gate promises behind Proxy holds whatever the relay says.

// standIn is a relay that sends challenge (NIP-42) on every connection, if
// set, and answers each frame with what answer returns for it. It keeps
// every frame it got.
type standIn struct {
	challenge string
	answer    func(frame []byte) []string

	mu   sync.Mutex
	got  []string
	cond *sync.Cond
}

func newStandIn(challenge string, answer func(frame []byte) []string) *standIn {
	s := &standIn{challenge: challenge, answer: answer}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *standIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	up := websocket.Upgrader{}
	c, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer c.Close()
	if s.challenge != "" {
		_ = c.WriteMessage(websocket.TextMessage, []byte(`["AUTH","`+s.challenge+`"]`))
	}
	for {
		_, data, err := c.ReadMessage()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.got = append(s.got, string(data))
		s.cond.Broadcast()
		s.mu.Unlock()
		if s.answer == nil {
			continue
		}
		for _, a := range s.answer(data) {
			if c.WriteMessage(websocket.TextMessage, []byte(a)) != nil {
				return
			}
		}
	}
}

// frames returns what the stand-in got so far.
func (s *standIn) frames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// waitFrames waits for the stand-in to have got n frames and returns them.
func (s *standIn) waitFrames(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.AfterFunc(5*time.Second, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer deadline.Stop()
	start := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.got) < n && time.Since(start) < 5*time.Second {
		s.cond.Wait()
	}
	return append([]string(nil), s.got...)
}

// Answering conventions, as answer funcs of a stand-in.
var (
	// okAll answers every EVENT OK true under the id its frame carries,
	// checking nothing: a relay that stores what it is given under the
	// frame's id.
	okAll = func(frame []byte) []string {
		if id := frameID(frame); id != "" {
			return []string{`["OK","` + id + `",true,""]`}
		}
		return nil
	}
	// noticeAll refuses every EVENT and REQ with a NOTICE, as a
	// validator in front of the relay does.
	noticeAll = func([]byte) []string { return []string{`["NOTICE","invalid: refused by the validator"]`} }
	// okNoID refuses every EVENT with an OK whose id is "".
	okNoID = func(frame []byte) []string {
		if frameID(frame) != "" {
			return []string{`["OK","",false,"invalid: bad event"]`}
		}
		return nil
	}
	// okOtherID answers every EVENT with an OK for another id.
	okOtherID = func(frame []byte) []string {
		if frameID(frame) != "" {
			return []string{`["OK","` + strings.Repeat("ab", 32) + `",true,""]`}
		}
		return nil
	}
)

// frameID is the id an EVENT frame carries, "" for any other frame.
func frameID(frame []byte) string {
	if scan.Peek(frame).Type != wire.TypeEVENT || !strings.Contains(string(frame), `"id":"`) {
		return ""
	}
	return idOf(string(frame))
}

// proxyPipe serves, on an in-memory network (inside a synctest bubble),
// a gate with opts behind Proxy in front of upstream, and returns the
// network and the URL to dial on it.
func proxyPipe(t *testing.T, opts Options, upstream http.Handler) (*Gate, *pipeNet, string) {
	t.Helper()
	relayNet, relayURL := servePipe(t, upstream)
	up, _, err := newURLUpstream(relayURL)
	if err != nil {
		t.Fatal(err)
	}
	up.dialer.NetDialContext = relayNet.dial
	g := newGate(t, opts)
	pn, url := servePipe(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.serveWS(w, r, up) }))
	return g, pn, url
}

// writeText sends frame as a text message.
func writeText(t *testing.T, c *websocket.Conn, frame string) {
	t.Helper()
	if err := c.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
		t.Fatal(err)
	}
}

// A relay that stores events under the id their frame carries cannot be
// made to charge a victim for its public event sent again under made-up
// ids: the gate checks every id against the event's hash and forwards
// none of them.
func TestProxyFakeIDsChargeNobody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := nostrtest.NewClock()
		q, _ := ratelimit.NewQuota(3, time.Minute)
		relay := newStandIn("", okAll)
		_, pn, url := proxyPipe(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}}, relay)
		victimSK, _ := newKey(t)
		ev := nostrtest.Note(t, victimSK, "hello")
		c := pn.dialWS(t, url)
		frame := eventFrameOf(t, ev)
		for i := range 10 {
			fake := strings.Replace(string(frame), ev.ID, fmt.Sprintf("%064x", i+1), 1)
			writeText(t, c, fake)
			if got, want := readTextT(t, c), fmt.Sprintf(`["OK","%064x",false,"invalid: event id does not match its content"]`, i+1); got != want {
				t.Fatalf("event under a made-up id answered %s, want %s", got, want)
			}
		}
		if got := relay.frames(); len(got) != 0 {
			t.Fatalf("the relay got %d events under made-up ids", len(got))
		}
		if quotaOver(t, q.WithClock(clk.Now), ev.PubKey) {
			t.Fatal("the victim's quota was spent")
		}
		// The event under its own id passes, once.
		writeText(t, c, string(frame))
		if got := readTextT(t, c); got != `["OK","`+ev.ID+`",true,""]` {
			t.Fatalf("the event under its id answered %s", got)
		}
	})
}

// Behind a relay that does not verify signatures, an event forged in a
// victim's name (its id right, its signature not) is refused by the gate
// when the quota would charge it, unless the operator says the relay
// verifies; without a quota to charge it is the relay's to judge.
func TestProxyVerifiesSignaturesTheQuotaCharges(t *testing.T) {
	for _, tc := range []struct {
		name     string
		verifies bool
		quota    bool
		want     string // the answer to the forged event
	}{
		{"quota", false, true, "invalid: signature is invalid"},
		{"quota, relay verifies", true, true, ""},
		{"no quota", false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clk := nostrtest.NewClock()
				q, _ := ratelimit.NewQuota(3, time.Minute)
				cfg := policy.Config{Limits: &policy.Limits{}}
				if tc.quota {
					cfg.Quota = q.WithClock(clk.Now)
				}
				relay := newStandIn("", okAll)
				_, pn, url := proxyPipe(t, Options{Limiter: memLimiter(clk), Policy: cfg, UpstreamVerifies: tc.verifies}, relay)
				victimSK, _ := newKey(t)
				otherSK, _ := newKey(t)
				forged := nostrtest.Note(t, otherSK, "forged")
				victim := nostrtest.Note(t, victimSK, "x")
				forged.PubKey = victim.PubKey
				forged.ID = forged.GetID()
				c := pn.dialWS(t, url)
				writeText(t, c, string(eventFrameOf(t, forged)))
				got := readTextT(t, c)
				if tc.want != "" {
					if want := `["OK","` + forged.ID + `",false,"` + tc.want + `"]`; got != want {
						t.Fatalf("forged event answered %s, want %s", got, want)
					}
					if n := len(relay.frames()); n != 0 {
						t.Fatalf("the relay got the forged event")
					}
				} else if got != `["OK","`+forged.ID+`",true,""]` {
					t.Fatalf("forged event answered %s, want the relay's OK", got)
				}
				// A signed event passes either way.
				good := nostrtest.Note(t, victimSK, "signed")
				writeText(t, c, string(eventFrameOf(t, good)))
				if got := readTextT(t, c); got != `["OK","`+good.ID+`",true,""]` {
					t.Fatalf("signed event answered %s", got)
				}
			})
		})
	}
}

// Whatever a relay answers an EVENT with — a NOTICE, an OK whose id is ""
// or another event's, or nothing — the event leaves the table of events
// awaiting their OK within pendingHold + settleAge, uncharged: an actor
// whose maxActorPending events went unanswered is blocked only until then,
// and only that actor.
func TestProxyUnansweredEventsLeave(t *testing.T) {
	for name, answer := range map[string]func([]byte) []string{
		"silence": nil, "NOTICE": noticeAll, `OK ""`: okNoID, "OK for another id": okOtherID,
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clk := nostrtest.NewClock()
				q, _ := ratelimit.NewQuota(2, time.Minute)
				relay := newStandIn("", answer)
				_, pn, url := proxyPipe(t, Options{UpstreamVerifies: true, Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}}, relay)
				actors := apartPubkeys(q, clk.Now(), 2)
				actor, other := actors[0], actors[1]
				k := 0 // the relay's answers to one event
				if answer != nil {
					k = len(answer([]byte(eventFrame(0, actor))))
				}
				c := pn.dialWS(t, url)
				for n := 1; n <= maxActorPending; n++ {
					writeText(t, c, eventFrame(n, actor))
					readN(t, c, k)
				}
				// A silent relay holds each client back for its unanswered
				// requests (owedWait), so the first events may have left
				// already; a relay that answers otherwise does not.
				writeText(t, c, eventFrame(maxActorPending+1, actor))
				synctest.Wait()
				if len(relay.frames()) == maxActorPending {
					if got, want := readTextT(t, c), okReply(maxActorPending+1, false, reasonActorPending); got != want {
						t.Fatalf("event past the bound answered %s, want %s", got, want)
					}
					// Another pubkey from the same address is not held up.
					writeText(t, c, eventFrame(1000, other))
					synctest.Wait()
					if got := relay.frames(); len(got) != maxActorPending+1 {
						t.Fatalf("the other pubkey's event was not forwarded")
					}
					readN(t, c, k)
					time.Sleep(pendingHold + settleAge)
					synctest.Wait()
				} else {
					readN(t, c, k)
				}
				n := len(relay.frames())
				writeText(t, c, eventFrame(maxActorPending+2, actor))
				synctest.Wait()
				if len(relay.frames()) != n+1 {
					t.Fatalf("the actor is still blocked %v after its events went unanswered", pendingHold+settleAge)
				}
				if quotaOver(t, q.WithClock(clk.Now), actor) {
					t.Fatal("unanswered events were charged")
				}
			})
		})
	}
}

// readTextT reads the next text frame, inside a synctest bubble or not.
func readTextT(t *testing.T, c *websocket.Conn) string {
	t.Helper()
	_, b, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

// readN reads n frames.
func readN(t *testing.T, c *websocket.Conn, n int) {
	t.Helper()
	for range n {
		readTextT(t, c)
	}
}

// A relay that sends a NIP-42 challenge, authenticates the client and
// answers its AUTH with nothing: the gate binds the pubkey on its own
// verification after authSilence, so allow.pubkeys (and tiers) apply; an
// AUTH the relay refuses binds nothing.
func TestProxyAuthWithoutOK(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused=%v", refuse), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clk := nostrtest.NewClock()
				sk, pk := newKey(t)
				var l policy.Limits
				l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
				relay := newStandIn("ch1", func(frame []byte) []string {
					if refuse && scan.Peek(frame).Type == wire.TypeAUTH {
						return []string{`["OK","` + idOf(string(frame)) + `",false,"restricted: not you"]`}
					}
					return nil
				})
				_, pn, url := proxyPipe(t, Options{UpstreamVerifies: true, RelayURL: "ws://127.0.0.1:7777", Limiter: memLimiter(clk),
					Policy: policy.Config{Limits: &l, Identity: policy.Identity{AllowPubkeys: []string{pk}}}}, relay)
				c := pn.dialWS(t, url)
				if got := readTextT(t, c); got != `["AUTH","ch1"]` {
					t.Fatalf("challenge %s", got)
				}
				auth, _ := signedAuth(t, sk, "ch1", "ws://127.0.0.1:7777", clk.Now())
				writeText(t, c, auth)
				if refuse {
					readTextT(t, c)
				}
				time.Sleep(authSilence)
				synctest.Wait()
				for i := range 3 {
					writeText(t, c, eventFrame(i, pk))
				}
				synctest.Wait()
				got := len(relay.frames()) - 1 // the AUTH
				if want := 3; refuse {
					if got != 1 {
						t.Fatalf("after a refused AUTH the relay got %d of 3 events, want 1 (the EVENT limit's burst)", got)
					}
				} else if got != want {
					t.Fatalf("the relay got %d of 3 events from an allow-listed pubkey whose AUTH it never answered", got)
				}
			})
		})
	}
}

// readAll reads c's frames on a goroutine of its own (a client that
// always reads: the gate's writes never wait on it) into the channel it
// returns, closed when c is.
func readAll(c *websocket.Conn) <-chan string {
	ch := make(chan string, 64)
	go func() {
		defer close(ch)
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				return
			}
			ch <- string(b)
		}
	}()
	return ch
}

// received returns the frames in ch once every goroutine of the bubble is
// blocked (synctest.Wait): what the client has been sent by now.
func received(ch <-chan string) []string {
	synctest.Wait()
	var got []string
	for {
		select {
		case f, ok := <-ch:
			if !ok {
				return append(got, "(closed)")
			}
			got = append(got, f)
		default:
			return got
		}
	}
}

// A relay that refuses a REQ or a COUNT with a NOTICE, or never answers
// it: reqHold after it was forwarded its place comes back, the client is
// told CLOSED (it would wait for an EOSE for ever), and the relay is sent
// a CLOSE for each REQ before the client's next frame.
func TestProxyUnansweredREQsFreeTheirPlaces(t *testing.T) {
	for name, answer := range map[string]func([]byte) []string{"silence": nil, "NOTICE": noticeAll} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				relay := newStandIn("", answer)
				_, pn, url := proxyPipe(t, Options{MaxSubscriptions: 3, Policy: policy.Config{Limits: &policy.Limits{}}}, relay)
				c := pn.dialWS(t, url)
				in := readAll(c)
				for _, f := range []string{`["REQ","s0",{"kinds":[1]}]`, `["REQ","s1",{"kinds":[1]}]`, `["COUNT","c",{"kinds":[1]}]`} {
					writeText(t, c, f)
				}
				if got := received(in); answer == nil && len(got) != 0 || answer != nil && len(got) != 3 {
					t.Fatalf("the client got %q", got)
				}
				writeText(t, c, `["REQ","s2",{"kinds":[1]}]`)
				if got := received(in); len(got) != 1 || !strings.HasPrefix(got[0], `["CLOSED","s2","blocked: too many open subscriptions`) {
					t.Fatalf("REQ past the cap answered %q", got)
				}
				time.Sleep(reqHold - time.Second)
				writeText(t, c, `["REQ","s3",{"kinds":[1]}]`)
				if got := received(in); len(got) != 1 || !strings.HasPrefix(got[0], `["CLOSED","s3","blocked: too many open subscriptions`) {
					t.Fatalf("REQ past the cap a second before reqHold answered %q", got)
				}
				time.Sleep(time.Second)
				got := received(in)
				slices.Sort(got)
				want := []string{`["CLOSED","c","` + reasonUnanswered + `"]`, `["CLOSED","s0","` + reasonUnanswered + `"]`, `["CLOSED","s1","` + reasonUnanswered + `"]`}
				if answer != nil {
					// The gate CLOSEs s0 and s1 at the relay at once, which
					// answers each with its NOTICE.
					notice := `["NOTICE","invalid: refused by the validator"]`
					want = append(want, notice, notice)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("reqHold on, the client got %q, want %q", got, want)
				}
				writeText(t, c, `["REQ","s4",{"kinds":[1]}]`)
				writeText(t, c, `["REQ","s5",{"kinds":[1]}]`)
				if got := relay.waitFrames(t, 7); len(got) != 7 || !strings.HasPrefix(got[3], `["CLOSE","s`) || !strings.HasPrefix(got[4], `["CLOSE","s`) || got[3] == got[4] || got[5] != `["REQ","s4",{"kinds":[1]}]` || got[6] != `["REQ","s5",{"kinds":[1]}]` {
					t.Fatalf("the relay got %q, want a CLOSE for s0 and s1, then s4 and s5", got)
				}
			})
		})
	}
}

// A relay still sending a REQ's stored events has not left it unanswered:
// each EVENT under its id puts off giving it up by reqHold.
func TestProxyREQAnsweredByEventsStaysOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sk, _ := newKey(t)
		ev := string(eventFrameOf(t, nostrtest.Note(t, sk, "stored")))
		stored := `["EVENT","s0",` + strings.TrimSuffix(strings.TrimPrefix(ev, `["EVENT",`), `]`) + `]`
		// A REQ "p…" makes the relay send one more of s0's stored events
		// (and answer p… at once).
		relay := newStandIn("", func(frame []byte) []string {
			if id, ok := strings.CutPrefix(string(frame), `["REQ","p`); ok {
				return []string{stored, `["EOSE","p` + id[:1] + `"]`}
			}
			return nil
		})
		_, pn, url := proxyPipe(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}, relay)
		c := pn.dialWS(t, url)
		in := readAll(c)
		writeText(t, c, `["REQ","s0",{"kinds":[1]}]`)
		time.Sleep(reqHold / 2)
		writeText(t, c, `["REQ","p1",{"kinds":[2]}]`)
		if got := received(in); len(got) != 2 || got[0] != stored {
			t.Fatalf("got %q, want s0's event and p1's EOSE", got)
		}
		time.Sleep(reqHold - time.Second)
		if got := received(in); len(got) != 0 {
			t.Fatalf("got %q, want nothing: s0's events came %v ago", got, reqHold-time.Second)
		}
		time.Sleep(time.Second)
		if got, want := received(in), `["CLOSED","s0","`+reasonUnanswered+`"]`; len(got) != 1 || got[0] != want {
			t.Fatalf("got %q, want %s once the relay was silent under s0 for reqHold", got, want)
		}
	})
}

// A relay that does no NIP-42 (no challenge, and an AUTH answered as it
// likes): with Options.GateAuth the gate sends its own challenge and
// answers the AUTH itself, so allow.pubkeys applies; the AUTH never
// reaches the relay.
func TestProxyGateAuth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := nostrtest.NewClock()
		sk, pk := newKey(t)
		var l policy.Limits
		l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
		relay := newStandIn("", nil)
		_, pn, url := proxyPipe(t, Options{GateAuth: true, UpstreamVerifies: true, RelayURL: "ws://127.0.0.1:7777", Limiter: memLimiter(clk),
			Policy: policy.Config{Limits: &l, Identity: policy.Identity{AllowPubkeys: []string{pk}}}}, relay)
		c := pn.dialWS(t, url)
		first := readTextT(t, c)
		ch, ok := strings.CutPrefix(first, `["AUTH","`)
		if !ok {
			t.Fatalf("first frame %s, want the gate's challenge", first)
		}
		ch = strings.TrimSuffix(ch, `"]`)
		wrong, _ := signedAuth(t, sk, ch+"x", "ws://127.0.0.1:7777", clk.Now())
		writeText(t, c, wrong)
		if got := readTextT(t, c); !strings.Contains(got, `,false,"invalid: AUTH challenge`) {
			t.Fatalf("AUTH for another challenge answered %s", got)
		}
		auth, id := signedAuth(t, sk, ch, "ws://127.0.0.1:7777", clk.Now())
		writeText(t, c, auth)
		if got := readTextT(t, c); got != okFor(id, true, "") {
			t.Fatalf("AUTH answered %s, want OK true", got)
		}
		for i := range 3 {
			writeText(t, c, eventFrame(i, pk))
		}
		synctest.Wait()
		got := relay.frames()
		if len(got) != 3 {
			t.Fatalf("the relay got %d frames, want the allow-listed pubkey's 3 events and no AUTH: %q", len(got), got)
		}
	})
}

// A relay that does not do COUNT (NIP-45) or negentropy (NIP-77) answers
// them with a NOTICE, as a validator in front of it does, and the client
// waits on. With Options.Supports saying so, the gate answers them itself,
// CLOSED and NEG-ERR "unsupported: …", and forwards neither; a relay that
// does them gets them.
func TestProxyUnsupportedNIPs(t *testing.T) {
	for _, does := range []bool{false, true} {
		t.Run(fmt.Sprintf("supported=%v", does), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				relay := newStandIn("", noticeAll)
				var asked []int
				supports := func(nip int) bool { asked = append(asked, nip); return does }
				// COUNT is charged, NEG-OPEN free: a refusal of either
				// is charged (a free type's to the catch-all).
				var l policy.Limits
				l.Message[wire.TypeCOUNT] = []ratelimit.Limit{ratelimit.PerPeriod(1e6, time.Second)}
				_, pn, url := proxyPipe(t, Options{Supports: supports, Policy: policy.Config{Limits: &l}}, relay)
				c := pn.dialWS(t, url)
				count := `["COUNT","c",{"kinds":[1]}]`
				neg := `["NEG-OPEN","n",{"kinds":[1]},"61"]`
				writeText(t, c, count)
				writeText(t, c, neg)
				if does {
					if got := relay.waitFrames(t, 2); len(got) != 2 || got[0] != count || got[1] != neg {
						t.Fatalf("the relay got %q, want the COUNT and the NEG-OPEN", got)
					}
					readN(t, c, 2) // its NOTICEs
				} else {
					for _, want := range []string{
						`["CLOSED","c","unsupported: this relay does not do COUNT (NIP-45)"]`,
						`["NEG-ERR","n","unsupported: this relay does not do negentropy syncs (NIP-77)"]`,
					} {
						if got := readTextT(t, c); got != want {
							t.Fatalf("answered %s, want %s", got, want)
						}
					}
					synctest.Wait()
					if got := relay.frames(); len(got) != 0 {
						t.Fatalf("the relay got %q", got)
					}
				}
				if len(asked) != 2 || asked[0] != 45 || asked[1] != 77 {
					t.Fatalf("Supports was asked of NIPs %v, want 45 then 77", asked)
				}
				// A REQ is the relay's whatever it does.
				writeText(t, c, `["REQ","s",{"kinds":[1]}]`)
				if got := relay.waitFrames(t, len(relay.frames())+1); got[len(got)-1] != `["REQ","s",{"kinds":[1]}]` {
					t.Fatalf("the relay got %q, want the REQ last", got)
				}
			})
		})
	}
}

// A relay that answers an event it has already with OK true and no
// "duplicate:" (khatru and @nostr-relay/core do): the author is charged
// once for it, however many connections send it again.
func TestProxyResentEventsChargeOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := nostrtest.NewClock()
		q, _ := ratelimit.NewQuota(2, time.Minute)
		relay := newStandIn("", okAll)
		_, pn, url := proxyPipe(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(clk.Now)}}, relay)
		sk, _ := newKey(t)
		publish := func(c *websocket.Conn, content string) string {
			ev := nostrtest.Note(t, sk, content)
			ev.CreatedAt = nostr.Timestamp(clk.Now().Unix())
			if err := ev.Sign(sk); err != nil {
				t.Fatal(err)
			}
			writeText(t, c, string(eventFrameOf(t, ev)))
			return readTextT(t, c)
		}
		public := nostrtest.Note(t, sk, "public")
		public.CreatedAt = nostr.Timestamp(clk.Now().Unix())
		if err := public.Sign(sk); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			c := pn.dialWS(t, url)
			writeText(t, c, string(eventFrameOf(t, public)))
			if got := readTextT(t, c); got != `["OK","`+public.ID+`",true,""]` {
				t.Fatalf("the event sent on connection %d answered %s", i, got)
			}
		}
		c := pn.dialWS(t, url)
		if got := publish(c, "second"); !strings.Contains(got, `",true,""]`) {
			t.Fatalf("the author's second event answered %s: its one event sent on 5 connections was charged more than once", got)
		}
		if got := publish(c, "third"); !strings.Contains(got, `,false,"rate-limited: quota: 2 events per 60s for this pubkey;`) {
			t.Fatalf("the author's third event answered %s, want the quota's refusal", got)
		}
	})
}
