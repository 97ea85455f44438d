package relay

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// bridge is a gated connection behind Proxy: the client's WebSocket
// bridged to the relay's, a socket away. It runs three goroutines:
//
//   - the client reader (the HTTP handler's own goroutine) reads a frame,
//     charges it and either writes it to the upstream itself (it is the
//     upstream's only writer) or queues a refusal for the client;
//   - the client writer is the client's only writer: it drains the
//     bounded out queue and sends keepalive pings to both sides (a side
//     silent for two ping intervals is gone);
//   - the upstream reader queues every relay frame for the client without
//     waiting (outQueue.push): a client whose backlog would pass the
//     queue's bound is cut, so the relay's writes to this connection never
//     wait for its client. A client that stops reading is cut when a write
//     to it makes no progress for the write timeout.
//
// A slow relay slows only the client reader of its own connection, and a
// slow client holds up no one: its requests wait in its own socket while
// it is behind (outQueue.wait). The cut itself never waits for the
// client's socket (meteredConn.Write).
type bridge struct {
	c      *conn
	client *websocket.Conn
	up     upConn
	out    *outQueue
	wire   *meteredConn // the client's socket, for coalescing writes
	wg     sync.WaitGroup

	clientRD readDeadline // owned by the client reader
	upRD     readDeadline // owned by the upstream reader
	// draining: the client has gone with events awaiting the relay's OK:
	// the upstream reader reads the relay's answers on for up to
	// drainAnswers before it closes the relay's side (see shut).
	draining atomic.Bool

	relayW sync.Mutex  // conn.relayW
	closer atomic.Bool // a closeOwed runs
}

// The CLOSEs the gate owes the relay go as soon as they are owed (see
// tapConn.wake for why), not before the client's next frame: the
// subscription table calls kick on each mark, which sends them from a
// goroutine of its own unless a decision or a write holds the relay's
// write side — then that one sends them as it lets go (conn.unlockRelay).
// Nothing waits on the upstream reader: a relay that stops reading slows
// only the CLOSEs, as it would the client's frames.

// kick is the subscription table's onMark behind Proxy.
func (b *bridge) kick() {
	if b.closer.CompareAndSwap(false, true) {
		go b.closeOwed()
	}
}

// closeOwed sends the relay the CLOSEs the gate owes it, unless the
// relay's write side is held (its holder sends them).
func (b *bridge) closeOwed() {
	c := b.c
	for {
		if !c.relayW.TryLock() {
			b.closer.Store(false)
			return
		}
		c.closeClosed(nil)
		c.relayW.Unlock()
		b.closer.Store(false)
		if !c.subs.closesOwed() || !b.closer.CompareAndSwap(false, true) {
			return
		}
	}
}

// send queues a frame for the client, waiting while the queue is at its
// bound (see outQueue.push), and reports whether it did: false once the
// connection is ending.
func (b *bridge) send(typ int, data []byte) bool {
	select {
	case <-b.c.closing:
		return false
	default:
	}
	if !b.out.push(outFrame{typ, data}) {
		b.cutBacklog()
		return false
	}
	return true
}

// reply implements clientSide: data queued for the client as a text frame.
func (b *bridge) reply(data []byte) bool { return b.send(websocket.TextMessage, data) }

// toRelay implements clientSide: frame written to the relay by the client
// reader, the relay's only writer.
func (b *bridge) toRelay(frame []byte) bool {
	c := b.c
	_ = b.up.SetWriteDeadline(time.Now().Add(c.g.writeTimeout))
	if err := b.up.WriteMessage(websocket.TextMessage, frame); err != nil {
		c.end(true, false, closeGoingAway, "relay connection lost")
		return false
	}
	return true
}

// shut implements clientSide: a close frame to each side asked for, both
// sockets closed, ctx cancelled; the relay's side is left open to drain
// when the client has gone with events the relay has yet to answer.
func (b *bridge) shut(toClient, toUp bool, code int, text string) {
	c := b.c
	deadline := time.Now().Add(time.Second)
	msg := websocket.FormatCloseMessage(code, text)
	if toClient {
		clientBy := deadline
		if code == closeSlowClient {
			// A client cut for its backlog has a full socket, and what
			// waits here may be the relay's reader, behind which the
			// relay's writes to every client wait: the close frame goes
			// only if it goes at once.
			clientBy = time.Now().Add(slowCloseWait)
		}
		_ = b.client.WriteControl(websocket.CloseMessage, msg, clientBy)
	}
	// The client has gone with events the relay has yet to answer,
	// perhaps held back behind a reply it would not read: the upstream
	// reader reads the answers on, charging the quota for what the relay
	// accepted, and closes the relay's side after (drainUpstream).
	drain := toUp && !toClient && c.pending.len() > 0
	if drain {
		b.draining.Store(true)
		_ = b.up.SetReadDeadline(time.Now().Add(drainAnswers))
	} else if toUp {
		if code == closeSlowClient {
			// The gate's own cut: to the relay the client has simply
			// gone. A 1008 would read as the client's protocol error
			// there (khatru logs every one as an unexpected close: a log
			// line per client cut, a flood of them under attack).
			msg = websocket.FormatCloseMessage(closeGoingAway, "sluice: client cut")
		}
		_ = b.up.WriteControl(websocket.CloseMessage, msg, deadline)
	}
	close(c.closing)
	c.cancel()
	_ = b.client.Close()
	if !drain {
		_ = b.up.Close()
	}
}

