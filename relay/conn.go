package relay

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-relay/sluice/relay/internal/charge"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/wire"
)

// conn is one gated connection: what the gate knows of it and decides
// for it, the same in both modes. side is how it reaches the sockets: in
// Wrap mode the tap (tapConn), the gate's state inside the client's socket
// as the in-process relay serves it, which runs no goroutine of its own;
// behind Proxy the bridge, a client WebSocket bridged to an upstream
// WebSocket by three goroutines.
type conn struct {
	g      *Gate
	side   clientSide
	ctx    context.Context // cancelled when the connection ends
	cancel context.CancelFunc

	once    sync.Once
	closing chan struct{} // closed by end

	// Set before the goroutines start, read-only after.
	who  string     // the client's budget key, for logs
	addr netip.Addr // the client's address, for its aggregates
	aggs []string   // its aggregates' prefixes when it connected, for the penalty box
	// banned is the wait of a ban of the penalty box this connection's
	// violations brought on its client: the connection is then ended.
	banned time.Duration

	host  string        // the host the client asked for, for NIP-42's relay tag
	meter *controlMeter // what the client's stream owes in control frames

	owed  owed      // requests forwarded and not yet answered by the relay
	subs  subTable  // subscriptions open at the relay
	syncs syncTable // NIP-77 syncs open at the relay
	reads connReads // its payer's read account (readmeter.go)
	// Owned by the client reader: a CLOSE to send the relay after a
	// refusal, and the wait of a client cut for knocking.
	closeUp []byte
	// relayW is the relay's write side behind Proxy (nil in relay mode,
	// where the client reader alone writes to the relay): held while a
	// frame is decided and while one is written, so that the CLOSEs the
	// gate owes go between frames (bridge.closeOwed).
	relayW *sync.Mutex
	// unsent is the id of the REQ decided and not yet written to the relay
	// behind Proxy (under relayW), in unsentBuf; nil for none.
	unsent    []byte
	unsentBuf [wire.MaxSubIDBytes]byte
	knocks    knockMeter
	knocked   time.Duration
	hold      holdState // the frame held rather than refused (shaping)

	pending pending // forwarded EVENTs awaiting the relay's OK (quota only)
	// settling: settleAged is due (a timer), with Options.Stored;
	// subTimer: expireSubs is due, while a REQ or COUNT awaits its answer.
	settleMu sync.Mutex
	settling *time.Timer
	subTimer *time.Timer
	ended    bool    // settlePending ran: no timer any more
	charged  charged // EVENTs charged to the quota (its own lock: the relay reader and the settling)
	auths    auths   // NIP-42 challenges seen and verified AUTHs in flight
	gateAuth bool    // the gate does NIP-42 itself (Options.GateAuth, behind Proxy)
	// authed is what the relay accepted (NIP-42); nil before. Read on
	// every frame, written once per accepted AUTH.
	authed atomic.Pointer[authState]
	// sub is who pays for the connection's frames (see subject); written
	// by the client reader, and by the relay reader when an AUTH is
	// accepted.
	sub atomic.Pointer[charge.Subject]
	// shadowUntil: no "would be rate-limited" log line before this
	// instant (client reader only), one per wait as for refusals.
	shadowUntil time.Time
}

// authState is a connection's NIP-42 identity as the relay accepted it.
type authState struct {
	pubkey string // 64 lowercase hex digits
}

// end tears the connection down once: it sends a close frame with code
// and text to the client if toClient and to the relay if toUp (false for
// a side that closed first or is broken), closes both sockets and cancels
// ctx. Safe from any goroutine; only the first call does anything.
func (c *conn) end(toClient, toUp bool, code int, text string) {
	c.once.Do(func() { c.side.shut(toClient, toUp, code, text) })
}

// clientSide is the connection's two sockets as the decision reaches
// them, one implementation per mode: the tap (Wrap: the client's socket as
// the in-process relay serves it) and the bridge (Proxy: the client's
// WebSocket and the relay's).
type clientSide interface {
	// reply sends the client a frame of the gate's own (a refusal), after
	// what the relay has sent it so far, and reports whether the
	// connection goes on.
	reply(data []byte) bool
	// toRelay sends the relay a text frame of the gate's own (a CLOSE)
	// before the client frame being decided, and reports whether the
	// connection goes on.
	toRelay(frame []byte) bool
	// shut tears both sides down as end describes (called once, by end).
	shut(toClient, toUp bool, code int, text string)
}

