// Package relay is the Nostr side of sluice: it puts the limits of package
// ratelimit in front of a relay, either as a gate that reads every client
// frame before the relay does, or as hooks in a Go relay framework.
//
// # The gate
//
// A Gate (New) is an http.Handler factory. Wrap serves a Go relay that is
// an http.Handler in the same process (http.ListenAndServe(addr,
// gate.Wrap(relay)), bridged over in-memory pipes, no TCP port); Proxy
// serves any relay at a ws:// or wss:// URL. Plain HTTP requests (NIP-11,
// web pages) pass to the relay ungated.
//
// Per WebSocket upgrade the gate charges the client's connection limit. A
// refusal is HTTP 429 with a Retry-After header; a store that cannot decide
// gets HTTP 503 with the body "error: rate limiter unavailable". Only then
// does it open the relay's side, and only when the relay accepts does it
// upgrade the client.
//
// Per client frame, text or binary (khatru reads binary frames as text),
// it learns the message type with Peek: the first JSON string of the
// frame, decoded as the relay would decode it (whitespace and escapes
// included), mapped onto a fixed set of types (EVENT, REQ, CLOSE, COUNT,
// AUTH, NEG-OPEN, NEG-MSG, NEG-CLOSE, and TypeOther for everything else),
// so a client cannot mint a bucket by inventing labels. The frame is charged to that type's limits
// (Limits.Message) under the key "{client}:message:TYPE" through a
// ratelimit.Limiter, which answers a client it has already refused from a
// local table without a store call. A refused frame is answered by the gate
// and never reaches the relay; an admitted one is forwarded byte for byte,
// and every relay frame comes back unchanged. DefaultLimits charges every
// type but CLOSE and NEG-CLOSE (refusing them would only keep a
// subscription open), and charges TypeOther: a frame with an unknown label
// still costs the relay a read. A frame that is not shaped as a Nostr
// message at all (an array whose first element is a string) is charged to
// TypeOther too, but answered by the gate instead of forwarded, because
// relays read such frames differently: khatru takes the first quoted
// string anywhere in the frame as its label, so [0,"EVENT",{…}] is an
// EVENT to it, and with negentropy on it panics on [1,"X"].
//
// With an actor quota (Options.Quota) the gate also caps the events each
// pubkey may have accepted per window, charging an actor when the relay
// answers OK true to an EVENT the gate forwarded.
//
// Each connection has one writer per socket, keepalive pings both ways, a
// read limit, and a bounded queue towards the client: a client that reads
// too slowly is disconnected rather than holding up the relay, and a slow
// relay holds up only its own connection. Shutdown closes every connection
// on both sides and waits for its goroutines.
//
// # Identity
//
// An Identity turns a request into the client a budget belongs to: the TCP
// peer's address, IPv4 whole and IPv6 grouped by prefix (/64 by default). A
// forwarding header (X-Forwarded-For, X-Real-IP) is believed only from a
// trusted-proxy network, read from the right. An AllowList exempts
// networks, and pubkeys a connection has authenticated as (NIP-42), from
// every limit. The relay learns the client's
// address from X-Forwarded-For and X-Real-IP, which the gate sets, having
// removed every client-address header the client sent.
//
// # Replies
//
// Refusals follow NIP-01 (AppendRefusal): an EVENT or AUTH gets
// ["OK",<id>,false,<reason>] (a NOTICE when its id cannot be found), a REQ
// or COUNT gets ["CLOSED",<sub id>,<reason>], anything else a NOTICE. The
// reason is "rate-limited: slow down; retry in Ns" for a limit, the wait
// rounded up to whole seconds so that a client that waits as told is
// admitted, or "error: rate limiter unavailable" (ReasonUnavailable) when
// the store could not decide: the gate fails closed, and never calls an
// outage of its own a rate limit.
//
// # Hooks
//
// Hooks (NewHooks) charge the same budgets from inside khatru (Khatru) or
// rely (Rely), with functions whose types fit those frameworks' hook slots;
// the package imports neither framework. They are weaker than a gate, and
// the Hooks type says how: they see only the messages the framework has
// parsed and hands to a hook (never CLOSE, AUTH, NEG-MSG, NEG-CLOSE, unknown
// labels or frames that do not parse, so those are never charged); the
// framework has already read and parsed the message (khatru has checked its
// signature too) when the hook runs; and a refused connection gets the
// framework's own answer (khatru's bare 429, rely's 403) with no
// Retry-After, whether a limit or an outage refused it.
package relay
