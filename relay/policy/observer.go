package policy

import (
	"time"

	"github.com/sluice-relay/sluice/relay/wire"
)

// Outcome is what the gate did with a connection attempt or a frame.
type Outcome uint8

// The outcomes the gate reports to an Observer.
const (
	// Admitted: charged and within every window; forwarded.
	Admitted Outcome = iota
	// RateLimited: refused by a message or connection limit, with a wait.
	RateLimited
	// Unavailable: the store could not decide; refused (fail closed).
	Unavailable
	// QuotaExceeded: an EVENT refused because its actor used up its quota.
	QuotaExceeded
	// Allowlisted: forwarded without being charged (allow-listed IP or
	// authenticated pubkey).
	Allowlisted
	// Invalid: a frame refused, after it was charged, because the gate
	// does not forward it: not canonical (a relay could read it otherwise
	// than the gate did), over its type's frame bound, an AUTH the gate
	// could not verify, or a COUNT or NEG-OPEN of a NIP the relay does not
	// do (relay.Options.Supports; reported with no client, "": not the
	// client's doing).
	Invalid
	// OverCap: refused by a cap on what a client holds open at once: an
	// upgrade past Options.MaxConnections for its client, a REQ past
	// Options.MaxSubscriptions on its connection, or an EVENT past the
	// events awaiting the relay's OK (64 of one pubkey from one client,
	// 256 on one connection).
	OverCap
	// Shadowed: forwarded, but a window in shadow (mode: shadow, or
	// shadow: true on the window) would have refused it.
	Shadowed
	// Unmatched: a CLOSE or NEG-CLOSE naming nothing open at the relay,
	// charged (to the catch-all when its type is free) and answered by
	// the gate, which is to say not at all: it is not forwarded.
	Unmatched
	// Unanswered: an AUTH the gate verified and forwarded that the relay
	// answered with no OK naming it within a bounded wait; the gate bound
	// the connection to its pubkey on its own verification (a relay that
	// sent the challenge and stays silent). Unanswered is the last
	// outcome: an array indexed by Outcome has Unanswered+1 elements, and
	// String says "unknown" past it.
	Unanswered
)

var outcomeNames = [Unanswered + 1]string{"admitted", "rate_limited", "unavailable", "quota_exceeded", "allowlisted", "invalid", "over_cap", "shadow_limited", "unmatched", "unanswered"}

// String returns a lower-case label fit for a metric ("rate_limited").
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// Observer receives the gate's decisions, for metrics. Every field may be
// nil. The functions are called on the per-frame path from many
// goroutines at once: they must be safe for concurrent use and cheap
// (an atomic add, a prometheus counter), and must not block.
type Observer struct {
	// Frame is called once per client frame with the client's key (its
	// address, as Config.Identity makes it), the frame's type and its
	// outcome. RateLimited, QuotaExceeded, Invalid and OverCap are the
	// client's doing (Unavailable is the store's): feed a view of who is
	// being limited with those.
	Frame func(client string, t wire.Type, o Outcome)
	// Connection is called once per WebSocket upgrade attempt, with the
	// client's key and the outcome.
	Connection func(client string, o Outcome)
	// Open is called with +1 when a gated connection opens and -1 when it
	// closes, so a gauge of open connections can be kept.
	Open func(delta int)
	// Cut is called when the gate closes a client's connection on its own
	// account (1008), with the reason as a metric label: "slow_reader"
	// (a write to it made no progress for the write timeout),
	// "control_flood" (too many pings, pongs or fragments) or "knocking"
	// (too many frames refused without asking the store).
	Cut func(reason string)
	// Held is called once for each frame the gate held (Limits.MaxDelay)
	// rather than refuse, when it lets go of it, with the time it was
	// held; its outcome then (Admitted, or RateLimited when it was
	// refused after all) goes to Frame as for any frame. In shadow mode,
	// where nothing is refused and so nothing held, it is called for each
	// frame that would have been held, with shadow true and the wait it
	// would have been held for.
	Held func(t wire.Type, delay time.Duration, shadow bool)
	// Ban is called when the gate learns of a ban of the penalty box
	// (Config.Penalty): one it started, or one its Guard reported at an
	// upgrade, with the banned key (a client, or an aggregate prefix) and
	// the ban's remaining time. Refusals answered from the gate's deny
	// cache while the ban lasts are not reported again.
	Ban func(key string, wait time.Duration)
	// Sent is called when what the relay sent a payer (its client key,
	// or "pk:<hex>" for a tier member) is charged to its read budget:
	// bytes and events since the last call, at most once per 64 KiB or
	// query answered (not per event).
	Sent func(client string, bytes, events int64)
	// ReadSpent is called for each subscription closed and each REQ,
	// COUNT or NEG-OPEN refused because the payer's read budget is spent.
	ReadSpent func(client string)
}

// The Report methods are the nil-safe calls the gate and the hooks make:
// each calls its function when o and the function are not nil.
