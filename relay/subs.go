package relay

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/wire"
)

// defaultMaxSubscriptions caps the subscriptions one connection holds open
// at the relay (NIP-11's max_subscriptions; NIP-11's example document and
// nostr.land's, quoted there, give 20). Clients keep one open per feed,
// thread or profile they show, and close them as the view changes: tens at
// most on one relay. 50 leaves them room over 20 and keeps what one
// connection makes a relay hold (a listener and its filters per
// subscription) small.
const defaultMaxSubscriptions = 50

// defaultMaxConnections caps the connections one client (an IPv4 address,
// an IPv6 prefix) holds open at once, in one gate process. A household or
// office behind one NAT runs a few clients with a connection to this relay
// each; 64 leaves a large NAT room while thousands of idle sockets from
// one address, each a connection's memory on the relay's side, are out of
// reach.
const defaultMaxConnections = 64

// defaultMaxFilterBytes caps the bytes of REQs one client (an IPv4
// address, an IPv6 prefix) holds open at the relay across its
// connections (Options.MaxFilterBytes). The relay keeps each open filter
// parsed (khatru: several times its JSON size) and matches every new
// event against every one of them before it answers the publisher, so
// this bounds both what one address makes it hold and what it adds to
// every honest publish (docs/RELIABILITY.md, "What one address may hold
// open"). 512 KiB
// holds eight REQs at the REQ frame bound (a follow feed of ~900 authors
// each), more than a client keeps open on one relay.
const defaultMaxFilterBytes = 512 << 10

// subTable is what a connection may still hold open at the relay: a place
// for every REQ forwarded, under its id, since that id was last closed by
// a forwarded CLOSE. Ids are canonical (scan.Scan: no escapes), so the
// bytes between a literal's quotes are the id. Safe for concurrent use
// (the client reader opens and closes, the relay reader marks).
//
// A REQ reusing an open id takes a place of its own: khatru does not
// replace the subscription, it adds the REQ's filters as more listeners
// under the same id (a CLOSE removes them all). A relay that does replace
// is thus over-counted, never under: a client that reuses one id up to the
// cap without closing it is refused there, and that id is closed at both
// ends.
//
// The relay's CLOSED does not free places by itself: khatru answers a REQ
// with CLOSED when a RejectFilter hook refuses one of its filters, and
// keeps the listeners of the filters before it. It marks the id instead;
// the gate sends the relay a CLOSE for it as soon as it is marked (onMark,
// takeClosed), and only that frees its places.
//
// Nor does a CLOSE that reaches the relay before the relay has answered
// every REQ under its id (EOSE or CLOSED): khatru adds a filter's listener
// only once that filter's stored events are sent, on a goroutine of the
// REQ's own, so a CLOSE handled in the meantime finds nothing to remove
// and the listeners added after it stay until the connection ends. The
// gate forwards such a CLOSE (it removes what is there already and ends
// the query) but keeps the id's places, marked closing; the relay's last
// answer under the id marks it closed, and the CLOSE the gate then sends
// (takeClosed) frees them. A REQ that the relay never answers, closing or
// not, is given up after reqHold (expire).
//
// Closing an id for the client does not stop the relay at once: the
// relay handles the CLOSE when it gets to it (khatru on a goroutine of its
// own per frame, while another connection's event is being written to the
// id's listeners), and leftover listeners stream on until the gate's CLOSE
// (above). So the table also remembers the last maxGone ids closed for the
// client — by its CLOSE, by a refusal of a REQ under an open id (the
// gate's CLOSED) or by the relay's CLOSED — and the relay's EVENT and
// EOSE under them are not passed on (conn.delivers) until a REQ under the
// id is forwarded again: a client told that s is closed hears nothing more
// of s. An id pushed out of the last maxGone is forgotten; what the relay
// still sends under it then is the client's own doing (it closed maxGone
// others since) and reaches only it.
type subTable struct {
	// order is held by a relay reader (Proxy's) from its look at gone to
	// the frame's place in the client's queue, and by every change to
	// gone: a reply queued after an id is gone follows every frame under
	// it that was let through. (Wrap's tap looks under its write lock,
	// which the gate's replies take too.)
	order  sync.Mutex
	mu     sync.Mutex
	ids    map[string]subEntry
	places int          // the sum of the entries' places
	marked atomic.Int32 // entries closed by the relay, not yet CLOSEd

	gone  [maxGone]string // ids closed for the client, gone[:nGone], oldest first
	nGone atomic.Int32

	// counting holds the COUNTs forwarded and not yet answered, by id
	// (see openCount); each takes a place while it runs.
	counting map[string]countEntry

	// awaiting is the sum of the entries' unanswered REQs: while it is 0
	// the relay reader does not look up the ids of the EVENTs it passes
	// (heard).
	awaiting atomic.Int32

	// onMark, when set, is called (with s.mu held) each time an entry is
	// marked closed, for the gate to send the relay its CLOSE now rather
	// than before the client's next frame (tapConn.wake, bridge.kick). It
	// must not call back into the table.
	onMark func()

	// release, when set, gives the bytes of freed entries (the REQ
	// frames whose filters the relay held as listeners) back to the
	// client's count across its connections (Gate.filterBytes); it is
	// called with s.mu held and must not call back into the table.
	release func(n int)
}

