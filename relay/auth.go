package relay

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/mailru/easyjson"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// NIP-42, verified by the gate. A connection is bound to a pubkey only
// when the gate has checked the client's AUTH event itself and the relay
// has then accepted it: an OK true for an id proves nothing by itself,
// since any event can carry any id until its hash is checked.

// maxAuthAge is how far an AUTH event's created_at may be from the gate's
// clock, either way: NIP-42's "about 10 minutes".
const maxAuthAge = 10 * time.Minute

// authSilence is how long the gate waits for the relay's OK to an AUTH it
// verified and forwarded. khatru answers every AUTH; some relays
// authenticate the client and say nothing. When no OK names the AUTH by
// then (an OK false does: the relay refused it), the gate binds the
// connection to its pubkey on its own verification — the relay sent the
// challenge, and the gate checked the event as NIP-42 says a relay must —
// and logs and counts it (policy.Unanswered).
const authSilence = 2 * time.Second

// authChallenges is how many of the relay's latest challenges a
// connection remembers; maxChallengeLen bounds each one.
const (
	authChallenges  = 4
	maxChallengeLen = 256
)

// Reasons an AUTH is refused by the gate.
const (
	reasonAuthChallenge = "invalid: AUTH challenge is not one this relay sent on this connection"
	reasonAuthRelay     = "invalid: AUTH relay tag does not name this relay"
	reasonAuthTime      = "invalid: AUTH created_at is more than 10 minutes away"
	reasonAuthSig       = "invalid: AUTH signature is invalid"
)

// auths is a connection's NIP-42 state: the challenges the relay sent
// (written by the relay reader) and the verified AUTH forwarded last,
// awaiting the relay's OK. Safe for concurrent use.
type auths struct {
	mu         sync.Mutex
	challenges [authChallenges]string
	next       int
	id         hex32  // the verified AUTH in flight
	pubkey     string // its pubkey; "" when none is in flight
}

// challenge records a challenge the relay sent, as its JSON literal.
func (a *auths) challenge(lit []byte) {
	var buf [maxChallengeLen]byte
	ch, ok := scan.Unquote(buf[:0], lit)
	if !ok || len(ch) == 0 {
		return
	}
	a.mu.Lock()
	a.challenges[a.next] = string(ch)
	a.next = (a.next + 1) % authChallenges
	a.mu.Unlock()
}

// issue records a fresh random challenge of the gate's own and returns the
// AUTH frame that sends it (Options.GateAuth).
func (a *auths) issue() []byte {
	var b [16]byte
	_, _ = rand.Read(b[:])
	lit := `"` + hex.EncodeToString(b[:]) + `"`
	a.challenge([]byte(lit))
	return []byte(`["AUTH",` + lit + `]`)
}

// sent reports whether the relay sent challenge ch on this connection.
func (a *auths) sent(ch []byte) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.challenges {
		if c != "" && c == string(ch) {
			return true
		}
	}
	return false
}

// inFlight records a verified AUTH the gate is forwarding.
func (a *auths) inFlight(id hex32, pubkey string) {
	a.mu.Lock()
	a.id, a.pubkey = id, pubkey
	a.mu.Unlock()
}

// answered takes the pubkey of the verified AUTH whose id is id.
func (a *auths) answered(id hex32) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pubkey == "" || a.id != id {
		return "", false
	}
	pk := a.pubkey
	a.pubkey = ""
	return pk, true
}

// verifyAuth checks a canonical AUTH event (scan.Scan has checked its
// shape and kind) as NIP-42 says a relay must, and on success records it
// as in flight: a challenge tag naming a challenge the relay sent on this
// connection, a relay tag naming this relay, created_at within maxAuthAge
// of the gate's clock, and a valid signature (scan.Scan has checked that
// its id is its hash). It returns "" or the reason for refusing it.
func (c *conn) verifyAuth(ev *scan.Event) string {
	var buf [maxChallengeLen]byte
	ch, ok := scan.Unquote(buf[:0], ev.Challenge)
	if !ok || !c.auths.sent(ch) {
		return reasonAuthChallenge
	}
	var ubuf [1024]byte
	u, ok := scan.Unquote(ubuf[:0], ev.Relay)
	if !ok || !c.g.namesThisRelay(string(u), c.host) {
		return reasonAuthRelay
	}
	if d := c.g.now().Sub(time.Unix(ev.CreatedAt, 0)); d > maxAuthAge || d < -maxAuthAge {
		return reasonAuthTime
	}
	var e nostr.Event // its id is its hash: scan.Scan checked it
	if err := easyjson.Unmarshal(ev.Raw, &e); err != nil {
		return reasonAuthSig
	}
	if ok, err := e.CheckSignature(); err != nil || !ok {
		return reasonAuthSig
	}
	c.auths.inFlight(ev.ID, ev.Pubkey.String())
	id := ev.ID
	time.AfterFunc(authSilence, func() { c.authUnanswered(id) })
	return ""
}

// authUnanswered binds the connection to the pubkey of the verified AUTH
// id if it is still awaiting the relay's OK (see authSilence).
func (c *conn) authUnanswered(id hex32) {
	select {
	case <-c.closing:
		return
	default:
	}
	pk, ok := c.auths.answered(id)
	if !ok {
		return
	}
	c.g.log.Info("relay did not answer AUTH; bound on the gate's own verification", "client", c.who, "pubkey", pk, "after", authSilence.String())
	c.g.obs.ReportFrame(c.who, wire.TypeAUTH, policy.Unanswered)
	c.bind(pk)
}

// bind makes pk the connection's NIP-42 pubkey: from its next frame on,
// the connection is charged as pk (its tier, or nothing when allow-listed).
func (c *conn) bind(pk string) {
	c.authed.Store(&authState{pubkey: pk})
	c.sub.Store(c.subjectFor(c.g.current().p))
}

// namesThisRelay reports whether an AUTH relay tag names this relay: its
// host (and path, when Options.RelayURL has one) equal to RelayURL's, or
// without RelayURL its host equal to host, the one the client connected
// to. Hosts compare without case and without the scheme's default port;
// the scheme itself is not compared, since TLS often ends in front of the
// gate.
func (g *Gate) namesThisRelay(tag, host string) bool {
	u, err := url.Parse(tag)
	if err != nil || u.Host == "" {
		return false
	}
	if g.relayURL != nil {
		return sameHost(u, g.relayURL.Scheme, g.relayURL.Host) &&
			(g.relayURL.Path == "" || strings.TrimSuffix(u.Path, "/") == strings.TrimSuffix(g.relayURL.Path, "/"))
	}
	return sameHost(u, u.Scheme, host)
}

// sameHost compares u's host with host (whose scheme is scheme), dropping
// default ports.
func sameHost(u *url.URL, scheme, host string) bool {
	return strings.EqualFold(stripDefaultPort(u.Scheme, u.Host), stripDefaultPort(scheme, host))
}

func stripDefaultPort(scheme, host string) string {
	h, port, err := net.SplitHostPort(host)
	if err != nil {
		return host
	}
	switch {
	case port == "80" && (scheme == "ws" || scheme == "http"),
		port == "443" && (scheme == "wss" || scheme == "https"):
		if strings.Contains(h, ":") {
			return "[" + h + "]"
		}
		return h
	}
	return host
}
