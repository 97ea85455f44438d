package relay

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// conn is one gated connection: a client WebSocket bridged to an upstream
// WebSocket. It runs three goroutines:
//
//   - the client reader (the HTTP handler's own goroutine) reads a frame,
//     charges it and either writes it to the upstream itself (it is the
//     upstream's only writer) or queues a refusal for the client;
//   - the client writer is the client's only writer: it drains the
//     bounded out queue and sends keepalive pings to both sides (a side
//     silent for two ping intervals is gone);
//   - the upstream reader queues every relay frame for the client without
//     ever blocking: a client too slow to keep its queue from filling is
//     disconnected, so it cannot hold up the relay.
//
// A slow relay slows only the client reader of its own connection.
type conn struct {
	g      *Gate
	client *websocket.Conn
	up     *websocket.Conn
	out    chan outFrame
	ctx    context.Context // cancelled when the connection ends
	cancel context.CancelFunc

	once    sync.Once
	wg      sync.WaitGroup
	closing chan struct{} // closed by end

	clientRD readDeadline // owned by the client reader
	upRD     readDeadline // owned by the upstream reader

	// Set before the goroutines start, read-only after.
	who    string            // the client's budget key, for logs
	keys   *[NumTypes]string // limiter keys per type, built once
	freeIP bool              // allow-listed client address: nothing charged

	pending pending // forwarded EVENTs awaiting the relay's OK (quota only)

	authMu sync.Mutex
	authID hex32  // id of the last AUTH event forwarded; guarded by authMu
	authPK string // its pubkey, until the relay answers; guarded by authMu
	// authed is what the relay accepted (NIP-42); nil before. Read on
	// every frame, written once per accepted AUTH.
	authed atomic.Pointer[authState]
}

// authState is a connection's NIP-42 identity as the relay accepted it.
type authState struct {
	pubkey string // 64 lowercase hex digits
	free   bool   // allow-listed: charged nothing
}

// readDeadline keeps a side's read deadline two ping intervals ahead,
// moving it at most once per half interval: on an in-memory pipe every
// SetReadDeadline allocates a timer. A side is thus dropped after 1.5 to 2
// intervals of silence. Used by one reader goroutine only.
type readDeadline struct{ next time.Time }

func (d *readDeadline) extend(ws *websocket.Conn, interval time.Duration) {
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
		deadline := time.Now().Add(time.Second)
		msg := websocket.FormatCloseMessage(code, text)
		if toClient {
			_ = c.client.WriteControl(websocket.CloseMessage, msg, deadline)
		}
		if toUp {
			_ = c.up.WriteControl(websocket.CloseMessage, msg, deadline)
		}
		close(c.closing)
		c.cancel()
		_ = c.client.Close()
		_ = c.up.Close()
	})
}

// run serves the connection until either side closes, then waits for its
// goroutines.
func (c *conn) run() {
	// Each reader extends its own deadline on every frame and pong (pong
	// handlers run inside the reader's own read calls).
	c.clientRD.extend(c.client, c.g.pingInterval)
	c.upRD.extend(c.up, c.g.pingInterval)
	c.client.SetPongHandler(func(string) error { c.clientRD.extend(c.client, c.g.pingInterval); return nil })
	c.up.SetPongHandler(func(string) error { c.upRD.extend(c.up, c.g.pingInterval); return nil })
	c.wg.Add(2)
	go c.writeClient()
	go c.readUpstream()
	c.readClient()
	c.wg.Wait()
}

// send queues a frame for the client. It never blocks: when the queue is
// full the client is not reading, and it is disconnected.
func (c *conn) send(typ int, data []byte) {
	select {
	case c.out <- outFrame{typ, data}:
	case <-c.closing:
	default:
		c.g.log.Info("closing slow client", "client", c.who, "queued", cap(c.out))
		c.end(true, true, closeSlowClient, "sluice: client reads too slowly")
	}
}