// countEntry is the COUNTs running under one id.
type countEntry struct {
	n    int       // forwarded and unanswered
	last time.Time // when the latest was forwarded
}

// countHold is how long a COUNT keeps its place without an answer: a
// relay that does not speak NIP-45 may answer with a NOTICE or nothing,
// and the place must come back. A relay still counting after it has its
// work bounded by the filter bounds the gate checked before forwarding.
// The COUNTs under an id unanswered that long are given up (expire): the
// place comes back, and the client is told CLOSED (reasonUnanswered).
const countHold = 30 * time.Second

// reqHold is how long the relay may say nothing under a REQ's id (no
// EVENT, EOSE or CLOSED) before the REQ is taken as closed by the relay: a
// relay that refuses a REQ with a NOTICE, or not at all, holds nothing for
// it, its place must come back, and the client, waiting for an EOSE that
// will not come, must be told. So an id whose REQs are all unanswered and
// under which the relay has sent nothing for reqHold since the latest of
// them (expire, on a timer of the connection's: conn.armSubs) has its
// places freed, the client is told CLOSED (reasonUnanswered), and the gate
// sends the relay a CLOSE for it before the client's next frame, so what
// the count holds is what the relay may hold. A relay still sending the
// stored events of a large query keeps it open: every EVENT under the id
// counts as an answer in progress (heard).
const reqHold = 30 * time.Second

// reasonUnanswered is the CLOSED that tells a client the relay left its
// REQ or COUNT unanswered for reqHold (countHold): an error on the relay's
// side, not the client's.
const reasonUnanswered = "error: the relay did not answer this subscription in 30s"

// maxGone is how many ids closed for the client a connection remembers
// (subTable): a relay handles a CLOSE in well under the time a client
// takes to close this many more.
const maxGone = 16

type subEntry struct {
	bytes      int       // the bytes of those REQs (their filters, as the relay holds them)
	places     int       // REQs forwarded under the id since its last CLOSE
	unanswered int       // of those, the ones the relay has not answered (EOSE, CLOSED)
	closing    bool      // the client closed it before the relay answered them all
	closed     bool      // the relay said CLOSED, or answered a closing id; the gate has not sent CLOSE yet
	last       time.Time // when the latest REQ under the id was forwarded, or the relay last sent an EVENT under it
}

// open takes a place for a REQ of n bytes under id unless limit are
// taken, and reports whether it did. The n bytes are the caller's, held
// in the client's count already: they are the table's once open returns
// true, and stay the caller's otherwise.
func (s *subTable) open(id []byte, limit, n int, now time.Time) bool {
	s.order.Lock()
	defer s.order.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.places >= limit {
		return false
	}
	s.forgetGoneLocked(id)
	if s.ids == nil {
		s.ids = make(map[string]subEntry)
	}
	e := s.ids[string(id)]
	e.bytes += n
	if e.closed {
		e.closed = false
		s.marked.Add(-1)
	}
	// A REQ reusing a closing id opens it again: a CLOSE sent now would
	// remove the new REQ's listeners too, so the leftovers stay counted.
	e.closing = false
	e.places++
	e.unanswered++
	e.last = now
	s.places++
	s.awaiting.Add(1)
	s.ids[string(id)] = e
	return true
}