// watch looks at a relay frame for the OK that answers a forwarded EVENT
// (charging the quota) or AUTH (binding the verified pubkey), for the
// relay's NIP-42 challenges, and for the EOSE, CLOSED and NEG-ERR that
// answer the client's subscriptions and syncs (subTable, syncTable). It
// runs on the relay reader only.
func (c *conn) watch(frame []byte) {
	label, lit := scan.ReadRelay(frame)
	switch label {
	case "":
		return
	case "EVENT":
		// Stored events on their way answer a REQ too (reqHold).
		if c.subs.awaiting.Load() > 0 && lit != nil {
			var buf [wire.MaxSubIDBytes]byte
			if id, ok := subID(&buf, lit); ok {
				c.subs.heard(id, time.Now())
			}
		}
		return
	case "AUTH":
		if lit != nil && c.g.current().watchOK {
			c.auths.challenge(lit)
		}
		return
	}
	// What is left answers a client's request: OK (EVENT, AUTH), EOSE and
	// CLOSED (REQ), COUNT and CLOSED (COUNT), NEG-MSG and NEG-ERR
	// (NEG-OPEN, NEG-MSG).
	c.owed.answered()
	var buf [wire.MaxSubIDBytes]byte
	switch label {
	case "EOSE":
		if id, ok := subID(&buf, lit); ok {
			c.subs.answered(id)
		}
	case "CLOSED":
		if id, ok := subID(&buf, lit); ok && !c.subs.counted(id) {
			c.subs.closedByRelay(id)
		}
	case "COUNT":
		if id, ok := subID(&buf, lit); ok {
			c.subs.counted(id)
		}
	case "NEG-ERR":
		if id, ok := subID(&buf, lit); ok {
			c.closeSync(id)
		}
	}
	if label != "OK" || !c.g.current().watchOK {
		return
	}
	id, accepted, duplicate, isOK := scan.ParseOK(frame)
	if !isOK {
		return
	}
	if pe, ok := c.pending.take(id); ok {
		c.g.takeInflight(c.inflightKey(pe.actor))
		if q := c.subject(c.g.current().p).Quota(); accepted && !duplicate && q != nil && (c.g.stored == nil || c.g.stored(id)) {
			c.charge(c.ctx, q, id, pe)
		}
		return
	}
	if pk, ok := c.auths.answered(id); ok && accepted {
		c.bind(pk)
	}
}

// delivers reports whether a relay frame may go to the client: not an
// EVENT or EOSE under a subscription id closed for it since its last
// forwarded REQ (subTable). Only the frame's start is read; it is cheap
// while the connection remembers no closed id.
func (c *conn) delivers(frame []byte) bool {
	if c.subs.nGone.Load() == 0 {
		return true
	}
	lit := addressed(frame)
	return lit == nil || c.deliversUnder(lit)
}

// addressed returns the subscription id literal of a relay frame sent
// under a subscription (an EVENT or EOSE); nil for any other.
func addressed(frame []byte) []byte {
	if label, lit := scan.ReadRelay(frame); label == "EVENT" || label == "EOSE" {
		return lit
	}
	return nil
}

// deliversUnder reports whether a relay frame under the subscription id
// literal lit (an EVENT's or EOSE's) may go to the client; an atomic load
// while no subscription is closed for it.
func (c *conn) deliversUnder(lit []byte) bool {
	if c.subs.nGone.Load() == 0 {
		return true
	}
	var buf [wire.MaxSubIDBytes]byte
	id, ok := subID(&buf, lit)
	return !ok || !c.subs.isGone(id)
}

// subject returns who pays for the connection's frames under p, the
// running policy: the pubkey's tier budget once the connection has proved a
// member pubkey, else the address's (charged nothing when the address or
// the proved pubkey is allow-listed). It is rebuilt when the policy was
// reloaded.
func (c *conn) subject(p *charge.Policy) *charge.Subject {
	if s := c.sub.Load(); s != nil && s.Policy() == p {
		return s
	}
	s := c.subjectFor(p)
	c.sub.Store(s)
	return s
}

// subjectFor builds the connection's Subject under p.
func (c *conn) subjectFor(p *charge.Policy) *charge.Subject {
	id := p.Identity()
	free := id.AllowsAddr(c.addr)
	if a := c.authed.Load(); a != nil && !free {
		if id.AllowsPubkey(a.pubkey) {
			free = true
		} else if s := p.MemberSubject(a.pubkey); s != nil {
			return s
		}
	}
	return p.AddressSubject(c.who, c.addr, free)
}

// authPubkey is the pubkey the connection proved (NIP-42), "" for none.
func (c *conn) authPubkey() string {
	if a := c.authed.Load(); a != nil {
		return a.pubkey
	}
	return ""
}
