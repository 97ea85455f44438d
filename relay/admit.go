package relay

import (
	"fmt"
	"strconv"
	"time"
	"unsafe"

	"github.com/sluice-relay/sluice/relay/internal/charge"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// This file holds the decision on each client frame, the same in both
// modes: the CLOSEs owed to the relay first (closeClosed), then the
// frame's limits, shape, caps and quota (admit), and the gate's replies to
// what it refuses.

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
		c.g.obs.ReportCut("knocking")
		wait := c.knocked
		if c.violation(pointsKnocking) {
			wait = max(wait, c.banned)
		}
		c.end(true, true, closeSlowClient, "sluice: too many refused frames; retry in "+strconv.FormatInt(scan.RetrySeconds(wait), 10)+"s")
		return nil, false
	}
	if c.banned > 0 {
		c.endBanned()
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

// closeClosed sends the relay a CLOSE for each subscription marked closed
// (subTable.takeClosed) — before the client's frame, frame, is decided,
// or between frames with frame nil, as soon as one is owed
// (tapConn.sendClosed, bridge.closeOwed) — and reports whether the
// connection goes on. It runs where the relay's writer is: the client
// reader in relay mode, the holder of relayW behind Proxy.
func (c *conn) closeClosed(frame []byte) bool {
	if c.subs.marked.Load() == 0 {
		return true
	}
	var keep []byte
	var buf [wire.MaxSubIDBytes]byte
	if f := scan.Peek(frame).Frame(); f.Type == wire.TypeREQ && f.ID != nil {
		if id, ok := subID(&buf, f.ID); ok {
			keep = id
		}
	}
	for _, id := range c.subs.takeClosed(nil, keep, c.unsent) {
		if !c.side.toRelay(closeFrame(nil, `["CLOSE","`, id)) {
			return false
		}
	}
	return true
}

// lockRelay takes the relay's write side behind Proxy (conn.relayW).
func (c *conn) lockRelay() {
	if c.relayW != nil {
		c.relayW.Lock()
	}
}

// unlockRelay lets go of the relay's write side, first sending the CLOSEs
// owed meanwhile but that of a REQ decided and not yet written (unsent),
// which follows the REQ. One owed after it goes from the subscription
// table's onMark.
func (c *conn) unlockRelay() {
	if c.relayW == nil {
		return
	}
	c.closeClosed(nil)
	c.relayW.Unlock()
	if c.subs.closesOwed() && c.subs.onMark != nil {
		c.subs.onMark()
	}
}

// admit decides one client frame. It returns true to forward it; on a
// refusal it has queued the reply for the client (none for a CLOSE or
// NEG-CLOSE that names nothing open at the relay, which is dropped).
//
// The order keeps a refused frame cheap and a forwarded one exact: the
// type comes from Peek's bounded prefix; a client already refused for
// that type is answered from the limiter's local table before anything
// else is read; otherwise the whole frame is scanned once (scan.Scan) for
// its canonical shape and facts, and charged: a REQ by its filters, a
// canonical EVENT by the EVENT rule (its windows, then the actor quota);
// an AUTH is then verified.
func (c *conn) admit(frame []byte) bool {
	p := scan.Peek(frame)
	t := p.Type
	obs := c.g.obs
	gp := c.g.current()
	sub := c.subject(gp.p)
	free := sub.Free()
	paid := !free && sub.Charged(t)
	if paid {
		if wait, refused := sub.Refused(c.g.limiter, t); refused {
			if c.shape(t, frame, wait) {
				return false
			}
			c.refuseRateLimited(p.Frame(), wait)
			if !c.knocks.allow(time.Now()) {
				c.knocked = wait
			}
			return false
		}
	}
	if !free && c.readRefused(p.Frame()) {
		return false
	}
	var facts scan.Facts
	reason := c.g.tooLarge[t]
	if len(frame) <= c.g.frameSize[t] {
		facts, reason = scan.Scan(frame, gp.p.Bounds())
		if reason == scan.ReasonFilters {
			reason = gp.tooManyFilters
		}
	}
	// A canonical COUNT or NEG-OPEN of a NIP the relay does not do is
	// answered by the gate (refuseUnsupported), charged as one filter.
	unsupported := ""
	if reason == "" && c.g.supports != nil {
		switch {
		case t == wire.TypeCOUNT && !c.g.supports(45):
			unsupported = reasonNoCount
		case t == wire.TypeNEGOPEN && !c.g.supports(77):
			unsupported = reasonNoSyncs
		}
	}
	// A canonical EVENT is decided by the EVENT rule (charge.Subject.Event:
	// its windows, then the actor quota); actor is who the quota charges
	// on the relay's OK, "" for nobody.
	event := t == wire.TypeEVENT && reason == "" && !free
	actor := ""
	shadowed := false
	if paid || event {
		var v charge.Verdict
		if event {
			v, actor = sub.Event(c.ctx, c.g.limiter, int(facts.Event.Kind), c.authPubkey(), &facts.Event.Pubkey)
		} else {
			filters := 0
			if reason == "" && unsupported == "" {
				filters = c.price(gp.p, t, &facts, frame)
			}
			v = sub.Charge(c.ctx, c.g.limiter, t, filters, -1)
		}
		switch {
		case v.Err != nil:
			fr := p.Frame()
			obs.ReportFrame(c.who, t, policy.Unavailable)
			c.dropSub(fr)
			c.side.reply(scan.AppendRefusal(replyBuf(fr), fr, scan.ReasonUnavailable))
			return false
		case v.Refused && v.Quota:
			fr := p.Frame()
			obs.ReportFrame(c.who, t, policy.QuotaExceeded)
			c.side.reply(scan.AppendRefusal(replyBuf(fr), fr, charge.QuotaReason(sub.Quota(), v.Wait)))
			return false
		case v.Refused:
			if c.shape(t, frame, v.Wait) {
				return false
			}
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
			c.shadowShape(t, v.ShadowWait)
			if now := time.Now(); !v.Local && !now.Before(c.shadowUntil) {
				c.shadowUntil = now.Add(v.ShadowWait)
				c.g.log.Info("would be rate-limited (shadow)", "client", c.who, "type", t.String(), "limit", v.Budget, "wait", v.ShadowWait.Round(time.Millisecond).String())
			}
		}
		if v.Allowlisted {
			// An allow-listed author: exempt from the quota, nothing to
			// settle.
			c.owed.add()
			obs.ReportFrame(c.who, t, policy.Allowlisted)
			return true
		}
	}
	if reason != "" {
		// Charged (to its type, or the catch-all when that is free) but
		// not forwarded: the relay could read it otherwise than the gate
		// did (scan.Scan says how).
		if !free && !paid && !c.chargeAnswered(sub, p.Frame()) {
			return false
		}
		c.refuse(p.Frame(), reason)
		return false
	}
	if unsupported != "" {
		if !free && !paid && !c.chargeAnswered(sub, p.Frame()) {
			return false
		}
		c.refuseUnsupported(p.Frame(), unsupported)
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
	case wire.TypeREQ:
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
		if !c.subs.open(facts.SubID[1:len(facts.SubID)-1], c.g.maxSubs, held, time.Now()) {
			c.g.filterBytes.release(c.who, held)
			c.refuseOverCap(p.Frame(), facts.SubID, c.g.tooManySubs)
			return false
		}
		if c.relayW != nil {
			// Behind Proxy the REQ is written after the client's backlog
			// waits (readClient): until then its id's CLOSE waits too
			// (takeClosed's skip).
			c.unsent = append(c.unsentBuf[:0], facts.SubID[1:len(facts.SubID)-1]...)
		}
		c.armSubs() // gives it up if the relay never answers (reqHold)
	case wire.TypeCOUNT:
		// A COUNT runs the query of a REQ: it takes a place among the
		// connection's subscriptions until the relay answers it.
		if !c.subs.openCount(facts.SubID[1:len(facts.SubID)-1], c.g.maxSubs, time.Now()) {
			c.refuseOverCap(p.Frame(), facts.SubID, c.g.tooManySubs)
			return false
		}
		c.armSubs() // gives it up if the relay never answers (countHold)
	case wire.TypeCLOSE:
		// Not open, or closing already (the gate sends the relay the
		// CLOSE that follows its answer: subTable).
		forward = c.subs.remove(facts.SubID[1 : len(facts.SubID)-1])
	case wire.TypeNEGOPEN:
		if id := facts.SubID[1 : len(facts.SubID)-1]; !free && !c.syncs.has(id) {
			if !c.g.holdSync(c.who) {
				obs.ReportFrame(c.who, t, policy.OverCap)
				c.side.reply(scan.AppendRefusal(make([]byte, 0, 32+len(facts.SubID)+len(c.g.tooManySyncs)), p.Frame(), c.g.tooManySyncs))
				return false
			}
			c.syncs.add(id)
		}
	case wire.TypeNEGMSG:
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
	case wire.TypeNEGCLOSE:
		// An allow-listed client's syncs are not counted, so not known:
		// its NEG-CLOSEs all go.
		forward = c.closeSync(facts.SubID[1:len(facts.SubID)-1]) || free
	case wire.TypeEVENT:
		if actor != "" && c.g.verifySigs && !validSig(&facts.Event) {
			c.refuse(p.Frame(), reasonSig)
			return false
		}
		if actor != "" {
			ok := c.admitEvent(p.Frame(), &facts.Event, actor, shadowed)
			if ok {
				c.owed.add()
			}
			return ok
		}
	case wire.TypeAUTH:
		if c.gateAuth {
			// The gate's own challenge: answered here, never forwarded.
			if reason := c.verifyAuth(&facts.Event); reason != "" {
				c.refuse(p.Frame(), reason)
				return false
			}
			if pk, ok := c.auths.answered(facts.Event.ID); ok {
				c.bind(pk)
			}
			obs.ReportFrame(c.who, t, policy.Admitted)
			c.side.reply(append(append(append(replyBuf(p.Frame()), `["OK","`...), facts.Event.ID.String()...), `",true,""]`...))
			return false
		}
		if gp.watchOK {
			if reason := c.verifyAuth(&facts.Event); reason != "" {
				c.refuse(p.Frame(), reason)
				return false
			}
		}
	}
	switch t {
	case wire.TypeEVENT, wire.TypeREQ, wire.TypeCOUNT, wire.TypeAUTH, wire.TypeNEGOPEN, wire.TypeNEGMSG:
		c.owed.add() // the relay answers each (see owed)
	}
	switch {
	case !forward:
		// A CLOSE or NEG-CLOSE naming nothing open: the gate's to answer,
		// so charged like every frame it answers.
		if !free && !paid && !c.chargeAnswered(sub, p.Frame()) {
			return false
		}
		obs.ReportFrame(c.who, t, policy.Unmatched)
	case free:
		obs.ReportFrame(c.who, t, policy.Allowlisted)
	case shadowed:
		obs.ReportFrame(c.who, t, policy.Shadowed)
	default:
		obs.ReportFrame(c.who, t, policy.Admitted)
	}
	return forward
}

// admitEvent forwards a canonical EVENT that the EVENT rule admitted
// (charge.Subject.Event) and whose actor the quota will charge on the
// relay's OK: it holds a place for it in the tables of events awaiting
// their OK, or refuses it when they are full.
func (c *conn) admitEvent(f scan.Frame, ev *scan.Event, actor string, shadowed bool) bool {
	_, again := c.pending.get(ev.ID) // sent again before its OK: counted once
	if !again {
		// Not one more without an answer past the tables (see
		// maxPending and maxActorPending): an event forwarded past
		// them would be charged late or by nobody.
		reason := reasonPending
		full := !c.pending.room()
		if !full && !c.g.addInflight(c.inflightKey(actor)) {
			full, reason = true, reasonActorPending
		}
		if full {
			c.g.obs.ReportFrame(c.who, f.Type, policy.OverCap)
			c.side.reply(scan.AppendRefusal(replyBuf(f), f, reason))
			return false
		}
		if !c.pending.addOpen(ev.ID, pendingEvent{actor: actor, at: time.Now(), created: ev.CreatedAt}) {
			// The connection has ended (settlePending closed its table)
			// while this frame was being decided: nothing is forwarded
			// any more.
			c.g.takeInflight(c.inflightKey(actor))
			return false
		}
		c.armSettle() // settles or gives it up if no OK names it (pendingHold)
	}
	if shadowed {
		c.g.obs.ReportFrame(c.who, f.Type, policy.Shadowed)
	} else {
		c.g.obs.ReportFrame(c.who, f.Type, policy.Admitted)
	}
	return true
}

// reasonPending refuses an EVENT while maxPending of the connection's
// are awaiting the relay's OK.
var reasonPending = fmt.Sprintf("blocked: too many events awaiting the relay's answer (at most %d); wait for an OK first", maxPending)

// reasonActorPending refuses an EVENT while maxActorPending of its actor's
// are awaiting the relay's OK.
var reasonActorPending = fmt.Sprintf("blocked: too many of this pubkey's events awaiting the relay's answer (at most %d); wait for an OK first", maxActorPending)

// chargeAnswered charges f, a frame of a free type that the gate answers
// itself (invalid, or a CLOSE naming nothing open), to the catch-all
// budget, and reports whether it was admitted; a refusal is answered
// here. Free types are free so that closing never waits; a frame that
// closes nothing has no such claim, and the relay is not the only one
// that pays for reading it: without a charge a client could have the
// gate read and answer such frames as fast as its socket takes them. A
// refusal from the local table counts toward the knocking cut, as for
// every type.
func (c *conn) chargeAnswered(sub *charge.Subject, f scan.Frame) bool {
	if wait, refused := sub.Refused(c.g.limiter, wire.TypeOther); refused {
		c.refuseRateLimited(f, wait)
		if !c.knocks.allow(time.Now()) {
			c.knocked = wait
		}
		return false
	}
	v := sub.Charge(c.ctx, c.g.limiter, wire.TypeOther, 0, -1)
	switch {
	case v.Err != nil:
		c.g.obs.ReportFrame(c.who, f.Type, policy.Unavailable)
		c.side.reply(scan.AppendRefusal(replyBuf(f), f, scan.ReasonUnavailable))
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
func (c *conn) refuseOverCap(f scan.Frame, lit []byte, reason string) {
	c.g.obs.ReportFrame(c.who, f.Type, policy.OverCap)
	c.dropSub(f)
	c.side.reply(scan.AppendRefusal(make([]byte, 0, 32+len(lit)+len(reason)), f, reason))
}

// Replies to a COUNT or NEG-OPEN of a NIP the relay does not do
// (Options.Supports), in NIP-01's prefix-and-message form: a client
// learns at once to fall back (a REQ for what it would have counted or
// synced) instead of waiting for an answer such a relay may never send.
const (
	reasonNoCount = "unsupported: this relay does not do COUNT (NIP-45)"
	reasonNoSyncs = "unsupported: this relay does not do negentropy syncs (NIP-77)"
)

// refuseUnsupported answers f, a COUNT or NEG-OPEN of a NIP the relay does
// not do, with reason (CLOSED or NEG-ERR). The client asked nothing wrong:
// it is not reported as an offender nor counted in the penalty box.
func (c *conn) refuseUnsupported(f scan.Frame, reason string) {
	c.g.obs.ReportFrame("", f.Type, policy.Invalid) // no client: not its doing
	c.dropSub(f)
	c.side.reply(scan.AppendRefusal(make([]byte, 0, 32+len(f.ID)+len(reason)), f, reason))
}

// refuse answers f with an "invalid:" reason of the gate's own, and
// counts it in the penalty box (the caller's decide ends the connection
// if that bans the client).
func (c *conn) refuse(f scan.Frame, reason string) {
	c.g.obs.ReportFrame(c.who, f.Type, policy.Invalid)
	c.dropSub(f)
	c.side.reply(scan.AppendRefusal(make([]byte, 0, 32+len(f.ID)+len(reason)), f, reason))
	points := pointsInvalid
	if f.Type == wire.TypeAUTH {
		points = pointsAuth
	}
	c.violation(points)
}

// refuseRateLimited answers f refused by a limit whose wait is wait. Like
// every refusal, it is counted before its reply is queued: queuing may wait
// for the client to read (outQueue.push), and the count is the decision's.
func (c *conn) refuseRateLimited(f scan.Frame, wait time.Duration) {
	c.g.obs.ReportFrame(c.who, f.Type, policy.RateLimited)
	c.dropSub(f)
	c.side.reply(scan.AppendRateLimited(replyBuf(f), f, wait))
}

// dropSub is called for every refused frame, before its reply is queued:
// when it is a REQ whose id names a subscription open at the relay, or a
// NEG-OPEN or NEG-MSG whose id names a sync open there, the client is
// about to be told (CLOSED, NEG-ERR) that it is closed — from then on
// nothing the relay sends under a closed subscription reaches it
// (subTable) — so the gate closes it at the relay too
// (the client reader sends the CLOSE or NEG-CLOSE). After a NEG-ERR NIP-77 has
// the sync closed, so a client need not send a NEG-CLOSE (go-nostr's does,
// others may not): without this, a refused NEG-MSG's sync would hold its
// place in the client's count until the connection ended.
func (c *conn) dropSub(f scan.Frame) {
	if (f.Type != wire.TypeREQ && f.Type != wire.TypeNEGOPEN && f.Type != wire.TypeNEGMSG) || f.ID == nil {
		return
	}
	var buf [wire.MaxSubIDBytes]byte
	id, ok := subID(&buf, f.ID)
	if !ok {
		return
	}
	label := `["CLOSE","`
	if f.Type != wire.TypeREQ {
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
func replyBuf(f scan.Frame) []byte {
	return make([]byte, 0, 96+len(f.ID))
}
