package policy

import (
	"time"

	"github.com/sluice-relay/sluice/relay/wire"

	"github.com/sluice-relay/sluice/ratelimit"
)

// Limits are the budgets the gate charges: one set of windows for opening
// connections and one per message type. A type whose slice is empty passes
// free; every window of a type must admit a message for it to pass.
//
// The zero Limits limits nothing. Options.Limits nil means DefaultLimits.
type Limits struct {
	// Connection is charged once per WebSocket upgrade, keyed by client.
	Connection []ratelimit.Limit
	// Message is charged once per client frame, indexed by the frame's Type.
	// Message[wire.TypeOther] is the catch-all bucket for unknown labels and
	// frames that cannot be classified; leaving it empty makes them free.
	Message [wire.NumTypes][]ratelimit.Limit
}

// DefaultLimits returns the limits a public relay can start with. Each
// number is a half-life EWMA window: a limit R/T admits a burst of R from
// rest and then about R·ln2 per T (see ratelimit.Limit.Interval).
//
// The numbers are per client (an IPv4 address or an IPv6 /64), so they are
// sized for a busy human client, or a few behind one NAT, not for one tab.
func DefaultLimits() Limits {
	var l Limits
	// 12 upgrades in a burst, then about 8 a second: a client reconnecting
	// after a network change opens a handful of sockets at once, a loop
	// that reconnects as fast as it can does not get far.
	l.Connection = []ratelimit.Limit{ratelimit.PerPeriod(12, time.Second)}
	// EVENT is what costs a relay most (signature check, storage, fan-out).
	// 10 in a burst, ~6.6/s sustained over a second; the 60 s window caps
	// a long session at ~2.8/s (240 burst), well above what a person
	// posts and below what a spam script wants.
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{
		ratelimit.PerPeriod(10, time.Second),
		ratelimit.PerPeriod(240, time.Minute),
	}
	// REQ opens a subscription and runs a query per filter, and is charged
	// once per filter. Clients open many at start-up (profiles, notes,
	// reactions), each of one to a few filters: hence a burst of 50
	// filters.
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(50, time.Second)}
	// COUNT runs the same query as a REQ without returning events.
	l.Message[wire.TypeCOUNT] = []ratelimit.Limit{ratelimit.PerPeriod(20, time.Second)}
	// AUTH is one signature check; a client needs one per connection.
	l.Message[wire.TypeAUTH] = []ratelimit.Limit{ratelimit.PerPeriod(5, time.Second)}
	// NEG-OPEN builds a negentropy set over a query that may cover far
	// more events than a REQ returns (sluice relay: up to
	// max_sync_events, 100,000, at ~0.4 s of CPU for them all, where a
	// REQ filter returns at most 1,000), and the relay keeps the set
	// while the sync lasts. 4 in a burst (a client syncing a few filters
	// at start-up), then about one every 4 s.
	l.Message[wire.TypeNEGOPEN] = []ratelimit.Limit{ratelimit.PerPeriod(4, 10*time.Second)}
	// NEG-MSG rounds of one sync follow each other quickly; they are cheap
	// next to the NEG-OPEN that started them.
	l.Message[wire.TypeNEGMSG] = []ratelimit.Limit{ratelimit.PerPeriod(50, time.Second)}
	// CLOSE and NEG-CLOSE stay free: refusing them would only keep a
	// subscription or a sync open longer.
	//
	// OTHER (unknown labels, unparsable frames) is never free: the relay
	// still has to read and reject them.
	l.Message[wire.TypeOther] = []ratelimit.Limit{ratelimit.PerPeriod(20, time.Second)}
	return l
}
