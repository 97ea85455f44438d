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
	// MaxDelay is how long the gate may hold a frame whose true wait is
	// that short, forwarding it once its budget admits it, instead of
	// refusing it with the wait (shaping); 0 holds nothing. At most
	// 10 seconds. Only the address budget's is used (a tier's, like its
	// Connection, is not): it says how long a connection may be paused,
	// not what a payer may spend. The hooks (relay/hooks) hold nothing:
	// they answer within the relay's own handling of the frame.
	MaxDelay time.Duration
	// Read is the read budget: windows in bytes (Rate in bytes, at least
	// 1 MiB; Cost 1) charged with what the relay sends the client —
	// stored results and live events, on all its connections — after it
	// was sent, by a gate (package relay; hooks cannot see what is sent).
	// A client then receives at most what the windows admit plus, per
	// gate process it reads from, under 2 MiB and one message per
	// connection. Empty: reads are priced by shape only (Config.ReadCost).
	Read []ratelimit.Limit
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
	// each filter's price by shape (ReadCost: 1 for a narrow one, 10 for a
	// scrape). Clients open many at start-up (profiles, notes, reactions),
	// each of one to a few narrow filters: hence a burst of 50.
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
	// Three seconds of shaping: a client that opens three times a burst
	// at once (a page opening all its columns) is paced through it and
	// refused nothing. After a burst of R from rest a window (R, T) admits
	// about R·ln2 per T, so 2R more take 2T/ln2, 2.9 s for the one-second
	// windows above; a client over a minute's window, whose waits are
	// seconds to minutes, is told its wait, and so is one that stays over
	// its budget (see relay.Options: the delay counts from the first frame
	// held). A held frame pauses its connection's reading that long at
	// most.
	l.MaxDelay = 3 * time.Second
	// Read: 16 MiB a minute. A burst of 16 MiB from rest, then about
	// 11 MiB a minute (190 KiB/s). A client following a timeline reads
	// about 2 MiB a minute (a few hundred events of a few KiB, with their
	// profiles and reactions): a fifth of the sustained rate, and a
	// start-up that loads a day of a large follow list fits the burst. A
	// scraper repeating {"kinds":[1],"limit":500} pulls 0.5 to 1 MiB per
	// REQ: the burst is gone in seconds, and it is then held to the
	// sustained rate on all its connections together.
	l.Read = []ratelimit.Limit{ratelimit.PerPeriod(16<<20, time.Minute)}
	return l
}
