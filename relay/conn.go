package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// conn is one gated connection. In Wrap mode (tap set) it is the gate's
// state inside the client's socket as the in-process relay serves it
// (tapConn), and runs no goroutine of its own. Behind Proxy it is a client
// WebSocket bridged to an upstream WebSocket, and runs three goroutines:
//
//   - the client reader (the HTTP handler's own goroutine) reads a frame,
//     charges it and either writes it to the upstream itself (it is the
//     upstream's only writer) or queues a refusal for the client;
//   - the client writer is the client's only writer: it drains the
//     bounded out queue and sends keepalive pings to both sides (a side
//     silent for two ping intervals is gone);
//   - the upstream reader queues every relay frame for the client; while
//     the queue is at its bound it waits for the writer to drain it (see
//     outQueue.push), so a client that reads slowly slows its own relay
//     connection down and is never cut for it. A client that stops reading
//     is cut when a write to it stays blocked past the write timeout.
//
// A slow relay slows only the client reader of its own connection, and a
// slow client only its own relay connection.
type conn struct {
	g      *Gate
	client *websocket.Conn
	up     upConn
	// tap, in Wrap mode, is the client's socket as the in-process relay
	// reads and writes it (tapConn); client, up, out and wire are then
	// unused and no goroutine of the gate's runs.
	tap    *tapConn
	out    *outQueue
	wire   *meteredConn    // the client's socket, for coalescing writes
	ctx    context.Context // cancelled when the connection ends
	cancel context.CancelFunc

	once    sync.Once
	wg      sync.WaitGroup
	closing chan struct{} // closed by end

	clientRD readDeadline // owned by the client reader
	upRD     readDeadline // owned by the upstream reader
	// draining: the client has gone with events awaiting the relay's OK
	// (behind Proxy): the upstream reader reads the relay's answers on
	// for up to drainAnswers before it closes the relay's side (see end).
	draining atomic.Bool

	// Set before the goroutines start, read-only after.
	who  string     // the client's budget key, for logs
	addr netip.Addr // the client's address, for its aggregates

	host  string        // the host the client asked for, for NIP-42's relay tag
	meter *controlMeter // what the client's stream owes in control frames

	owed  owed      // requests forwarded and not yet answered by the relay
	subs  subTable  // subscriptions open at the relay
	syncs syncTable // NIP-77 syncs open at the relay
	// Owned by the client reader: a CLOSE to send the relay after a
	// refusal, and the wait of a client cut for knocking.
	closeUp []byte
	knocks  knockMeter
	knocked time.Duration

	pending pending // forwarded EVENTs awaiting the relay's OK (quota only)
	// settling: settleAged is due (a timer), with Options.Stored.
	settleMu sync.Mutex
	settling *time.Timer
	ended    bool    // settlePending ran: no timer any more
	charged  charged // EVENTs charged to the quota (its own lock: the relay reader and the settling)
	auths    auths   // NIP-42 challenges seen and verified AUTHs in flight
	// authed is what the relay accepted (NIP-42); nil before. Read on
	// every frame, written once per accepted AUTH.
	authed atomic.Pointer[authState]
	// sub is who pays for the connection's frames (see subject); written
	// by the client reader, and by the relay reader when an AUTH is
	// accepted.
	sub atomic.Pointer[policy.Subject]
	// shadowUntil: no "would be rate-limited" log line before this
	// instant (client reader only), one per wait as for refusals.
	shadowUntil time.Time
}

// authState is a connection's NIP-42 identity as the relay accepted it.
type authState struct {
	pubkey string // 64 lowercase hex digits
}

// readDeadline keeps a side's read deadline two ping intervals ahead,
// moving it at most once per half interval: every SetReadDeadline costs a
// timer update. A side is thus dropped after 1.5 to 2
// intervals of silence. Used by one reader goroutine only.
type readDeadline struct{ next time.Time }

func (d *readDeadline) extend(ws interface{ SetReadDeadline(time.Time) error }, interval time.Duration) {
	now := time.Now()
	if now.Before(d.next) {
		return
	}
	d.next = now.Add(interval / 2)
	_ = ws.SetReadDeadline(now.Add(2 * interval))
}

type outFrame struct {
	typ  int
	data []byte
}

// Close codes the gate sends on its own account.
const (
	closeSlowClient = websocket.ClosePolicyViolation // 1008: queue full
	closeGoingAway  = websocket.CloseGoingAway       // 1001: shutdown, upstream lost
)

// end tears the connection down once: it sends a close frame with code
// and text to the client if toClient and to the relay if toUp (false for
// a side that closed first or is broken), closes both sockets and cancels
// ctx. Safe from any goroutine; only the first call does anything.
func (c *conn) end(toClient, toUp bool, code int, text string) {
	c.once.Do(func() {
		if c.tap != nil {
			// To the relay, its connection's reads fail: it lets the
			// connection go as for a client gone.
			c.tap.shut(toClient, toUp, code, text)
			return
		}
		deadline := time.Now().Add(time.Second)
		msg := websocket.FormatCloseMessage(code, text)
		if toClient {
			_ = c.client.WriteControl(websocket.CloseMessage, msg, deadline)
		}
		// The client has gone with events the relay has yet to answer,
		// perhaps held back behind a reply it would not read: the
		// upstream reader reads the answers on, charging the quota for
		// what the relay accepted, and closes the relay's side after
		// (drainUpstream).
		drain := toUp && !toClient && c.pending.len() > 0
		if drain {
			c.draining.Store(true)
			_ = c.up.SetReadDeadline(time.Now().Add(drainAnswers))
		} else if toUp {
			if code == closeSlowClient {
				// The gate's own cut: to the relay the client has simply
				// gone. A 1008 would read as the client's protocol error
				// there (khatru logs every one as an unexpected close: a
				// log line per client cut, a flood of them under attack).
				msg = websocket.FormatCloseMessage(closeGoingAway, "sluice: client cut")
			}
			_ = c.up.WriteControl(websocket.CloseMessage, msg, deadline)
		}
		close(c.closing)
		c.cancel()
		_ = c.client.Close()
		if !drain {
			_ = c.up.Close()
		}
	})
}