// readDeadline keeps a side's read deadline two ping intervals ahead,
// moving it at most once per half interval: every SetReadDeadline costs a
// timer update. A side is thus dropped after 1.5 to 2 intervals of
// silence. Used by one reader goroutine only.
type readDeadline struct{ next time.Time }

func (d *readDeadline) extend(ws interface{ SetReadDeadline(time.Time) error }, interval time.Duration) {
	now := time.Now()
	if now.Before(d.next) {
		return
	}
	d.next = now.Add(interval / 2)
	_ = ws.SetReadDeadline(now.Add(2 * interval))
}

// outFrame is a frame queued for the client.
type outFrame struct {
	typ  int
	data []byte
}

// run serves the connection until either side closes, then waits for its
// goroutines.
func (b *bridge) run() {
	c := b.c
	// Each reader extends its own deadline before every read and on every
	// pong (pong handlers run inside the reader's own read calls): before
	// the read rather than after the last frame, so that the time a frame
	// took to handle — a wait for room in the queue included — never counts
	// as silence.
	b.client.SetPongHandler(func(string) error { b.clientRD.extend(b.client, c.g.pingInterval); return nil })
	b.up.SetPongHandler(func(string) error { b.upRD.extend(b.up, c.g.pingInterval); return nil })
	b.wg.Add(2)
	go b.writeClient()
	go b.readUpstream()
	b.readClient()
	b.wg.Wait()
	_ = b.up.Close() // if the upstream reader ended before it could drain (see shut)
}

