package relay

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-relay/sluice/relay/internal/charge"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// This file holds the read side: a read's price by its shape (price,
// charged with the frame by admit), and the read budget (policy.Limits.Read)
// settled with what the relay sent.
//
// What the relay sends a client is counted as it passes the gate (the
// tracker in Wrap mode, the bridge behind Proxy: readOut), per payer in
// this process (a readAccount, shared by the payer's connections here),
// and charged to the payer's read windows after it was sent, off the
// relay's path: once 64 KiB are owed (settleBytes), and at an EOSE with at
// least eoseBytes owed. A charge the windows refuse leaves the bytes owed
// and marks the payer spent until its wait is over: from then on each
// EVENT or EOSE under a subscription of one of its connections here is
// replaced by ["CLOSED",<id>,"rate-limited: read budget spent; retry in
// Ns"] (the subscription is closed for the client, which hears nothing
// more under it, and at the relay: the gate sends a CLOSE as soon as the
// relay has answered the REQ, see subTable), and each REQ, COUNT or
// NEG-OPEN is refused the same way without being forwarded. The first REQ
// after the wait pays what is owed before it is forwarded: the charge the
// wait was told for.
// Output already past the meter when the budget is found spent (queued
// for the client) is delivered: it was counted.
//
// The bound: a payer receives at most what its read windows admit plus,
// per instance, what it owes there when a charge is refused. A message
// under a subscription goes only once its bytes are counted as owed, in
// one atomic step with the check that they may be (readAccount.take): an
// account owes at most holdBytes, or one message past settleBytes when a
// message is longer than the difference. A message that may not be owed
// yet waits for the charge under way to decide (conn.takeWait: the
// relay's writer waits, as for a slow socket); it is refused with "error:
// rate limiter unavailable" (its subscription closed) only when no charge
// can decide (the store failing, or readWaitMost passed). The bound does
// not grow with the payer's connections on one instance (they share one
// account, and no connection's message slips past the check); it grows
// with the instances it reads from at once, by holdBytes each. A message whose subscription the gate closes is
// dropped, so a subscription is closed at the client only as its next
// EVENT or EOSE comes; one that gets none stays open, and costs nothing.

// settleBytes is how much a payer owes before it is charged: one store
// call per 64 KiB sent at most, never one per event.
const settleBytes = 64 << 10

// eoseBytes is the least owed that an EOSE settles: the end of a query
// with much output, not every small one.
const eoseBytes = 4 << 10

// closeBytes is the least owed that a connection's end settles. Less
// stays owed on the payer's account while another of its connections
// here is open, and is forgiven with the account after its last: what a
// relay says to every new connection (khatru's AUTH challenge, 77 bytes)
// would otherwise cost each upgrade a third store call. What goes
// uncharged is under closeBytes per connection, and connections are paid
// for by the connection budget.
const closeBytes = 1 << 10

// holdBytes is the most a payer may owe in this process (or settleBytes
// and one message longer than the difference): past it, its output waits
// for a charge to decide (takeWait). It is the overshoot past the budget
// per instance, so it is small against the default budget (16 MiB, of
// which it is 1/64); and it leaves a charge started at settleBytes the
// time for three times as much to be sent before anything waits, so that
// only a client reading faster than 192 KiB per store round trip ever
// waits on one.
const holdBytes = 256 << 10

// readAccount is what one payer (a read key) owes in this process.
type readAccount struct {
	key, who  string
	refs      int          // connections holding it, under readMeter.mu
	owed      atomic.Int64 // bytes sent and not yet charged
	events    atomic.Int64 // events sent and not yet reported
	settling  atomic.Bool  // a charge is under way
	failed    atomic.Bool  // the last charge could not decide
	spentTill atomic.Int64 // Unix nanoseconds (the gate's clock) the budget is spent until; 0: not spent
	toldFor   atomic.Int64 // the bytes of the refused charge whose wait spentTill is
	// decided is closed (and replaced) when a charge decides: what a
	// message that cannot be owed waits on (conn.takeWait).
	mu      sync.Mutex
	decided chan struct{}
}