// run serves the connection until either side closes, then waits for its
// goroutines.
func (c *conn) run() {
	// Each reader extends its own deadline before every read and on every
	// pong (pong handlers run inside the reader's own read calls): before
	// the read rather than after the last frame, so that the time a frame
	// took to handle — a wait for room in the queue included — never counts
	// as silence.
	c.client.SetPongHandler(func(string) error { c.clientRD.extend(c.client, c.g.pingInterval); return nil })
	c.up.SetPongHandler(func(string) error { c.upRD.extend(c.up, c.g.pingInterval); return nil })
	c.wg.Add(2)
	go c.writeClient()
	go c.readUpstream()
	c.readClient()
	c.wg.Wait()
	_ = c.up.Close() // if the upstream reader ended before it could drain (see end)
}

// send queues a frame for the client, waiting while the queue is at its
// bound (see outQueue.push), and reports whether it did: false once the
// connection is ending.
func (c *conn) send(typ int, data []byte) bool {
	if c.tap != nil {
		return c.tap.reply(data)
	}
	select {
	case <-c.closing:
		return false
	default:
	}
	if !c.out.push(outFrame{typ, data}) {
		c.cutBacklog()
		return false
	}
	return true
}

// cutBacklog ends a connection whose client is further behind than the
// queue's bound (Options.QueueBytes), however recently it read.
func (c *conn) cutBacklog() {
	c.g.cutLog.info(c.g.log, "closing slow client", "client", c.who, "reason", "backlog over the queue bound", "queued_bytes", c.out.queued())
	c.g.obs.ReportCut(CutSlowReader)
	c.end(true, true, closeSlowClient, "sluice: client reads too slowly")
}

// cutSlow ends a connection whose client took nothing of a write for the
// write timeout: it has stopped reading.
func (c *conn) cutSlow() {
	c.g.cutLog.info(c.g.log, "closing slow client", "client", c.who, "queued_bytes", c.out.queued())
	c.g.obs.ReportCut(CutSlowReader)
	c.end(true, true, closeSlowClient, "sluice: client reads too slowly")
}

func (c *conn) writeClient() {
	defer c.wg.Done()
	ping := time.NewTicker(c.g.pingInterval)
	defer ping.Stop()
	var spare []outFrame
	for {
		select {
		case <-c.out.ready:
			frames := c.out.take(spare)
			if !c.writeFrames(frames) {
				return
			}
			c.out.wrote()
			clear(frames) // drop the payloads; keep the slice
			spare = frames
		case <-ping.C:
			deadline := time.Now().Add(c.g.writeTimeout)
			if err := c.client.WriteControl(websocket.PingMessage, nil, deadline); err != nil {
				c.end(false, true, closeGoingAway, "client connection lost")
				return
			}
			// The relay is pinged too: a relay gone without a FIN would
			// otherwise hold this connection until a write to it failed.
			// A relay that cannot take a ping within half an interval is
			// not reading; the short deadline keeps it from stalling the
			// client's writes and pings.
			if err := c.up.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.g.pingInterval/2)); err != nil {
				c.end(true, false, closeGoingAway, "relay connection lost")
				return
			}
		case <-c.closing:
			return
		}
	}
}

// writeFrames writes a batch of queued frames to the client, coalesced
// into as few socket writes as fit the coalescing buffer, and reports
// whether the connection goes on. It sets no deadline of its own: the
// client's socket (meteredConn.stall) gives every piece of a write the
// write timeout, so a client is cut (cutSlow) when its socket makes no
// progress that long, never for how long a large batch takes to a client
// that reads slowly.
func (c *conn) writeFrames(frames []outFrame) bool {
	c.wire.coalesce(true)
	for _, f := range frames {
		if f.typ == websocket.CloseMessage { // the relay closed: pass it on, end
			_ = c.client.WriteMessage(f.typ, f.data)
			_ = c.wire.coalesce(false)
			c.end(false, false, 0, "")
			return false
		}
		if err := c.client.WriteMessage(f.typ, f.data); err != nil {
			c.writeFailed(err)
			return false
		}
	}
	if err := c.wire.coalesce(false); err != nil {
		c.writeFailed(err)
		return false
	}
	return true
}

// writeFailed ends the connection after a failed write to the client: cut
// as a slow reader when the write timed out, gone otherwise.
func (c *conn) writeFailed(err error) {
	if isTimeout(err) {
		c.cutSlow()
		return
	}
	c.end(false, true, closeGoingAway, "client connection lost")
}

// isTimeout reports whether a write to a client failed at its deadline
// (gorilla hands a timeout back as a net.Error of its own, not wrapped).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