// expire gives up, at now, the REQs and COUNTs the relay has left
// unanswered too long (reqHold, countHold): it frees their places, marks
// each REQ's id closed, for the gate to send the relay a CLOSE
// (takeClosed), and gone, so nothing the relay still sends under it
// reaches the client; it appends the ids given up to dst, for the caller
// to tell the client CLOSED (after expire: the ids are gone already).
// next is how long until the next REQ or COUNT still waiting would be
// given up, 0 when none waits.
func (s *subTable) expire(dst [][]byte, now time.Time) (_ [][]byte, next time.Duration) {
	s.order.Lock()
	defer s.order.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	due := func(last time.Time, hold time.Duration) bool {
		left := hold - now.Sub(last)
		if left <= 0 {
			return true
		}
		if next == 0 || left < next {
			next = left
		}
		return false
	}
	for id, e := range s.ids {
		// An id is given up only when every REQ under it went
		// unanswered: one the relay answered has its listeners there.
		if e.unanswered == 0 || e.unanswered < e.places || e.closed || !due(e.last, reqHold) {
			continue
		}
		s.places -= e.places
		s.freeLocked(e.bytes)
		s.awaiting.Add(-int32(e.unanswered))
		closing := e.closing // the client closed it already: nothing to tell
		e.places, e.bytes, e.unanswered, e.closing = 0, 0, 0, false
		e.closed = true
		s.markLocked()
		s.ids[id] = e
		s.goneLocked([]byte(id))
		if !closing {
			dst = append(dst, []byte(id))
		}
	}
	for id, e := range s.counting {
		if !due(e.last, countHold) {
			continue
		}
		s.places -= e.n
		delete(s.counting, id)
		dst = append(dst, []byte(id))
	}
	return dst, next
}

// armSubs makes expireSubs due when the REQ or COUNT just forwarded would
// be given up (reqHold, countHold: the same), unless it is due already or
// the connection has ended.
func (c *conn) armSubs() {
	c.settleMu.Lock()
	defer c.settleMu.Unlock()
	if c.subTimer == nil && !c.ended {
		c.subTimer = time.AfterFunc(reqHold, c.expireSubs)
	}
}

// expireSubs gives up the REQs and COUNTs the relay has left unanswered
// too long (subTable.expire), tells the client CLOSED for each, and is due
// again when the next one still waiting would be.
func (c *conn) expireSubs() {
	c.settleMu.Lock()
	c.subTimer = nil // a REQ forwarded from now on arms its own
	c.settleMu.Unlock()
	ids, next := c.subs.expire(nil, time.Now())
	for _, id := range ids {
		if !c.side.reply(closedFrame(id, reasonUnanswered)) {
			break
		}
	}
	if next == 0 {
		return
	}
	c.settleMu.Lock()
	defer c.settleMu.Unlock()
	if c.ended {
		return
	}
	if c.subTimer != nil {
		c.subTimer.Stop() // armed for a later REQ; next comes first
	}
	c.subTimer = time.AfterFunc(next, c.expireSubs)
}

// closedFrame is the CLOSED that tells the client subscription id
// (canonical: no escapes) is closed, for reason (plain ASCII).
func closedFrame(id []byte, reason string) []byte {
	b := make([]byte, 0, 16+len(id)+len(reason))
	b = append(append(append(b, `["CLOSED","`...), id...), `","`...)
	return append(append(b, reason...), `"]`...)
}

// heard records an EVENT the relay sent under id (a REQ's stored events
// on their way): its REQs are being answered, and are not given up
// (expire) until the relay has been silent under it for reqHold. It costs
// nothing while no REQ awaits its answer.
func (s *subTable) heard(id []byte, now time.Time) {
	if s.awaiting.Load() == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.ids[string(id)]; ok && e.unanswered > 0 {
		e.last = now
		s.ids[string(id)] = e
	}
}

