package policy

import "github.com/sluice-relay/sluice/relay/wire"

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
	// does not forward it: not canonical (wire.Scan), over its type's
	// frame bound, or an AUTH the gate could not verify.
	Invalid
	// OverCap: refused by a cap on what a client holds open at once: an
	// upgrade past Options.MaxConnections for its client, a REQ past
	// Options.MaxSubscriptions on its connection, or an EVENT past the
	// events awaiting the relay's OK (relay.MaxActorPending,
	// relay.DefaultPending).
	OverCap
	// Shadowed: forwarded, but a window in shadow (mode: shadow, or
	// shadow: true on the window) would have refused it.
	Shadowed
	// Unmatched: a CLOSE or NEG-CLOSE naming nothing open at the relay,
	// charged (to the catch-all when its type is free) and answered by
	// the gate, which is to say not at all: it is not forwarded.
	// Unmatched is the last outcome: an array indexed by Outcome has
	// Unmatched+1 elements, and String says "unknown" past it.
	Unmatched
)

var outcomeNames = [Unmatched + 1]string{"admitted", "rate_limited", "unavailable", "quota_exceeded", "allowlisted", "invalid", "over_cap", "shadow_limited", "unmatched"}

// CutReason is why the gate closed a client's connection on its own
// account.
type CutReason uint8

// The reasons the gate reports to Observer.Cut.
const (
	// CutSlowReader: a write to the client made no progress for
	// Options.WriteTimeout (its queue full, it stopped reading).
	CutSlowReader CutReason = iota
	// CutControlFlood: too many control frames (pings, pongs, fragments).
	CutControlFlood
	// CutKnocking: too many frames refused from the local table.
	// CutKnocking is the last reason: an array indexed by CutReason has
	// CutKnocking+1 elements.
	CutKnocking
)

var cutNames = [CutKnocking + 1]string{"slow_reader", "control_flood", "knocking"}

// String returns a lower-case label fit for a metric ("slow_reader").
func (r CutReason) String() string {
	if int(r) < len(cutNames) {
		return cutNames[r]
	}
	return "unknown"
}

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
	// Frame is called once per client frame with its type and outcome.
	Frame func(t wire.Type, o Outcome)
	// Connection is called once per WebSocket upgrade attempt.
	Connection func(o Outcome)
	// Open is called with +1 when a gated connection opens and -1 when it
	// closes, so a gauge of open connections can be kept.
	Open func(delta int)
	// Cut is called when the gate closes a client's connection on its own
	// account (1008), with the reason.
	Cut func(r CutReason)
	// Refusal is called for every frame or upgrade the gate refuses for
	// what the client did (RateLimited, QuotaExceeded, Invalid, OverCap;
	// not Unavailable, which is the store's doing), with the client's key;
	// t is wire.NumTypes for a refused upgrade. Feed an Offenders view with it.
	Refusal func(client string, t wire.Type, o Outcome)
}

// The Report methods are the nil-safe calls the gate and the hooks make:
// each calls its function when o and the function are not nil.