func (c *conn) readUpstream() {
	defer c.wg.Done()
	for {
		if !c.draining.Load() { // draining: end set the last deadline
			c.upRD.extend(c.up, c.g.pingInterval)
		}
		typ, data, err := c.up.ReadMessage()
		if err != nil && c.draining.Load() {
			c.endUp()
			return
		}
		if err != nil {
			code, text := closeGoingAway, "relay connection lost"
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				code, text = relayable(ce)
			}
			// Queued behind the relay's last frames, so the client gets
			// them (a NOTICE saying why, say) before the close.
			c.send(websocket.CloseMessage, websocket.FormatCloseMessage(code, text))
			return
		}
		if typ == websocket.TextMessage {
			c.watch(data)
		}
		// Looked at and queued under order: a reply that tells the client
		// a subscription is closed is queued after every frame under it
		// that was let through (subTable).
		sent := true
		c.subs.order.Lock()
		if c.delivers(data) {
			sent = c.send(typ, data)
		}
		c.subs.order.Unlock()
		if !sent {
			if c.draining.Load() {
				c.drainUpstream()
			}
			return
		}
	}
}

// endUp ends the relay's side after a drain: the client has gone.
func (c *conn) endUp() {
	msg := websocket.FormatCloseMessage(closeGoingAway, "client connection lost")
	_ = c.up.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
	_ = c.up.Close()
}

// drainAnswers is how long, after a client went with events the relay had
// yet to answer, the gate reads the relay's answers on (behind Proxy).
const drainAnswers = 2 * time.Second

// drainUpstream reads the relay's frames after the client has gone,
// discarding them but for the OKs of the events it left awaiting one
// (watch charges the quota for those the relay accepted), until none is
// left, drainAnswers has passed since the client went (end set the read
// deadline) or the gate shuts down; then it closes the relay's side.
// Behind Proxy there is no store to ask (see Options.Stored), and the
// relay's answers are what says which events it took: a client that kept them from the gate behind a reply it did not
// read, and hung up, would otherwise have published past its quota for
// nothing. Charging the events as if stored instead would let anyone spend
// a pubkey's quota with its public events sent again and hung up on.
func (c *conn) drainUpstream() {
	defer c.endUp()
	for c.pending.len() > 0 {
		select {
		case <-c.g.stopped:
			return
		default:
		}
		typ, data, err := c.up.ReadMessage()
		if err != nil {
			return
		}
		if typ == websocket.TextMessage {
			c.watch(data)
		}
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
	lit, ok := wire.ParseAddressed(frame)
	return !ok || c.deliversUnder(lit)
}

// deliversUnder reports whether a relay frame under the subscription id
// literal lit (an EVENT's or EOSE's) may go to the client.
func (c *conn) deliversUnder(lit []byte) bool {
	var buf [wire.MaxSubIDBytes]byte
	id, ok := subID(&buf, lit)
	return !ok || !c.subs.isGone(id)
}

// relayable maps a received close onto one that may be sent: 1005 and
// 1006 are reserved for "no status" and must not appear on the wire.
func relayable(ce *websocket.CloseError) (int, string) {
	switch ce.Code {
	case websocket.CloseNoStatusReceived, websocket.CloseAbnormalClosure, websocket.CloseTLSHandshake:
		return websocket.CloseNormalClosure, ""
	}
	return ce.Code, ce.Text
}

// watch looks at a relay frame for the OK that answers a forwarded EVENT
// (charging the quota) or AUTH (binding the verified pubkey), for the
// relay's NIP-42 challenges, and for the EOSE, CLOSED and NEG-ERR that
// answer the client's subscriptions and syncs (subTable, syncTable). It
// runs on the relay reader only.
func (c *conn) watch(frame []byte) {
	if wire.IsEvent(frame) {
		return
	}
	if wire.IsAnswer(frame) {
		c.owed.answered()
	}
	if lit, ok := wire.ParseEOSE(frame); ok {
		var buf [wire.MaxSubIDBytes]byte
		if id, ok := subID(&buf, lit); ok {
			c.subs.answered(id)
		}
		return
	}
	if lit, ok := wire.ParseClosed(frame); ok {
		var buf [wire.MaxSubIDBytes]byte
		if id, ok := subID(&buf, lit); ok && !c.subs.counted(id) {
			c.subs.closedByRelay(id)
		}
		return
	}
	if lit, ok := wire.ParseCountReply(frame); ok {
		var buf [wire.MaxSubIDBytes]byte
		if id, ok := subID(&buf, lit); ok {
			c.subs.counted(id)
		}
		return
	}
	if lit, ok := wire.ParseNegErr(frame); ok {
		var buf [wire.MaxSubIDBytes]byte
		if id, ok := subID(&buf, lit); ok {
			c.closeSync(id)
		}
		return
	}
	if !c.g.current().watchOK {
		return
	}
	if lit, ok := wire.ParseAuthChallenge(frame); ok {
		c.auths.challenge(lit)
		return
	}
	id, accepted, duplicate, isOK := wire.ParseOK(frame)
	if !isOK {
		return
	}
	if pe, ok := c.pending.take(id); ok {
		c.g.takeInflight(c.inflightKey(pe.actor))
		if q := c.subject(c.g.current().p).Quota(); accepted && !duplicate && q != nil && (c.g.stored == nil || c.g.stored(id)) {
			c.charge(c.ctx, q, id, pe.actor)
		}
		return
	}
	if pk, ok := c.auths.answered(id); ok && accepted {
		c.authed.Store(&authState{pubkey: pk})
		c.sub.Store(c.subjectFor(c.g.current().p))
	}
}

// subject returns who pays for the connection's frames under p, the
// running policy: the pubkey's tier budget once the connection has proved a
// member pubkey, else the address's (charged nothing when the address or
// the proved pubkey is allow-listed). It is rebuilt when the policy was
// reloaded.
func (c *conn) subject(p *policy.Policy) *policy.Subject {
	if s := c.sub.Load(); s != nil && s.Policy() == p {
		return s
	}
	s := c.subjectFor(p)
	c.sub.Store(s)
	return s
}

// subjectFor builds the connection's Subject under p.
func (c *conn) subjectFor(p *policy.Policy) *policy.Subject {
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

func (c *conn) readClient() {
	for {
		c.clientRD.extend(c.client, c.g.pingInterval)
		_, r, err := c.client.NextReader()
		var buf []byte
		if err == nil {
			buf, err = readFrame(r, getFrameBuf(), c.meter)
		}
		if err != nil && c.meter.flooded.Load() {
			c.g.cutLog.info(c.g.log, "closing client", "client", c.who, "reason", "too many control frames")
			c.g.obs.ReportCut(CutControlFlood)
			c.end(true, true, closeSlowClient, "sluice: too many control frames")
			return
		}
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				code, text := relayable(ce)
				c.end(false, true, code, text)
			} else {
				// Read limit, protocol error, dead peer: gorilla has
				// already told the client what it could.
				c.end(false, true, closeGoingAway, "client connection lost")
			}
			return
		}
		fwd, ok := c.decide(buf)
		if fwd == nil || !ok {
			putFrameBuf(buf)
			if !ok {
				return
			}
			continue
		}
		if !sameBuf(fwd, buf) {
			putFrameBuf(buf)
			buf = fwd
		}
		// While the client is behind on the answers, its next request
		// waits (see outQueue.wait).
		if _, ok := c.owed.wait(c.closing, owedWait); !ok || !c.out.wait(c.closing) {
			putFrameBuf(buf)
			return
		}
		_ = c.up.SetWriteDeadline(time.Now().Add(c.g.writeTimeout))
		// A canonical frame is UTF-8 JSON: it goes as text, however it came.
		err = c.up.WriteMessage(websocket.TextMessage, buf)
		putFrameBuf(buf)
		if err != nil {
			c.end(true, false, closeGoingAway, "relay connection lost")
			return
		}
	}
}