// remove closes id for the client (a CLOSE, or a refusal that told it
// CLOSED) and reports whether a CLOSE must go to the relay for it: false
// when the id is not open, or already closing. Its places are freed,
// unless the relay has yet to answer a REQ under it: then it is closing
// until the relay does (see subTable).
func (s *subTable) remove(id []byte) bool {
	s.order.Lock()
	defer s.order.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.ids[string(id)]
	if !ok || e.closing {
		return false
	}
	s.goneLocked(id)
	if e.unanswered > 0 {
		e.closing = true
		s.ids[string(id)] = e
		return true
	}
	s.places -= e.places
	s.freeLocked(e.bytes)
	if e.closed {
		s.marked.Add(-1)
	}
	delete(s.ids, string(id))
	return true
}

// freeLocked gives n bytes of freed entries back. s.mu is held.
func (s *subTable) freeLocked(n int) {
	if n != 0 && s.release != nil {
		s.release(n)
	}
}

// clear frees every place and byte: the connection has ended, and the
// relay with it has let go of its listeners.
func (s *subTable) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := 0
	for _, e := range s.ids {
		held += e.bytes
	}
	s.freeLocked(held)
	s.ids, s.counting, s.places = nil, nil, 0
	s.marked.Store(0)
	s.awaiting.Store(0)
}

// openCount takes a place for a COUNT under id at now unless limit are
// taken, and reports whether it did. The place is freed by the relay's
// answer (counted), or countHold after the id's latest COUNT when none
// comes (expire).
func (s *subTable) openCount(id []byte, limit int, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.places >= limit {
		return false
	}
	if s.counting == nil {
		s.counting = make(map[string]countEntry)
	}
	e := s.counting[string(id)]
	e.n++
	e.last = now
	s.counting[string(id)] = e
	s.places++
	return true
}

// counted records the relay's answer to a COUNT under id (its COUNT, or a
// CLOSED refusing it) and reports whether one was running.
func (s *subTable) counted(id []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.counting[string(id)]
	if !ok {
		return false
	}
	s.places--
	if e.n--; e.n == 0 {
		delete(s.counting, string(id))
	} else {
		s.counting[string(id)] = e
	}
	return true
}

// answered records the relay's EOSE for a REQ under id: when it was the
// last unanswered one of a closing id, the id is marked closed, for the
// gate to CLOSE again now that the relay's listeners are all there.
func (s *subTable) answered(id []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answerLocked(id, false)
}

// closedByRelay marks id as closed by the relay's CLOSED (an answer to one
// of its REQs); its places stay taken until the gate has sent the relay a
// CLOSE for it (takeClosed), which waits, like a client's CLOSE, for the
// relay to answer every REQ under the id.
func (s *subTable) closedByRelay(id []byte) {
	s.order.Lock()
	defer s.order.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ids[string(id)]; ok {
		s.goneLocked(id)
	}
	s.answerLocked(id, true)
}

// goneLocked remembers id as closed for the client, forgetting the oldest
// when maxGone are remembered. s.mu is held.
func (s *subTable) goneLocked(id []byte) {
	s.forgetGoneLocked(id)
	n := int(s.nGone.Load())
	if n == maxGone {
		copy(s.gone[:], s.gone[1:])
		n--
	}
	s.gone[n] = string(id)
	s.nGone.Store(int32(n + 1))
}

// forgetGoneLocked forgets id as closed for the client: a REQ under it is
// forwarded. s.mu is held.
func (s *subTable) forgetGoneLocked(id []byte) {
	n := int(s.nGone.Load())
	for i := range n {
		if s.gone[i] == string(id) {
			copy(s.gone[i:n], s.gone[i+1:n])
			s.gone[n-1] = ""
			s.nGone.Store(int32(n - 1))
			return
		}
	}
}

// isGone reports whether id was closed for the client and not opened
// again since; it is cheap while none is remembered.
func (s *subTable) isGone(id []byte) bool {
	if s.nGone.Load() == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.gone[:s.nGone.Load()] {
		if g == string(id) {
			return true
		}
	}
	return false
}

func (s *subTable) answerLocked(id []byte, closed bool) {
	e, ok := s.ids[string(id)]
	if !ok {
		return
	}
	if e.unanswered > 0 {
		e.unanswered--
		s.awaiting.Add(-1)
	}
	if closed && e.unanswered > 0 {
		e.closing = true // closed once the rest are answered
	}
	if (closed || e.closing) && e.unanswered == 0 && !e.closed {
		e.closed = true
		s.markLocked()
	}
	s.ids[string(id)] = e
}