// charged returns the channel closed when the next charge of a decides.
func (a *readAccount) charged() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.decided == nil {
		a.decided = make(chan struct{})
	}
	return a.decided
}

// endCharge ends a's charges under way: settling is released and the
// waiters woken.
func (a *readAccount) endCharge() {
	a.settling.Store(false)
	a.wake()
}

// wake wakes what waits on a charge of a: one has decided.
func (a *readAccount) wake() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.decided != nil {
		close(a.decided)
		a.decided = nil
	}
}

// readWaitMost bounds how long a message that may not be owed yet waits
// for a charge to decide: a store's timeout ends a charge sooner; this
// keeps a charge that does not return from holding the output for long.
const readWaitMost = time.Second

// takeWait counts n bytes as sent (take), waiting while a owes too much
// for a charge under way (started if none is) to decide; it reports false
// when the budget is spent, a charge could not decide or be started, or
// readWaitMost passed.
func (c *conn) takeWait(a *readAccount, n int64) bool {
	var tm *time.Timer
	defer func() {
		if tm != nil {
			tm.Stop()
		}
	}()
	for {
		ch := a.charged()
		if till := a.spentTill.Load(); till > c.g.now().UnixNano() {
			return false
		}
		if a.take(n) {
			return true
		}
		// A charge that could not decide is tried again, but nothing
		// waits on it: the store is likely down.
		// (take refuses only past settleBytes owed: a charge is due.)
		if !c.g.settleLater(a, c.reads.subFor(a), settleBytes) || a.failed.Load() {
			return false
		}
		if tm == nil {
			tm = time.NewTimer(readWaitMost)
		}
		select {
		case <-ch:
		case <-tm.C:
			return false
		case <-c.ctx.Done():
			return false
		}
	}
}

// readMeter holds the accounts of the payers with connections open here.
type readMeter struct {
	mu    sync.Mutex
	accts map[string]*readAccount
}

func (m *readMeter) acquire(key string) *readAccount {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.accts == nil {
		m.accts = make(map[string]*readAccount)
	}
	a := m.accts[key]
	if a == nil {
		// key is "{<payer>}:read".
		a = &readAccount{key: key, who: key[1 : len(key)-len("}:read")]}
		m.accts[key] = a
	}
	a.refs++
	return a
}

func (m *readMeter) release(a *readAccount) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a.refs--; a.refs == 0 {
		delete(m.accts, a.key)
	}
}

// spentAlready marks a spent while the limiter remembers its key refused
// (a payer whose connections here all closed after its budget was spent
// has a new account): else each time it came back it could owe holdBytes
// anew. The charge its wait is told for is then one byte, made after the
// wait like any told charge, which marks it recovered.
func (g *Gate) spentAlready(a *readAccount) {
	if a.spentTill.Load() != 0 {
		return
	}
	if wait, ok := g.limiter.Refused(a.key); ok {
		a.toldFor.Store(1)
		a.spentTill.Store(g.now().Add(wait).UnixNano())
	}
}

// connReads is a connection's hold on its payer's account.
type connReads struct {
	mu   sync.Mutex
	sub  *charge.Subject // the subject acct is for
	acct *readAccount
	// checked and fast are sub and acct for the relay's path (readFast).
	checked atomic.Pointer[charge.Subject]
	fast    atomic.Pointer[readAccount]
}

