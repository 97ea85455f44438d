package charge

import (
	"context"
	"net/netip"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/wire"
)

// Subject is who pays for one connection's frames under one Policy: an
// address budget (the client's key, and the aggregates its address falls
// in) or a tier member's pubkey, with every key built once. A gate makes
// one per connection, and a new one when the connection proves a member
// pubkey or the policy is reloaded; the hooks make one per call. A Subject
// is immutable and safe for concurrent use.
type Subject struct {
	p    *Policy
	b    *budget
	tier *tier // nil: the address budget
	free bool
	lazy bool   // keys are built per charge (CallSubject), not up front
	name string // the key's hash-tag part: the client, or "pk:<hex>"

	msg, msgShadow     [wire.NumTypes]string
	conn, connShadow   string
	class, classShadow []string  // per class
	aggs               []aggKeys // per aggregate; zero when addr is of the other family
}

// aggKeys are one aggregate's keys for one address: its messages', their
// shadow windows', its upgrades', and its name for Verdict.Budget.
type aggKeys struct{ msg, shadow, conn, label string }

// AddressSubject returns the address budget of client (its key, as
// Identity makes it) at addr; free says the address is allow-listed, and
// then nothing is charged.
func (p *Policy) AddressSubject(client string, addr netip.Addr, free bool) *Subject {
	return p.addressSubject(client, addr, free, false)
}

func (p *Policy) addressSubject(client string, addr netip.Addr, free, lazy bool) *Subject {
	s := &Subject{p: p, b: &p.budget, free: free, lazy: lazy, name: client}
	s.build()
	if !free {
		if !lazy { // a hook call builds its connection key when it charges one
			s.conn = connectionKey(client)
			s.connShadow = shadowKey(s.conn, p.conn)
		}
		for i := range p.aggs {
			var ak aggKeys
			if pfx, ok := p.aggs[i].prefix(addr); ok {
				k := "{" + pfx + "}:aggregate"
				ak = aggKeys{msg: k, shadow: k + ":shadow", conn: k + ":connection", label: "prefix " + pfx}
			}
			s.aggs = append(s.aggs, ak)
		}
	}
	return s
}

// MemberSubject returns the budget of a connection that proved pubkey (64
// lowercase hex digits), or nil when pubkey is in no tier: it then stays
// on its address's budget. A member of a Free tier is charged nothing.
func (p *Policy) MemberSubject(pubkey string) *Subject {
	return p.memberSubject(pubkey, false)
}

func (p *Policy) memberSubject(pubkey string, lazy bool) *Subject {
	k, ok := scan.DecodeHex32(pubkey)
	if !ok {
		return nil
	}
	t := p.members[k]
	if t == nil {
		return nil
	}
	s := &Subject{p: p, b: &t.budget, tier: t, lazy: lazy, name: "pk:" + pubkey}
	s.build()
	return s
}

// CallSubject is the Subject of one hook call: the member budget of
// authed (the call's NIP-42 pubkey, "" for none) when it is in a tier,
// else the address budget of client at addr (free: allow-listed). Its keys
// are built by the charge that needs them, not up front: a hook charges
// one type per call.
func (p *Policy) CallSubject(client string, addr netip.Addr, free bool, authed string) *Subject {
	if authed != "" && !free {
		if s := p.memberSubject(authed, true); s != nil {
			return s
		}
	}
	return p.addressSubject(client, addr, free, true)
}

// build makes the message and class keys of s (none for a lazy one).
func (s *Subject) build() {
	if s.free || s.lazy {
		return
	}
	for t := range s.msg {
		if s.b.msg[t].empty() { // REQ's per-filter windows are these, scaled
			continue
		}
		s.msg[t] = messageKey(s.name, wire.Type(t).String())
		s.msgShadow[t] = shadowKey(s.msg[t], s.b.msg[t])
	}
	for _, c := range s.p.classes {
		k := kindKey(s.name, c.name)
		s.class = append(s.class, k)
		s.classShadow = append(s.classShadow, shadowKey(k, c.win))
	}
}

// Policy returns the policy s was made under: a gate compares it with the
// running one to see a reload.
func (s *Subject) Policy() *Policy { return s.p }

// Free reports whether s is charged nothing.
func (s *Subject) Free() bool { return s.free }

// Member reports whether s is a tier member's budget, and the tier.
func (s *Subject) Member() (tier string, ok bool) {
	if s.tier == nil {
		return "", false
	}
	return s.tier.name, true
}

// Quota returns the actor quota that applies to s: its tier's, or the
// policy's; nil for none (a Free tier has none).
func (s *Subject) Quota() ratelimit.ActorQuota {
	switch {
	case s.free:
		return nil
	case s.tier != nil:
		return s.tier.quota
	}
	return s.p.quota
}