func (c *conn) writeClient() {
	defer c.wg.Done()
	ping := time.NewTicker(c.g.pingInterval)
	defer ping.Stop()
	for {
		select {
		case f := <-c.out:
			_ = c.client.SetWriteDeadline(time.Now().Add(c.g.writeTimeout))
			if f.typ == websocket.CloseMessage { // the relay closed: pass it on, end
				_ = c.client.WriteMessage(f.typ, f.data)
				c.end(false, false, 0, "")
				return
			}
			if err := c.client.WriteMessage(f.typ, f.data); err != nil {
				c.end(false, true, closeGoingAway, "client connection lost")
				return
			}
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

func (c *conn) readUpstream() {
	defer c.wg.Done()
	for {
		typ, data, err := c.up.ReadMessage()
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
		c.upRD.extend(c.up, c.g.pingInterval)
		if typ == websocket.TextMessage && c.g.watchOK {
			c.watch(data)
		}
		c.send(typ, data)
	}
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
// (charging the quota) or AUTH (learning the authenticated pubkey).
func (c *conn) watch(frame []byte) {
	id, accepted, duplicate, isOK := relayOK(frame)
	if !isOK {
		return
	}
	if actor, ok := c.pending.take(id); ok {
		if accepted && !duplicate {
			c.g.quota.Add(actor, c.g.now())
		}
		return
	}
	c.authMu.Lock()
	if c.authPK != "" && id == c.authID {
		if accepted {
			c.authed.Store(&authState{pubkey: c.authPK, free: c.g.allowPubkey(c.authPK)})
		}
		c.authPK = ""
	}
	c.authMu.Unlock()
}

func (c *conn) auth() (pubkey string, free bool) {
	if a := c.authed.Load(); a != nil {
		return a.pubkey, a.free
	}
	return "", false
}

func (c *conn) readClient() {
	var buf []byte
	for {
		typ, r, err := c.client.NextReader()
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
		buf, err = readFrame(r, buf)
		if err != nil {
			c.end(false, true, closeGoingAway, "client connection lost")
			return
		}
		c.clientRD.extend(c.client, c.g.pingInterval)
		if !c.admit(typ, buf) {
			continue
		}
		_ = c.up.SetWriteDeadline(time.Now().Add(c.g.writeTimeout))
		if err := c.up.WriteMessage(typ, buf); err != nil {
			c.end(true, false, closeGoingAway, "relay connection lost")
			return
		}
	}
}

// maxKeptFrameBuf is the largest read buffer a connection keeps between
// frames: one large frame must not pin its buffer for the connection's
// life, whether it was forwarded or refused.
const maxKeptFrameBuf = 64 << 10

// readFrame reads a whole message into buf[:0], reusing buf's storage
// unless it is larger than maxKeptFrameBuf.
func readFrame(r io.Reader, buf []byte) ([]byte, error) {
	buf = buf[:0]
	if cap(buf) > maxKeptFrameBuf {
		buf = nil
	}
	if cap(buf) == 0 {
		buf = make([]byte, 0, 4096)
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// admit decides one client frame. It returns true to forward it; on a
// refusal it has queued the reply for the client.
func (c *conn) admit(typ int, frame []byte) bool {
	// The type decides the charge; the id (Peek's Frame.ID) is only wanted
	// by a refusal, so it is looked for only then (f.at).
	// Binary frames are peeked too: khatru parses them as text.
	f := peeked{frame: frame}
	var shaped bool
	f.Type, f.rest, shaped = peekType(frame)
	obs := c.g.obs
	_, freeAuth := c.auth()
	free := c.freeIP || freeAuth
	if lims := c.g.limits.Message[f.Type]; len(lims) > 0 && !free {
		d, err := c.g.limiter.Allow(c.ctx, c.keys[f.Type], lims)
		if err != nil {
			fr := f.full()
			c.send(websocket.TextMessage, AppendUnavailable(replyBuf(fr), fr))
			obs.frame(f.Type, Unavailable)
			return false
		}
		if !d.Allowed {
			fr := f.full()
			c.send(websocket.TextMessage, AppendRateLimited(replyBuf(fr), fr, d.Wait))
			obs.frame(f.Type, RateLimited)
			return false
		}
	}
	if !shaped {
		// Charged (to TypeOther) but not forwarded: relays read such frames
		// differently from the gate and from each other (see peekType), and
		// khatru with negentropy on panics on some ([1,"X"]).
		fr := f.full()
		c.send(websocket.TextMessage, AppendRefusal(replyBuf(fr), fr, reasonNotNostr))
		obs.frame(f.Type, Invalid)
		return false
	}
	switch f.Type {
	case TypeEVENT:
		if c.g.quota != nil && !free {
			return c.admitEvent(f)
		}
	case TypeAUTH:
		if !c.g.watchOK {
			break
		}
		if id, pk, res := eventFields(frame); res == scanOK {
			c.authMu.Lock()
			c.authID, c.authPK = id, hexString(&pk)
			c.authMu.Unlock()
		}
	}
	if free {
		obs.frame(f.Type, Allowlisted)
	} else {
		obs.frame(f.Type, Admitted)
	}
	return true
}

// peeked is a client frame as peekType classified it, its id not yet
// looked for.
type peeked struct {
	Type  Type
	frame []byte
	rest  int // index of the second element, or -1
}

// full returns the Frame that Peek would, id included.
func (p peeked) full() Frame {
	return Frame{Type: p.Type, ID: frameID(p.Type, p.frame, p.rest)}
}

// replyBuf returns an empty buffer large enough for any refusal of f that
// the gate sends, so that a refused frame (a blocked client's flood is
// nothing else) costs one allocation rather than one per doubling.
func replyBuf(f Frame) []byte {
	return make([]byte, 0, 96+len(f.ID))
}

// admitEvent applies the actor quota to an EVENT the limits admitted.
func (c *conn) admitEvent(f peeked) bool {
	id, pk, res := eventFields(f.frame)
	if res != scanOK {
		fr := f.full()
		c.send(websocket.TextMessage, AppendRefusal(replyBuf(fr), fr, reasonUnattributable))
		c.g.obs.frame(f.Type, Invalid)
		return false
	}
	actor, _ := c.auth()
	if actor == "" {
		actor = hexString(&pk)
		if c.g.allowPubkey(actor) {
			// Not charged: an allow-listed author. Forging its pubkey
			// gains nothing, since the quota only counts events the
			// relay validated.
			c.g.obs.frame(f.Type, Allowlisted)
			return true
		}
	}
	if over, wait := c.g.quota.Exceeded(actor, c.g.now()); over {
		fr := f.full()
		c.send(websocket.TextMessage, AppendRateLimited(replyBuf(fr), fr, wait))
		c.g.obs.frame(f.Type, QuotaExceeded)
		return false
	}
	c.pending.add(id, actor)
	c.g.obs.frame(f.Type, Admitted)
	return true
}

// reasonUnattributable answers an EVENT whose id or pubkey the gate could
// not read unambiguously while the quota is on: forwarding it would let
// the relay's OK go uncharged.
const reasonUnattributable = "invalid: event must have exactly one id and one pubkey, each 64 hex digits"

// hexString renders a pubkey as the 64 lowercase hex digits the quota and
// allow-lists key on, in one allocation.
func hexString(k *hex32) string {
	var buf [64]byte
	hex.Encode(buf[:], k[:])
	return string(buf[:])
}

// reasonNotNostr answers a frame that is not shaped as a Nostr message: a
// JSON array whose first element is the label.
const reasonNotNostr = "invalid: not a Nostr message"