// readAccount returns the account of the connection's payer and its
// subject, or nil when it has no read budget (free, or no windows).
func (c *conn) readAccount() (*readAccount, *charge.Subject) {
	sub := c.subject(c.g.current().p)
	r := &c.reads
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sub == sub {
		return r.acct, sub
	}
	old := r.acct
	r.sub, r.acct = sub, nil
	if sub.Reads() {
		r.acct = c.g.reads.acquire(sub.ReadKey())
		c.g.spentAlready(r.acct)
	}
	r.fast.Store(r.acct)
	r.checked.Store(sub)
	if old != nil {
		c.g.reads.release(old)
	} else if r.acct != nil {
		context.AfterFunc(c.ctx, func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.acct != nil {
				// What the connection was sent and not yet charged is
				// charged as it goes, from closeBytes owed.
				c.g.settleLater(r.acct, r.sub, closeBytes)
				c.g.reads.release(r.acct)
				r.acct = nil
				r.fast.Store(nil)
			}
		})
	}
	return r.acct, sub
}

// subFor returns the subject a is held for: the connection's, unless a
// reload or an AUTH has just moved it to another account.
func (r *connReads) subFor(a *readAccount) *charge.Subject {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.acct != a || r.sub == nil {
		return nil
	}
	return r.sub
}

// take counts n bytes as sent (owed) if a may owe them: while what it
// owes with them is at most holdBytes, or it owes less than settleBytes
// (a message longer than holdBytes goes alone). Checked and counted in one
// step, so that connections sharing a do not each pass a message on the
// same look.
func (a *readAccount) take(n int64) bool {
	for {
		o := a.owed.Load()
		if o+n > holdBytes && o >= settleBytes {
			return false
		}
		if a.owed.CompareAndSwap(o, o+n) {
			return true
		}
	}
}

// readTake counts n bytes of a relay message about to go to the client as
// sent, and reports whether it did: false when the message must be
// decided first (readClosing): the payer's budget spent, or too much owed.
// With no read budget there is nothing to count: true.
func (c *conn) readTake(n int) bool {
	a := c.readFast()
	if a == nil {
		return true
	}
	if a.spentTill.Load() != 0 || !a.take(int64(n)) {
		return false
	}
	c.settleDue(a, settleBytes)
	return true
}

// settleDue starts a charge of what a owes if at least least is owed and
// none is under way: on the relay's path, two atomic loads when none is
// due.
func (c *conn) settleDue(a *readAccount, least int64) {
	if a.owed.Load() >= least && !a.settling.Load() {
		c.g.settleLater(a, c.reads.subFor(a), least)
	}
}

// readUntake takes back n bytes counted by readTake or readClosing for a
// message then dropped.
func (c *conn) readUntake(n int) {
	if a := c.readFast(); a != nil && n > 0 {
		a.owed.Add(-int64(n))
	}
}

// readFast returns the account of the connection's payer without a lock
// while the connection's subject is the one it was looked up for.
func (c *conn) readFast() *readAccount {
	if s := c.sub.Load(); s != nil && s == c.reads.checked.Load() && s.Policy() == c.g.current().p {
		return c.reads.fast.Load()
	}
	a, _ := c.readAccount()
	return a
}

// readOut meters a whole relay message, msg, on its way to the client
// (behind Proxy). It returns pass = true to let it through (counted);
// otherwise msg is dropped and, when closed is not nil, replaced by
// closed: the CLOSED that ends its subscription for the client. A message
// under a subscription closed for the client is dropped uncounted: the
// client is not sent it, so it does not pay for it.
func (c *conn) readOut(msg []byte) (closed []byte, pass bool) {
	if lit := addressed(msg); lit != nil {
		if !c.deliversUnder(lit) {
			return nil, false
		}
		if closed, refused := c.readClosing(lit, len(msg)); refused {
			return closed, false
		}
	} else {
		c.readCount(len(msg))
	}
	c.readHead(msg)
	return nil, true
}

