// Package relay puts the limits of package ratelimit in front of a Nostr
// relay: a Gate reads every client frame before the relay does, charges it
// to the client's budget, and forwards it only when it is admitted and in
// the one shape every relay reads alike. A refusal is answered by the gate
// with the NIP-01 reply of its type and never reaches the relay.
//
// There are three ways in:
//
//   - Gate.Wrap serves a Go relay that is an http.Handler in the same
//     process (http.ListenAndServe(addr, gate.Wrap(relay))). The relay's
//     own WebSocket code serves the client, and the gate sits inside the
//     socket it hijacks: no second connection, no second handshake.
//   - Gate.Proxy serves any relay at a ws:// or wss:// URL, bridging the
//     client's WebSocket to one of its own.
//   - Package relay/hooks charges the same budgets from a relay
//     framework's hook slots (khatru, rely), for messages the framework
//     has already parsed.
//
// New builds a Gate from Options; its Policy field (package relay/policy)
// is what the gate charges, and its zero value is the defaults. The gate
// and the hooks compile it the same way and read frames with the same
// scanner (internal to relay), so they cannot disagree on what a frame
// costs. The one clock is the Limiter's (the one given to
// ratelimit.NewLimiter).
//
// The rules the gate keeps on the wire are in docs/protocol.md: which
// frames reach the relay and in what shape, how each refusal is worded,
// how NIP-42 AUTH is verified and the actor quota charged, what the retry
// hint promises, and how slow readers and control frames are bounded.
// docs/limits.md has whose budget a frame is charged to and the math of a
// limit.
package relay
