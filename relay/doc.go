// Package relay is the Nostr side of sluice: it puts the limits of package
// ratelimit in front of a relay, either as a gate that reads every client
// frame before the relay does, or as hooks in a Go relay framework.
//
// # The gate
//
// A Gate (New) is an http.Handler factory. Wrap serves a Go relay that is
// an http.Handler in the same process (http.ListenAndServe(addr,
// gate.Wrap(relay))) by tapping the client's socket (see tapConn): the
// relay's own WebSocket code upgrades and serves the client, and the gate
// sits inside the connection it hijacks. The relay reads only frames the
// gate wrote: the gate reads the client's frames itself, decides each
// message and hands the relay what it forwards, re-framed; the relay's
// frames go to the client as the relay wrote them, read by the gate on
// their way (its answers watched, its fragmented messages sent whole, the
// gate's own replies put between its messages). No second connection, no
// second handshake and no goroutine of the gate's: a connection costs what
// the relay's own does (khatru: two goroutines). Proxy serves any relay at
// a ws:// or wss:// URL, bridging two WebSockets with three goroutines per
// connection. A WebSocket upgrade is what wire.IsUpgrade says (GET, Connection:
// upgrade, Upgrade: websocket); every other request is plain HTTP (NIP-11,
// web pages) and passes to the relay ungated on GET, HEAD, OPTIONS and
// Options.PlainMethods only, its body bounded by Options.PlainBodyLimit.
//
// Per WebSocket upgrade the gate charges the client's connection limit. A
// refusal is HTTP 429 with a Retry-After header; a store that cannot decide
// gets HTTP 503 with the body "error: rate limiter unavailable". Only then
// does it open the relay's side, and only when the relay accepts does it
// upgrade the client (Wrap: the relay upgrades it, or refuses).
//
// Per client frame, text or binary (khatru reads binary frames as text),
// it learns the message type with Peek (package relay/wire): the first
// JSON string of the frame, decoded as the relay would decode it, mapped
// onto a fixed set of types (EVENT, REQ, CLOSE, COUNT, AUTH, NEG-OPEN,
// NEG-MSG, NEG-CLOSE, and TypeOther for everything else), so a client
// cannot mint a bucket by inventing labels. A client the limiter has
// already refused for that type is answered from its local table at once.
// Otherwise the frame is read whole by wire.Scan, charged to its type's
// limits (Limits.Message) under the key "{client}:message:TYPE" — a REQ
// once per filter —, and forwarded only when it is canonical: a shape
// every relay reads as the gate did (see wire.Scan), within its type's
// frame bound (Options.FrameSize) and, for a REQ, the policy's filter bound
// (policy.Config.Bounds.MaxFilters).
// Anything else — unknown labels included — is charged and answered by
// the gate with the NIP-01 reply of its type and an "invalid:" reason,
// never forwarded. A forwarded frame goes byte for byte, as a text frame.
// DefaultLimits charges every type but CLOSE and NEG-CLOSE (refusing them
// would only keep a subscription open), and charges TypeOther.
//
// NIP-42 is verified by the gate, never inferred: it records the
// challenges the relay sends on each connection and forwards an AUTH only
// when its event names one of them, names this relay (Options.RelayURL,
// which a policy granting by pubkey requires: Options.Validate),
// is within maxAuthAge of the gate's clock, and has a valid id and
// signature; the connection is bound to the pubkey when the relay then
// answers OK true.
//
// Control frames (pings, pongs, the fragments of a message) are bounded
// per connection: a client whose stream carries more than a small budget
// of bytes that are not message payload is closed with 1008.
//
// With an actor quota (Options.Policy.Quota) the gate also caps the events each
// pubkey may have accepted per window, charging an actor when the relay
// answers OK true to an EVENT the gate forwarded, once per event id per
// connection and window however often it is re-sent. With Options.Stored
// an accepted event is one the relay stored, and it is charged whether or
// not its OK reaches the gate (a client can keep the OKs behind a reply
// it does not read): after one to two seconds without an OK, or when the
// connection ends, the relay's store is asked (see DefaultPending).
// Without it (Proxy) the gate reads the relay's answers on for up to 2 s
// after a client has gone with events awaiting their OK, and charges
// those the relay accepted.
//
// Behind Proxy, each connection has one writer per socket, keepalive pings
// both ways, a read limit, and a queue towards the client bounded in bytes:
// when it is full the connection waits (the relay's next answers in the
// relay's socket, the client's next requests in the client's), so a client
// that reads slowly slows its own relay connection rather than being cut,
// and a client whose socket takes less than 64 KiB in the write timeout,
// while there is more to send, is cut as a slow reader; a slow relay holds
// up only its own connection. In Wrap
// mode the relay writes to the client's socket through the gate, which
// writes what the socket takes at once and queues the rest, up to the
// same bound, for a goroutine that runs only while the queue holds
// anything; past the bound the relay's writer waits. Every 64 KiB of a
// queued write has the write timeout to go: a client whose socket takes
// less is cut as a slow reader (plain khatru sets no write deadline and
// would wait for ever). The gate's own goodbye (a close code of its own:
// shutdown, a knocking client) follows what is queued, written within a
// second, or the socket is closed without it. The keepalive is the
// relay's own. Shutdown closes every connection on both sides and waits
// for its goroutines.
//
// # Identity
//
// An Identity turns a request into the client a budget belongs to: the TCP
// peer's address, IPv4 whole and IPv6 grouped by prefix (/64 by default). A
// forwarding header (X-Forwarded-For, X-Real-IP) is believed only from a
// trusted-proxy network, read from the right. The allow-lists exempt
// networks, and pubkeys a connection has authenticated as (NIP-42), from
// every limit, and an EVENT's allow-listed author from the quota only (see
// policy.Identity). The relay learns the client's
// address from X-Forwarded-For and X-Real-IP, which the gate sets, having
// removed every client-address header the client sent.
//
// # Replies
//
// Refusals follow NIP-01 (AppendRefusal): an EVENT or AUTH gets
// ["OK",<id>,false,<reason>] (a NOTICE when its id cannot be found), a REQ
// or COUNT gets ["CLOSED",<sub id>,<reason>], a NEG-OPEN or NEG-MSG
// ["NEG-ERR",<sub id>,<reason>], anything else a NOTICE. The
// reason is "rate-limited: slow down; retry in Ns" for a limit, the wait
// rounded up to whole seconds so that a client that waits as told is
// admitted, or "error: rate limiter unavailable" (ReasonUnavailable) when
// the store could not decide: the gate fails closed, and never calls an
// outage of its own a rate limit.
//
// A client told that a subscription is closed — by the gate's CLOSED, by
// the relay's, or by its own CLOSE — hears nothing more under it: the
// relay may still be streaming to it (khatru handles the CLOSE the gate
// sends on a goroutine of its own), so the gate drops the relay's EVENT
// and EOSE under the id until a REQ under it is forwarded again (the last
// 16 such ids per connection; see subTable).
//
// # Beside the gate
//
// The charging rules are configured by package relay/policy (Config) and
// compiled once, with identity and the allow-lists, by an internal package
// that the gate and the framework adapters of package relay/hooks (khatru's
// and rely's hook slots) share, so the two cannot disagree on what a frame
// costs. Frames are read by package relay/wire, the one scanner. The one clock is the Limiter's
// (ratelimit.NewLimiter).
package relay