// readClient is the client reader: each frame read, decided (conn.decide)
// and forwarded to the relay by this goroutine, the relay's only writer.
func (b *bridge) readClient() {
	c := b.c
	for {
		b.clientRD.extend(b.client, c.g.pingInterval)
		_, r, err := b.client.NextReader()
		var buf []byte
		if err == nil {
			buf, err = readFrame(r, getFrameBuf(), c.meter)
		}
		if err != nil && c.meter.flooded.Load() {
			c.g.cutLog.info(c.g.log, "closing client", "client", c.who, "reason", "too many control frames")
			c.g.obs.ReportCut("control_flood")
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
		fwd, ok, _ := c.decideHeld(buf)
		if fwd == nil || !ok {
			putFrameBuf(buf)
			if !ok {
				return
			}
			if c.unsent != nil { // set by this goroutine only (admit)
				c.lockRelay()
				c.unsent = nil
				c.unlockRelay()
			}
			continue
		}
		if !sameBuf(fwd, buf) {
			putFrameBuf(buf)
			buf = fwd
		}
		// While the client is behind on the answers, its next request
		// waits (see outQueue.wait).
		if _, ok := c.owed.wait(c.closing, owedWait, nil); !ok || !b.out.wait(c.closing) {
			putFrameBuf(buf)
			return
		}
		c.lockRelay()
		_ = b.up.SetWriteDeadline(time.Now().Add(c.g.writeTimeout))
		// A canonical frame is UTF-8 JSON: it goes as text, however it came.
		err = b.up.WriteMessage(websocket.TextMessage, buf)
		c.unsent = nil
		if err == nil {
			c.unlockRelay()
		} else {
			c.relayW.Unlock()
		}
		putFrameBuf(buf)
		if err != nil {
			c.end(true, false, closeGoingAway, "relay connection lost")
			return
		}
	}
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

// readUpstream is the upstream reader: each relay frame watched
// (conn.watch) and queued for the client unless a closed subscription must
// not deliver it (conn.delivers).
func (b *bridge) readUpstream() {
	defer b.wg.Done()
	c := b.c
	for {
		if !b.draining.Load() { // draining: shut set the last deadline
			b.upRD.extend(b.up, c.g.pingInterval)
		}
		typ, data, err := b.up.ReadMessage()
		if err != nil && b.draining.Load() {
			b.endUp()
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
			b.send(websocket.CloseMessage, websocket.FormatCloseMessage(code, text))
			return
		}
		counted := false
		if typ == websocket.TextMessage {
			c.watch(data)
			closed, pass := c.readOut(data)
			if !pass {
				if closed == nil {
					continue
				}
				data = closed // the read budget is spent: readmeter.go
			}
			counted = pass
		}
		// Looked at and queued under order: a reply that tells the client
		// a subscription is closed is queued after every frame under it
		// that was let through (subTable).
		sent := true
		c.subs.order.Lock()
		if c.delivers(data) {
			sent = b.send(typ, data)
		} else if counted {
			c.readUntake(len(data)) // closed for the client since readOut
		}
		c.subs.order.Unlock()
		if !sent {
			if b.draining.Load() {
				b.drainUpstream()
			}
			return
		}
	}
}

// drainUpstream reads the relay's frames after the client has gone,
// discarding them but for the OKs of the events it left awaiting one
// (watch charges the quota for those the relay accepted), until none is
// left, drainAnswers has passed since the client went (shut set the read
// deadline) or the gate shuts down; then it closes the relay's side.
// Behind Proxy there is no store to ask (see Options.Stored), and the
// relay's answers are what says which events it took: a client that kept
// them from the gate behind a reply it did not read, and hung up, would
// otherwise have published past its quota for nothing. Charging the events
// as if stored instead would let anyone spend a pubkey's quota with its
// public events sent again and hung up on.
func (b *bridge) drainUpstream() {
	defer b.endUp()
	c := b.c
	for c.pending.len() > 0 {
		select {
		case <-c.g.stopped:
			return
		default:
		}
		typ, data, err := b.up.ReadMessage()
		if err != nil {
			return
		}
		if typ == websocket.TextMessage {
			c.watch(data)
		}
	}
}

// drainAnswers is how long, after a client went with events the relay had
// yet to answer, the gate reads the relay's answers on (behind Proxy).
const drainAnswers = 2 * time.Second

// endUp ends the relay's side after a drain: the client has gone.
func (b *bridge) endUp() {
	msg := websocket.FormatCloseMessage(closeGoingAway, "client connection lost")
	_ = b.up.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
	_ = b.up.Close()
}

// writeClient is the client writer, the client's only writer: the queue
// drained, and both sides pinged every ping interval.
func (b *bridge) writeClient() {
	defer b.wg.Done()
	c := b.c
	ping := time.NewTicker(c.g.pingInterval)
	defer ping.Stop()
	var spare []outFrame
	for {
		select {
		case <-b.out.ready:
			frames := b.out.take(spare)
			if !b.writeFrames(frames) {
				return
			}
			b.out.wrote()
			clear(frames) // drop the payloads; keep the slice
			spare = frames
		case <-ping.C:
			deadline := time.Now().Add(c.g.writeTimeout)
			if err := b.client.WriteControl(websocket.PingMessage, nil, deadline); err != nil {
				c.end(false, true, closeGoingAway, "client connection lost")
				return
			}
			// The relay is pinged too: a relay gone without a FIN would
			// otherwise hold this connection until a write to it failed.
			// A relay that cannot take a ping within half an interval is
			// not reading; the short deadline keeps it from stalling the
			// client's writes and pings.
			if err := b.up.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.g.pingInterval/2)); err != nil {
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
func (b *bridge) writeFrames(frames []outFrame) bool {
	c := b.c
	b.wire.coalesce(true)
	for _, f := range frames {
		if f.typ == websocket.CloseMessage { // the relay closed: pass it on, end
			_ = b.client.WriteMessage(f.typ, f.data)
			_ = b.wire.coalesce(false)
			c.end(false, false, 0, "")
			return false
		}
		if err := b.client.WriteMessage(f.typ, f.data); err != nil {
			b.writeFailed(err)
			return false
		}
	}
	if err := b.wire.coalesce(false); err != nil {
		b.writeFailed(err)
		return false
	}
	return true
}

// writeFailed ends the connection after a failed write to the client: cut
// as a slow reader when the write timed out, gone otherwise.
func (b *bridge) writeFailed(err error) {
	c := b.c
	if isTimeout(err) {
		b.cutSlow()
		return
	}
	c.end(false, true, closeGoingAway, "client connection lost")
}

// slowCloseWait is how long a slow client's close frame may wait for its
// socket: long enough for a socket with room, far too short to hold up the
// relay.
const slowCloseWait = 10 * time.Millisecond

// cutBacklog ends a connection whose client is further behind than the
// queue's bound (Options.QueueBytes), however recently it read.
func (b *bridge) cutBacklog() {
	c := b.c
	c.g.cutLog.info(c.g.log, "closing slow client", "client", c.who, "reason", "backlog over the queue bound", "queued_bytes", b.out.queued())
	c.g.obs.ReportCut("slow_reader")
	c.end(true, true, closeSlowClient, "sluice: client reads too slowly")
}

// cutSlow ends a connection whose client took nothing of a write for the
// write timeout: it has stopped reading.
func (b *bridge) cutSlow() {
	c := b.c
	c.g.cutLog.info(c.g.log, "closing slow client", "client", c.who, "queued_bytes", b.out.queued())
	c.g.obs.ReportCut("slow_reader")
	c.end(true, true, closeSlowClient, "sluice: client reads too slowly")
}