// Charged reports whether a frame of type t costs s anything at all.
func (s *Subject) Charged(t wire.Type) bool {
	if s.free {
		return false
	}
	if !s.b.msg[t].empty() || len(s.aggs) > 0 {
		return true
	}
	return t == wire.TypeEVENT && len(s.class) > 0
}

// Refused is what the limiter's local table says of s's frames of type t,
// without a store call (ratelimit.Limiter.Refused): a client refused by
// its type's enforcing windows is answered at once, before its frame is
// read.
func (s *Subject) Refused(lim *ratelimit.Limiter, t wire.Type) (time.Duration, bool) {
	if s.free || s.b.msg[t].enforce == nil {
		return 0, false
	}
	return lim.Refused(s.msg[t])
}

// ConnectionRefused is what the limiter's local table says of s's next
// upgrade, without a store call: refused, and the longest wait left, when
// an enforcing window of its charges (connectionCharges) is there.
func (s *Subject) ConnectionRefused(lim *ratelimit.Limiter) (time.Duration, bool) {
	if s.free {
		return 0, false
	}
	var buf [1 + stackAggregates]charge
	var wait time.Duration
	refused := false
	for _, c := range s.connectionCharges(buf[:0]) {
		if c.win.enforce == nil {
			continue
		}
		if w, ok := lim.Refused(c.key); ok {
			wait, refused = max(wait, w), true
		}
	}
	return wait, refused
}

// Verdict is what charging one frame (or upgrade) decided.
type Verdict struct {
	// Refused: an enforcing window refused; Wait is its wait.
	Refused bool
	Wait    time.Duration
	// Err: the store could not decide (it wraps ratelimit.ErrUnavailable);
	// the frame is refused as unavailable, never as rate-limited.
	Err error
	// Budget names what refused, or with Shadow what would have: the
	// type ("EVENT"), "kind <class>", or "prefix <network>".
	Budget string
	// Shadow: a window in shadow would have refused, with ShadowWait; the
	// frame passes.
	Shadow     bool
	ShadowWait time.Duration
	// Local: the refusal (with Shadow, the shadow refusal) was answered
	// from the limiter's local table (ratelimit.Decision.Local): this
	// payer was refused by that budget before and is within its wait.
	// The gate logs only refusals that are not Local, so a client
	// refused by a later budget (a kind class, an aggregate), which
	// Refused does not answer for, costs one log line per wait, not one
	// per frame.
	Local bool
	// Quota: the refusal (Refused, or Err) is the actor quota's, not a
	// window's (Event).
	Quota bool
	// Allowlisted: the frame passes because of an allow-list: the payer
	// is charged nothing (Free), or an EVENT's author is exempt from the
	// quota (EventActor).
	Allowlisted bool
}

// Pass reports whether the frame may go on.
func (v Verdict) Pass() bool { return !v.Refused && v.Err == nil }

// charge is one budget a frame pays: a key, its windows, its name.
type charge struct {
	key, shadowKey string
	win            split
	budget         string
	room           *ratelimit.Room // an actor quota's room check (Event): key is the quota's
}

// Charge decides one frame of type t on every budget it pays, as one
// decision: its type's windows (a REQ's, COUNT's or NEG-OPEN's by its
// price, filters: Policy.Price, capped at the burst; 0 or an unscanned
// frame pays one filter's), for an EVENT of kind kind (-1: none) its kind
// class, and each aggregate its address is in. The frame is admitted only
// if every enforcing window admits, and charged only then: a frame refused
// by one budget has paid none (see decide); the wait is the largest and
// Budget names its budget. When they admitted, the windows in shadow are
// decided the same way, and a refusal among them is reported as Shadow.
// Shadow windows have keys of their own (":shadow"), so that what they
// decide never answers for the enforcing ones.
func (s *Subject) Charge(ctx context.Context, lim *ratelimit.Limiter, t wire.Type, filters, kind int) Verdict {
	return s.chargeWith(ctx, lim, t, filters, kind, nil)
}