// readClosing decides an EVENT or EOSE of n bytes under the subscription
// id literal lit: it goes, its n bytes counted (readAccount.take), unless
// the client's budget is spent or the bytes cannot be owed now
// (readRefusal). Then it closes the subscription for the client and
// returns the CLOSED that says so (nil when it is closed already),
// refused = true; the message is dropped. n = 0: counted already.
func (c *conn) readClosing(lit []byte, n int) (closed []byte, refused bool) {
	a := c.readFast()
	if a == nil {
		return nil, false
	}
	wait, why := c.readRefusal(a)
	if why == "" {
		if n == 0 || c.takeWait(a, int64(n)) {
			c.settleDue(a, settleBytes)
			return nil, false
		}
		// Spent meanwhile, or owes too much with no charge deciding.
		wait, why = c.readRefusal(a)
		if why == "" {
			why = scan.ReasonUnavailable
		}
	}
	var buf [wire.MaxSubIDBytes]byte
	id, ok := subID(&buf, lit)
	if !ok || c.subs.isGone(id) {
		return nil, true
	}
	c.subs.closedByRelay(id)
	if why == reasonReadSpent {
		c.g.obs.ReportReadSpent(a.who)
	}
	return appendReadClosed(make([]byte, 0, 96+len(lit)), lit, wait, why), true
}

// readCount counts n bytes of relay messages as sent to the client
// unchecked (what is not under a subscription, and the later frames of a
// fragmented message), and starts a charge once settleBytes are owed.
func (c *conn) readCount(n int) {
	if n <= 0 {
		return
	}
	a := c.readFast()
	if a == nil {
		return
	}
	a.owed.Add(int64(n))
	c.settleDue(a, settleBytes)
}

// readHead reads the start of a relay message sent to the client: an
// EVENT is counted, an EOSE starts a charge when eoseBytes are owed.
func (c *conn) readHead(head []byte) {
	switch {
	case bytes.HasPrefix(head, []byte(`["EVENT"`)):
		if a := c.readFast(); a != nil {
			a.events.Add(1)
		}
	case bytes.HasPrefix(head, []byte(`["EOSE"`)):
		if a := c.readFast(); a != nil {
			c.settleDue(a, eoseBytes)
		}
	}
}

// readRefusal says whether a's reads are refused now, and why: the wait
// and reasonReadSpent while its budget is spent, scan.ReasonUnavailable
// past holdBytes owed when the last charge could not decide; "" when they
// are not. (Past holdBytes owed while a charge is under way, a REQ is
// forwarded: its output waits for the charge, takeWait.)
func (c *conn) readRefusal(a *readAccount) (time.Duration, string) {
	if till := a.spentTill.Load(); till != 0 {
		if wait := time.Duration(till - c.g.now().UnixNano()); wait > 0 {
			return wait, reasonReadSpent
		}
	}
	if a.owed.Load() >= holdBytes && a.failed.Load() {
		return 0, scan.ReasonUnavailable
	}
	return 0, ""
}

// reasonReadSpent leads the refusal of a read while the read budget is
// spent; the wait follows.
const reasonReadSpent = "rate-limited: read budget spent; retry in "

// appendReadClosed appends ["CLOSED",lit,"<why><wait>s"] (why alone for
// an unavailable limiter).
func appendReadClosed(dst, lit []byte, wait time.Duration, why string) []byte {
	dst = append(append(append(dst, `["CLOSED",`...), lit...), `,"`...)
	dst = append(dst, why...)
	if why == reasonReadSpent {
		dst = append(strconv.AppendInt(dst, scan.RetrySeconds(wait), 10), 's')
	}
	return append(dst, `"]`...)
}