// decide decides one client frame, buf: it returns the frame to forward
// to the relay (buf itself, or the CLOSE a refusal calls for, or nil for
// none) and whether the connection goes on (false: it has been ended).
// The caller keeps buf, and a returned CLOSE is a frame buffer of its own.
func (c *conn) decide(buf []byte) (fwd []byte, ok bool) {
	if !c.closeClosed(buf) {
		return nil, false
	}
	if c.admit(buf) {
		return buf, true
	}
	if c.knocked > 0 {
		c.g.cutLog.info(c.g.log, "closing client", "client", c.who, "reason", "too many refused frames")
		c.g.obs.ReportCut(CutKnocking)
		c.end(true, true, closeSlowClient, "sluice: too many refused frames; retry in "+strconv.FormatInt(wire.RetrySeconds(c.knocked), 10)+"s")
		return nil, false
	}
	// The client was told its subscription is closed: so is the relay, or
	// it would go on streaming to it.
	fwd, c.closeUp = c.closeUp, nil
	return fwd, true
}

// sameBuf reports whether a and b share their storage: whether decide
// returned the frame it was given.
func sameBuf(a, b []byte) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }

// toRelay sends the relay a text frame of the gate's own (a CLOSE) and
// reports whether the connection goes on.
func (c *conn) toRelay(frame []byte) bool {
	if c.tap != nil {
		c.tap.toRelay(frame)
		return true
	}
	_ = c.up.SetWriteDeadline(time.Now().Add(c.g.writeTimeout))
	if err := c.up.WriteMessage(websocket.TextMessage, frame); err != nil {
		c.end(true, false, closeGoingAway, "relay connection lost")
		return false
	}
	return true
}

// closeClosed sends the relay a CLOSE for each subscription it closed
// itself (subTable.takeClosed) before the client's next frame, frame, is
// decided, and reports whether the connection goes on. The client reader
// is the relay's only writer, so this is where the CLOSEs can go.
func (c *conn) closeClosed(frame []byte) bool {
	if c.subs.marked.Load() == 0 {
		return true
	}
	var keep []byte
	var buf [wire.MaxSubIDBytes]byte
	if f := wire.Peek(frame); f.Type == TypeREQ && f.ID != nil {
		if id, ok := subID(&buf, f.ID); ok {
			keep = id
		}
	}
	for _, id := range c.subs.takeClosed(nil, keep) {
		if !c.toRelay(closeFrame(nil, `["CLOSE","`, id)) {
			return false
		}
	}
	return true
}

// maxKeptFrameBuf is the largest read buffer kept for another frame: one
// large frame must not pin its buffer, whether it was forwarded or refused.
const maxKeptFrameBuf = 64 << 10

// frameBufs lends the client readers their frame buffers for the length of
// one frame: a connection waiting for its next frame holds none.
var frameBufs sync.Pool

func getFrameBuf() []byte {
	if b, ok := frameBufs.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, frameBufSize)
}