// chargeWith is Charge with room, when not nil, decided as one more of the
// frame's budgets (an EVENT's actor quota: Event).
func (s *Subject) chargeWith(ctx context.Context, lim *ratelimit.Limiter, t wire.Type, filters, kind int, room *ratelimit.Budget) Verdict {
	if s.free {
		return Verdict{Allowlisted: true}
	}
	var buf [3 + stackAggregates]charge
	cs := buf[:0]
	win := s.b.msg[t]
	if pr := s.b.priced[t]; filters >= 1 && len(pr) > 1 {
		win = pr[min(filters, len(pr)-1)] // a price past the burst is the burst's
	}
	if !win.empty() {
		k, sk := s.msg[t], s.msgShadow[t]
		if s.lazy {
			k = messageKey(s.name, t.String())
			sk = shadowKey(k, win)
		}
		cs = append(cs, charge{k, sk, win, t.String(), nil})
	}
	if t == wire.TypeEVENT && kind >= 0 && kind < len(s.p.kindClass) {
		if j := s.p.kindClass[kind]; j != 0 {
			c := &s.p.classes[j-1]
			k, sk := "", ""
			if s.lazy {
				k = kindKey(s.name, c.name)
				sk = shadowKey(k, c.win)
			} else {
				k, sk = s.class[j-1], s.classShadow[j-1]
			}
			cs = append(cs, charge{k, sk, c.win, c.label, nil})
		}
	}
	cs = s.appendAggregates(cs)
	if room != nil {
		cs = append(cs, charge{key: room.Key, budget: "quota", room: room.Room})
	}
	return decide(ctx, lim, cs)
}

// ChargeConnection decides one WebSocket upgrade: the connection windows,
// then each aggregate's windows on a key of their own for upgrades (the
// same numbers as for its messages, counted apart: rotating addresses
// inside a prefix multiplies both).
func (s *Subject) ChargeConnection(ctx context.Context, lim *ratelimit.Limiter) Verdict {
	if s.free {
		return Verdict{Allowlisted: true}
	}
	var buf [1 + stackAggregates]charge
	return decide(ctx, lim, s.connectionCharges(buf[:0]))
}

// connectionCharges appends to cs what an upgrade of s pays: the
// connection windows, then each aggregate's windows on a key of their own
// for upgrades.
func (s *Subject) connectionCharges(cs []charge) []charge {
	if !s.p.conn.empty() {
		k, sk := s.conn, s.connShadow
		if s.lazy {
			k = connectionKey(s.name)
			sk = shadowKey(k, s.p.conn)
		}
		cs = append(cs, charge{k, sk, s.p.conn, "connection", nil})
	}
	for i, ak := range s.aggs {
		if ak.conn != "" {
			w := s.p.aggs[i].win
			cs = append(cs, charge{ak.conn, shadowKey(ak.conn, w), w, ak.label, nil})
		}
	}
	return cs
}

// kindKey is the key of kind class class for the payer named name.
func kindKey(name, class string) string { return "{" + name + "}:kind:" + class }

// shadowKey is the key of w's shadow windows beside key k: k with
// ":shadow", or "" when w has none (decide then never reads it).
func shadowKey(k string, w split) string {
	if w.shadow == nil {
		return ""
	}
	return k + ":shadow"
}

func (s *Subject) appendAggregates(cs []charge) []charge {
	for i, ak := range s.aggs {
		if ak.msg != "" {
			cs = append(cs, charge{ak.msg, ak.shadow, s.p.aggs[i].win, ak.label, nil})
		}
	}
	return cs
}

// decide runs the charges as one decision (ratelimit.Limiter.AllowAll):
// the enforcing windows of every budget together, admitted only if all
// admit and charged only then, the wait the largest; then, when they
// passed, the shadow windows together the same way, on keys of their own,
// reporting what enforcing them would have refused. A frame without
// shadow windows is one store call.
func decide(ctx context.Context, lim *ratelimit.Limiter, cs []charge) Verdict {
	var buf [3 + stackAggregates]ratelimit.Budget
	bs := buf[:0]
	for _, c := range cs {
		bs = append(bs, ratelimit.Budget{Key: c.key, Windows: c.win.enforce, Room: c.room})
	}
	d, err := lim.AllowAll(ctx, bs)
	switch {
	case err != nil:
		return Verdict{Err: err, Budget: cs[d.By].budget, Quota: cs[d.By].room != nil}
	case !d.Allowed:
		return Verdict{Refused: true, Wait: d.Wait, Budget: cs[d.By].budget, Local: d.Local, Quota: cs[d.By].room != nil}
	}
	bs = bs[:0]
	for _, c := range cs {
		if c.room == nil { // a room has no shadow
			bs = append(bs, ratelimit.Budget{Key: c.shadowKey, Windows: c.win.shadow})
		}
	}
	var v Verdict
	d, err = lim.AllowAll(ctx, bs)
	// A shadow window that cannot decide refuses nothing either; it is not
	// an outage of the frame's own.
	if err == nil && !d.Allowed {
		v.Shadow, v.ShadowWait, v.Budget, v.Local = true, d.Wait, cs[d.By].budget, d.Local
	}
	return v
}

// stackAggregates is the room kept on the stack for aggregate charges:
// policy.Config.Validate allows 4 aggregates; more would only allocate.
const stackAggregates = 4