// readRefused refuses a REQ, COUNT or NEG-OPEN, f, while the client's read
// budget is spent, and reports whether it did. After the wait it first
// charges what the client owes (the charge the wait was told for); a
// refusal of that charge refuses f with its wait.
func (c *conn) readRefused(f scan.Frame) bool {
	if f.Type != wire.TypeREQ && f.Type != wire.TypeCOUNT && f.Type != wire.TypeNEGOPEN {
		return false
	}
	a, sub := c.readAccount()
	if a == nil {
		return false
	}
	wait, why := c.readRefusal(a)
	if why == "" && a.spentTill.Load() != 0 && a.settling.CompareAndSwap(false, true) {
		v := c.g.settle(a, sub, 1, a.toldFor.Load())
		a.endCharge()
		switch {
		case v.Err != nil:
			wait, why = 0, scan.ReasonUnavailable
		case v.Refused:
			wait, why = v.Wait, reasonReadSpent
		}
	}
	if why == "" {
		return false
	}
	outcome := policy.RateLimited
	if why == scan.ReasonUnavailable {
		outcome = policy.Unavailable
	} else {
		c.g.obs.ReportReadSpent(a.who)
	}
	c.g.obs.ReportFrame(c.who, f.Type, outcome)
	c.dropSub(f)
	reason := why
	if why == reasonReadSpent {
		reason += strconv.FormatInt(scan.RetrySeconds(wait), 10) + "s"
	}
	c.side.reply(scan.AppendRefusal(replyBuf(f), f, reason))
	return true
}

// price returns what a canonical frame of type t costs its type's
// windows: a REQ's, COUNT's or NEG-OPEN's price by its filters' shape
// (policy.ReadCost, from what scan.Scan read of it: facts), 1 for any
// other.
func (c *conn) price(p *charge.Policy, t wire.Type, facts *scan.Facts, frame []byte) int {
	switch t {
	case wire.TypeREQ, wire.TypeCOUNT, wire.TypeNEGOPEN:
		return p.Price(facts, frame, c.g.now())
	}
	return 1
}

// settleLater charges what a owes off the relay's path while at least
// least is owed, one charge at a time per account. While a's budget is
// spent it charges nothing; after the wait, first the charge the wait was
// told for. It reports whether a charge is under way (this one or
// another); not when nothing is owed.
func (g *Gate) settleLater(a *readAccount, sub *charge.Subject, least int64) bool {
	if sub == nil || a.owed.Load() < least {
		return false
	}
	if !a.settling.CompareAndSwap(false, true) {
		return true
	}
	var once int64
	if till := a.spentTill.Load(); till != 0 {
		if till > g.now().UnixNano() {
			a.endCharge()
			return false
		}
		once = a.toldFor.Load()
	}
	if !g.track(1) {
		a.endCharge()
		return false
	}
	go func() {
		defer g.track(-1)
		defer a.endCharge()
		g.settle(a, sub, least, once)
	}()
	return true
}

// settle charges what a owes to sub's read windows while at least least
// bytes are owed, in charges of at most sub.ReadMax(); it returns the
// last verdict. A refusal marks a spent until its wait is over; the bytes
// stay owed. With once > 0 it makes one charge of at most once bytes: the
// charge a wait was told for, which is then admitted, whatever was
// counted since (the rest is charged later). Called with a.settling held.
func (g *Gate) settle(a *readAccount, sub *charge.Subject, least, once int64) charge.Verdict {
	var v charge.Verdict
	for {
		n := a.owed.Load()
		if n < least || n <= 0 {
			return v
		}
		// Once a's budget is spent, nothing more is charged until the
		// charge its wait was told for is made (readRefused, at the
		// client's next read after the wait): a charge for more bytes,
		// refused meanwhile or made first, would make that wait untrue.
		if once == 0 && a.spentTill.Load() != 0 {
			return v
		}
		n = min(n, sub.ReadMax())
		if once > 0 {
			n = min(n, once)
		}
		v = sub.SettleRead(context.Background(), g.limiter, a.key, n)
		a.failed.Store(v.Err != nil)
		switch {
		case v.Err != nil:
			return v
		case v.Refused:
			if !v.Local {
				g.log.Info("rate-limited", "client", a.who, "type", "read", "limit", v.Budget, "wait", v.Wait.Round(time.Millisecond).String())
			}
			a.toldFor.Store(n)
			a.spentTill.Store(g.now().Add(v.Wait).UnixNano())
			return v
		}
		a.spentTill.Store(0)
		a.owed.Add(-n)
		a.wake() // what waits to be owed may be now
		g.obs.ReportSent(a.who, n, a.events.Swap(0))
		if once > 0 {
			return v
		}
	}
}