// frameBufSize is the size of a new frame buffer.
const frameBufSize = 4096

func putFrameBuf(b []byte) {
	if cap(b) == 0 || cap(b) > maxKeptFrameBuf {
		return
	}
	b = b[:0]
	frameBufs.Put(&b)
}

// readFrame reads a whole message into buf[:0], reusing buf's storage
// unless it is larger than maxKeptFrameBuf, and credits its payload to m
// as it arrives.
func readFrame(r io.Reader, buf []byte, m *controlMeter) ([]byte, error) {
	buf = buf[:0]
	if cap(buf) > maxKeptFrameBuf {
		buf = nil
	}
	if cap(buf) == 0 {
		buf = make([]byte, 0, frameBufSize)
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		m.credit(n)
		if err == io.EOF {
			m.credit(messageAllowance)
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// admit decides one client frame. It returns true to forward it; on a
// refusal it has queued the reply for the client (none for a CLOSE or
// NEG-CLOSE that names nothing open at the relay, which is dropped).
//
// The order keeps a refused frame cheap and a forwarded one exact: the
// type comes from Peek's bounded prefix; a client already refused for
// that type is answered from the limiter's local table before anything
// else is read; otherwise the whole frame is scanned once (wire.Scan) for
// its canonical shape and facts, charged (a REQ by its filters), and only
// then checked against the quota or, for AUTH, verified.
func (c *conn) admit(frame []byte) bool {
	p := wire.PeekType(frame)
	t := p.Type
	obs := c.g.obs
	gp := c.g.current()
	sub := c.subject(gp.p)
	free := sub.Free()
	charge := !free && sub.Charged(t)
	shadowed := false
	if charge {
		if wait, refused := sub.Refused(c.g.limiter, t); refused {
			c.refuseRateLimited(p.Frame(), wait)
			if !c.knocks.allow(time.Now()) {
				c.knocked = wait
			}
			return false
		}
	}
	var facts wire.Facts
	reason := c.g.tooLarge[t]
	if len(frame) <= c.g.frameSize[t] {
		facts, reason = wire.Scan(frame, gp.p.Bounds())
		if reason == wire.ReasonFilters {
			reason = gp.tooManyFilters
		}
	}
	if charge {
		filters, kind := 0, -1
		if reason == "" {
			filters = facts.Filters
			if t == TypeEVENT {
				kind = int(facts.Event.Kind)
			}
		}
		v := sub.Charge(c.ctx, c.g.limiter, t, filters, kind)
		switch {
		case v.Err != nil:
			fr := p.Frame()
			obs.ReportFrame(t, Unavailable)
			c.dropSub(fr)
			c.send(websocket.TextMessage, wire.AppendUnavailable(replyBuf(fr), fr))
			return false
		case v.Refused:
			// A refusal the store made is the first of its wait (the
			// rest are answered from the local table: above for the
			// type's windows, inside Charge for a kind class or an
			// aggregate, which is Local), so one log line per client,
			// budget and wait.
			if !v.Local {
				c.g.log.Info("rate-limited", "client", c.who, "type", t.String(), "limit", v.Budget, "wait", v.Wait.Round(time.Millisecond).String())
			}
			c.refuseRateLimited(p.Frame(), v.Wait)
			return false
		case v.Shadow:
			shadowed = true
			if now := time.Now(); !v.Local && !now.Before(c.shadowUntil) {
				c.shadowUntil = now.Add(v.ShadowWait)
				c.g.log.Info("would be rate-limited (shadow)", "client", c.who, "type", t.String(), "limit", v.Budget, "wait", v.ShadowWait.Round(time.Millisecond).String())
			}
		}
	}
	if reason != "" {
		// Charged (to its type, or the catch-all when that is free) but
		// not forwarded: the relay could read it otherwise than the gate
		// did (wire.Scan says how).
		if !free && !charge && !c.chargeAnswered(sub, p.Frame()) {
			return false
		}
		c.refuse(p.Frame(), reason)
		return false
	}
	// A CLOSE or NEG-CLOSE that names nothing open at the relay is
	// answered by the gate, which is to say not at all (NIP-01 and NIP-77
	// have no reply to them), and not forwarded: both types are free, so
	// forwarding every one would let a client send the relay frames
	// without end at no cost (khatru runs each on a goroutine of its own,
	// and a CLOSE takes the lock that every REQ, every connection's start
	// and end, takes).
	forward := true
	switch t {
	case TypeREQ:
		// The frame's bytes are what the relay keeps as listeners while
		// the subscription is open: held in the client's count first, so
		// that connections of one address racing each other never pass
		// the cap together.
		held := 0
		if !free {
			held = len(frame)
			if !c.g.filterBytes.holdN(c.who, held) {
				c.refuseOverCap(p.Frame(), facts.SubID, c.g.tooManyBytes)
				return false
			}
		}
		if !c.subs.open(facts.SubID[1:len(facts.SubID)-1], c.g.maxSubs, held) {
			c.g.filterBytes.release(c.who, held)
			c.refuseOverCap(p.Frame(), facts.SubID, c.g.tooManySubs)
			return false
		}
	case TypeCOUNT:
		// A COUNT runs the query of a REQ: it takes a place among the
		// connection's subscriptions until the relay answers it.
		if !c.subs.openCount(facts.SubID[1:len(facts.SubID)-1], c.g.maxSubs, time.Now()) {
			c.refuseOverCap(p.Frame(), facts.SubID, c.g.tooManySubs)
			return false
		}
	case TypeCLOSE:
		// Not open, or closing already (the gate sends the relay the
		// CLOSE that follows its answer: subTable).
		forward = c.subs.remove(facts.SubID[1 : len(facts.SubID)-1])
	case TypeNEGOPEN:
		if id := facts.SubID[1 : len(facts.SubID)-1]; !free && !c.syncs.has(id) {
			if !c.g.holdSync(c.who) {
				obs.ReportFrame(t, OverCap)
				obs.ReportRefusal(c.who, t, OverCap)
				c.send(websocket.TextMessage, wire.AppendRefusal(make([]byte, 0, 32+len(facts.SubID)+len(c.g.tooManySyncs)), p.Frame(), c.g.tooManySyncs))
				return false
			}
			c.syncs.add(id)
		}
	case TypeNEGMSG:
		// A NEG-MSG keeps a sync alive at the relay, so one for a sync
		// the gate does not count must not reach it: khatru handles each
		// frame on a goroutine of its own, and a NEG-CLOSE sent right
		// behind its NEG-OPEN is handled first (it only deletes), so the
		// sync the NEG-OPEN then stores is one the gate has freed; kept
		// alive by NEG-MSGs, any number of them stayed open. Unfed, khatru
		// drops it after 7 s. An allow-listed client's syncs are not
		// known: its NEG-MSGs all go.
		if !free && !c.syncs.has(facts.SubID[1:len(facts.SubID)-1]) {
			c.refuse(p.Frame(), reasonNoSync)
			return false
		}
	case TypeNEGCLOSE:
		// An allow-listed client's syncs are not counted, so not known:
		// its NEG-CLOSEs all go.
		forward = c.closeSync(facts.SubID[1:len(facts.SubID)-1]) || free
	case TypeEVENT:
		if q := sub.Quota(); q != nil && !free {
			ok := c.admitEvent(p.Frame(), &facts.Event, q, shadowed)
			if ok {
				c.owed.add()
			}
			return ok
		}
	case TypeAUTH:
		if gp.watchOK {
			if reason := c.verifyAuth(&facts.Event); reason != "" {
				c.refuse(p.Frame(), reason)
				return false
			}
		}
	}
	switch t {
	case TypeEVENT, TypeREQ, TypeCOUNT, TypeAUTH, TypeNEGOPEN, TypeNEGMSG:
		c.owed.add() // the relay answers each (see owed)
	}
	switch {
	case !forward:
		// A CLOSE or NEG-CLOSE naming nothing open: the gate's to answer,
		// so charged like every frame it answers.
		if !free && !charge && !c.chargeAnswered(sub, p.Frame()) {
			return false
		}
		obs.ReportFrame(t, Unmatched)
	case free:
		obs.ReportFrame(t, Allowlisted)
	case shadowed:
		obs.ReportFrame(t, Shadowed)
	default:
		obs.ReportFrame(t, Admitted)
	}
	return forward
}

// chargeAnswered charges f, a frame of a free type that the gate answers
// itself (invalid, or a CLOSE naming nothing open), to the catch-all
// budget, and reports whether it was admitted; a refusal is answered
// here. Free types are free so that closing never waits; a frame that
// closes nothing has no such claim, and the relay is not the only one
// that pays for reading it: without a charge a client could have the
// gate read and answer such frames as fast as its socket takes them. A
// refusal from the local table counts toward the knocking cut, as for
// every type.
func (c *conn) chargeAnswered(sub *policy.Subject, f Frame) bool {
	if wait, refused := sub.Refused(c.g.limiter, TypeOther); refused {
		c.refuseRateLimited(f, wait)
		if !c.knocks.allow(time.Now()) {
			c.knocked = wait
		}
		return false
	}
	v := sub.Charge(c.ctx, c.g.limiter, TypeOther, 0, -1)
	switch {
	case v.Err != nil:
		c.g.obs.ReportFrame(f.Type, Unavailable)
		c.send(websocket.TextMessage, wire.AppendUnavailable(replyBuf(f), f))
		return false
	case v.Refused:
		if !v.Local {
			c.g.log.Info("rate-limited", "client", c.who, "type", f.Type.String(), "limit", v.Budget, "wait", v.Wait.Round(time.Millisecond).String())
		}
		c.refuseRateLimited(f, v.Wait)
		return false
	}
	return true
}

// reasonNoSync answers a NEG-MSG whose id names no sync the gate counts
// open at the relay (never opened, or closed by a NEG-CLOSE or a NEG-ERR):
// NIP-77's "closed:", which a relay sends for a sync it has dropped.
const reasonNoSync = "closed: no sync open under this id; send NEG-OPEN first"

// A client refused from the limiter's local table costs the gate a peek
// and a reply, but a client that keeps knocking learns nothing new: its
// wait stays what it was told. Past knockBurst such refusals, repaid at
// knockRate a second, the connection is closed (1008) with the wait.
const (
	knockBurst = 100
	knockRate  = 10
)

// knockMeter is a token bucket of local refusals, used by the client
// reader only. The zero value is full.
type knockMeter struct {
	spent float64
	last  time.Time // monotonic
}

// allow takes one knock at now and reports whether the client is still
// within the bound.
func (k *knockMeter) allow(now time.Time) bool {
	if !k.last.IsZero() {
		k.spent = max(0, k.spent-now.Sub(k.last).Seconds()*knockRate)
	}
	k.last = now
	k.spent++
	return k.spent <= knockBurst
}

// refuseOverCap answers f (a REQ or COUNT under the id literal lit) refused
// by a cap on what the connection or its client holds open. A REQ reusing
// an open id is told CLOSED: dropSub closes it at the relay too.
func (c *conn) refuseOverCap(f Frame, lit []byte, reason string) {
	c.g.obs.ReportFrame(f.Type, OverCap)
	c.g.obs.ReportRefusal(c.who, f.Type, OverCap)
	c.dropSub(f)
	c.send(websocket.TextMessage, wire.AppendRefusal(make([]byte, 0, 32+len(lit)+len(reason)), f, reason))
}

// refuse answers f with an "invalid:" reason of the gate's own.
func (c *conn) refuse(f Frame, reason string) {
	c.g.obs.ReportFrame(f.Type, Invalid)
	c.g.obs.ReportRefusal(c.who, f.Type, Invalid)
	c.dropSub(f)
	c.send(websocket.TextMessage, wire.AppendRefusal(make([]byte, 0, 32+len(f.ID)+len(reason)), f, reason))
}

// refuseRateLimited answers f refused by a limit whose wait is wait. Like
// every refusal, it is counted before its reply is queued: queuing may wait
// for the client to read (outQueue.push), and the count is the decision's.
func (c *conn) refuseRateLimited(f Frame, wait time.Duration) {
	c.g.obs.ReportFrame(f.Type, RateLimited)
	c.g.obs.ReportRefusal(c.who, f.Type, RateLimited)
	c.dropSub(f)
	c.send(websocket.TextMessage, wire.AppendRateLimited(replyBuf(f), f, wait))
}

// dropSub is called for every refused frame, before its reply is queued:
// when it is a REQ whose id names a subscription open at the relay, or a
// NEG-OPEN or NEG-MSG whose id names a sync open there, the client is
// about to be told (CLOSED, NEG-ERR) that it is closed — from then on
// nothing the relay sends under a closed subscription reaches it
// (subTable) — so the gate closes it at the relay too
// (readClient sends the CLOSE or NEG-CLOSE). After a NEG-ERR NIP-77 has
// the sync closed, so a client need not send a NEG-CLOSE (go-nostr's does,
// others may not): without this, a refused NEG-MSG's sync would hold its
// place in the client's count until the connection ended.
func (c *conn) dropSub(f Frame) {
	if (f.Type != TypeREQ && f.Type != TypeNEGOPEN && f.Type != TypeNEGMSG) || f.ID == nil {
		return
	}
	var buf [wire.MaxSubIDBytes]byte
	id, ok := subID(&buf, f.ID)
	if !ok {
		return
	}
	label := `["CLOSE","`
	if f.Type != TypeREQ {
		if !c.closeSync(id) {
			return
		}
		label = `["NEG-CLOSE","`
	} else if !c.subs.remove(id) {
		return
	}
	c.closeUp = closeFrame(c.closeUp[:0], label, id)
}

// closeFrame appends to dst the frame that closes subscription or sync id
// (canonical: no escapes) at the relay: head is `["CLOSE","` or
// `["NEG-CLOSE","`.
func closeFrame(dst []byte, head string, id []byte) []byte {
	return append(append(append(dst, head...), id...), `"]`...)
}

// closeSync closes the sync id, if it is open, and frees its place in the
// client's count; it reports whether it was open.
func (c *conn) closeSync(id []byte) bool {
	if !c.syncs.remove(id) {
		return false
	}
	c.g.releaseSyncs(c.who, 1)
	return true
}

// replyBuf returns an empty buffer large enough for any refusal of f that
// the gate sends, so that a refused frame (a blocked client's flood is
// nothing else) costs one allocation rather than one per doubling.
func replyBuf(f Frame) []byte {
	return make([]byte, 0, 96+len(f.ID))
}

// inflightKey is what the gate counts an event in flight under (see
// MaxActorPending): its actor from this connection's client, so that
// events that name a pubkey they do not come from (the gate does not
// check signatures; khatru refuses them, in an OK that may be kept from
// the gate) hold up that pubkey only from the sender's address.
func (c *conn) inflightKey(actor string) string { return c.who + " " + actor }

// charge charges actor's quota q for event id, which the relay accepted
// (and stored, with Options.Stored), unless this connection charged it
// within the quota's window. A failed charge leaves the event uncounted:
// the relay has it already, and refusing later events for it would punish
// the actor for our outage.
func (c *conn) charge(ctx context.Context, q ratelimit.ActorQuota, id hex32, actor string) {
	now := c.g.now()
	if c.charged.seen(id, now, q.Window()) {
		return
	}
	if _, err := q.Add(ctx, actor); err != nil {
		c.g.log.Debug("quota charge failed", "client", c.who, "err", err)
	}
	c.charged.add(id, now)
}

// armSettle makes settleAged due in settleAge, unless it is already or the
// connection has ended.
func (c *conn) armSettle() {
	c.settleMu.Lock()
	defer c.settleMu.Unlock()
	if c.settling == nil && !c.ended {
		c.settling = time.AfterFunc(settleAge, c.settleAged)
	}
}

// settleAged settles the events that have awaited the relay's OK for
// settleAge or more (see settleAge), and is due again while any event
// awaits its OK.
func (c *conn) settleAged() {
	c.settleMu.Lock()
	c.settling = nil
	c.settleMu.Unlock()
	c.settleStored(settleAge)
	if c.pending.len() > 0 {
		c.armSettle()
	}
}

// settleStored charges every pending event that has awaited its OK for age
// or more and that the relay's store says it stored, taking it from the
// table and from its actor's count in flight.
func (c *conn) settleStored(age time.Duration) {
	q := c.subject(c.g.current().p).Quota()
	cut := time.Now().Add(-age)
	var due []idValue[pendingEvent]
	c.pending.takeIf(func(id hex32, pe pendingEvent) bool {
		if pe.at.After(cut) || !c.g.stored(id) {
			return false
		}
		due = append(due, idValue[pendingEvent]{id, pe})
		return true
	})
	for _, e := range due {
		c.g.takeInflight(c.inflightKey(e.v.actor))
		if q != nil {
			ctx, cancel := context.WithTimeout(context.Background(), c.g.writeTimeout)
			c.charge(ctx, q, e.id, e.v.actor)
			cancel()
		}
	}
}

// reasonPending refuses an EVENT while DefaultPending of the connection's
// are awaiting the relay's OK.
var reasonPending = fmt.Sprintf("blocked: too many events awaiting the relay's answer (at most %d); wait for an OK first", DefaultPending)

// reasonActorPending refuses an EVENT while MaxActorPending of its actor's
// are awaiting the relay's OK.
var reasonActorPending = fmt.Sprintf("blocked: too many of this pubkey's events awaiting the relay's answer (at most %d); wait for an OK first", MaxActorPending)

// settlePending charges, once the connection has ended, the events it
// forwarded whose OK the gate never saw but that the relay stored (see
// DefaultPending): with Options.Stored asking the relay's store at each of
// settleAfter, and giving up on the rest (a goroutine for at most
// settleAfter's last delay, holding the connection's pending table and
// nothing else of it); without it (behind Proxy) giving up at once on
// those drainUpstream did not see answered.
func (c *conn) settlePending() {
	c.settleMu.Lock()
	c.ended = true
	if c.settling != nil {
		c.settling.Stop()
		c.settling = nil
	}
	c.settleMu.Unlock()
	c.pending.close() // an EVENT decided meanwhile is not forwarded
	if c.pending.len() == 0 {
		return
	}
	if c.g.stored == nil {
		// Behind Proxy the relay's answers were read on after the
		// client went (drainUpstream); what is left is given up.
		c.giveUpPending()
		return
	}
	go func() {
		defer c.giveUpPending() // never seen stored (refused, or not yet)
		var waited time.Duration
		for _, d := range settleAfter {
			if d > waited {
				select {
				case <-time.After(d - waited):
				case <-c.g.stopped:
					return
				}
				waited = d
			}
			if c.settleStored(0); c.pending.len() == 0 {
				return
			}
		}
	}()
}

// giveUpPending empties the ended connection's table of events awaiting
// their OK, uncharged, and releases their actors' counts in flight.
func (c *conn) giveUpPending() {
	for _, e := range c.pending.drain() {
		c.g.takeInflight(c.inflightKey(e.v.actor))
	}
}

// admitEvent applies the actor quota to a canonical EVENT the limits
// admitted.
func (c *conn) admitEvent(f Frame, ev *wire.Event, q ratelimit.ActorQuota, shadowed bool) bool {
	actor := c.authPubkey()
	if actor == "" {
		actor = ev.Pubkey.String()
		if c.g.allowPubkey(actor) {
			// Not charged: an allow-listed author. Forging its pubkey
			// gains nothing, since the quota only counts events the
			// relay validated.
			c.g.obs.ReportFrame(f.Type, Allowlisted)
			return true
		}
	}
	over, wait, err := q.Exceeded(c.ctx, actor)
	_, again := c.pending.get(ev.ID) // sent again before its OK: counted once
	if err == nil && !over && !again {
		// Not one more without an answer past the tables (see
		// DefaultPending and MaxActorPending): an event forwarded past
		// them would be charged late or by nobody.
		reason := reasonPending
		full := !c.pending.room()
		if !full && !c.g.addInflight(c.inflightKey(actor)) {
			full, reason = true, reasonActorPending
		}
		if full {
			c.g.obs.ReportFrame(f.Type, OverCap)
			c.g.obs.ReportRefusal(c.who, f.Type, OverCap)
			c.send(websocket.TextMessage, wire.AppendRefusal(replyBuf(f), f, reason))
			return false
		}
	}
	if err != nil {
		c.g.obs.ReportFrame(f.Type, Unavailable)
		c.send(websocket.TextMessage, wire.AppendUnavailable(replyBuf(f), f))
		return false
	}
	if over {
		c.g.obs.ReportFrame(f.Type, QuotaExceeded)
		c.g.obs.ReportRefusal(c.who, f.Type, QuotaExceeded)
		c.send(websocket.TextMessage, wire.AppendRateLimited(replyBuf(f), f, wait))
		return false
	}
	if !again && !c.pending.addOpen(ev.ID, pendingEvent{actor, time.Now()}) {
		// The connection has ended (settlePending closed its table)
		// while this frame was being decided: nothing is forwarded any
		// more.
		c.g.takeInflight(c.inflightKey(actor))
		return false
	}
	if c.g.stored != nil && !again {
		c.armSettle()
	}
	if shadowed {
		c.g.obs.ReportFrame(f.Type, Shadowed)
	} else {
		c.g.obs.ReportFrame(f.Type, Admitted)
	}
	return true
}