// closesOwed reports whether an entry is marked closed: the gate owes
// the relay a CLOSE.
func (s *subTable) closesOwed() bool { return s.marked.Load() > 0 }

// markLocked counts one more entry marked closed and tells onMark. s.mu
// is held.
func (s *subTable) markLocked() {
	s.marked.Add(1)
	if s.onMark != nil {
		s.onMark()
	}
}

// takeClosed removes the ids the relay closed and appends them to dst,
// for the caller to send a CLOSE each; it is cheap when there are none.
// An id equal to keep (the id of the REQ about to be decided) is not
// taken but only unmarked, its places kept: a CLOSE sent just before a
// REQ for the same id could reach khatru's handler after the REQ's (it
// runs each frame on a goroutine of its own) and close the new
// subscription too, so its leftover listeners stay counted instead. An id
// equal to skip (a REQ decided and not yet written to the relay) is left
// marked, for its CLOSE to follow the REQ.
func (s *subTable) takeClosed(dst [][]byte, keep, skip []byte) [][]byte {
	if s.marked.Load() == 0 {
		return dst
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, e := range s.ids {
		if !e.closed || skip != nil && id == string(skip) {
			continue
		}
		s.marked.Add(-1)
		if keep != nil && id == string(keep) {
			e.closed = false
			s.ids[id] = e
			continue
		}
		s.places -= e.places
		s.freeLocked(e.bytes)
		delete(s.ids, id)
		dst = append(dst, []byte(id))
	}
	return dst
}

// subID returns the decoded id of a subscription id literal (Peek's, Scan's
// or the relay's, which may escape what the client wrote raw: khatru writes
// U+2028 as \u2028); ok is false when it does not decode into an id of at
// most MaxSubIDBytes, and then names no subscription the gate opened.
func subID(buf *[wire.MaxSubIDBytes]byte, lit []byte) ([]byte, bool) {
	id, ok := scan.Unquote(buf[:0], lit)
	return id, ok && len(id) > 0
}

// defaultMaxSyncs caps the NIP-77 syncs (NEG-OPEN) one client holds open
// at the relay at once, across its connections in one gate process. A
// sync is one reconciliation of a filter, a few rounds long; a client
// runs one or two at a time. The relay keeps each one's set of events
// while it lasts, in proportion to the events the filter matches, and a
// NEG-MSG every few seconds keeps it alive, so without a cap one client
// could hold any number of them.
const defaultMaxSyncs = 4

// syncTable is the NIP-77 syncs a connection has open at the relay, by id,
// and counted against its client's cap (Gate.holdSync): opened by a
// forwarded NEG-OPEN (one reusing an open id replaces that sync at the
// relay, khatru's as NIP-77's, and takes no new place), closed by a
// forwarded NEG-CLOSE, by the relay's NEG-ERR, by a refusal of a NEG-OPEN
// or NEG-MSG under its id (the gate's NEG-ERR, and a NEG-CLOSE to the
// relay: conn.dropSub), or with the connection. A relay may also drop a
// sync it has not heard of for a while (khatru: 7 s) without a word; it
// stays counted until the client closes it, or until a NEG-MSG for it is
// answered NEG-ERR. A relay may also hold a sync the table has closed (a
// NEG-CLOSE handled before the NEG-OPEN it follows): a NEG-MSG for an id
// not open here is therefore not forwarded (conn.admit), and the relay
// drops such a sync unfed. Safe for concurrent use
// (the client reader opens and closes, the relay reader closes).
type syncTable struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

// has reports whether id is open.
func (s *syncTable) has(id []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[string(id)]
	return ok
}

// add opens id.
func (s *syncTable) add(id []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = make(map[string]struct{})
	}
	s.ids[string(id)] = struct{}{}
}

// remove closes id and reports whether it was open.
func (s *syncTable) remove(id []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[string(id)]
	delete(s.ids, string(id))
	return ok
}

// clear closes every sync and returns how many were open.
func (s *syncTable) clear() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.ids)
	s.ids = nil
	return n
}
