package relay

import (
	"errors"
	"io"
	"time"

	"github.com/gorilla/websocket"
)

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

// drainAnswers is how long, after a client went with events the relay had
// yet to answer, the gate reads the relay's answers on (behind Proxy).
const drainAnswers = 2 * time.Second

// endUp ends the relay's side after a drain: the client has gone.
func (c *conn) endUp() {
	msg := websocket.FormatCloseMessage(closeGoingAway, "client connection lost")
	_ = c.up.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
	_ = c.up.Close()
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
