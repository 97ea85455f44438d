// Package hooks charges the messages a relay framework has already parsed
// to the same budgets a gate (package relay) would, for operators who prefer
// the framework's hook slots to a gate in front of it: Hooks.Khatru returns
// functions whose types fit khatru's Reject*/OnConnect/OnEventSaved fields,
// Rely those of rely's Reject.* slices. The package imports neither
// framework; it learns a client's address and NIP-42 pubkey only through
// functions the caller passes.
//
// The rules are the gate's: New compiles the limits with charge.Compile,
// and an EVENT pays its windows first and then the actor quota, with the
// allow-list rule of policy.Identity. What hooks cannot do that a gate does
// — see Hooks — follows from where a framework calls them.
//
// It imports go-nostr (the parsed types), relay/policy, relay/wire, the
// gate's scanner and compiled policy (relay/internal) and
// ratelimit.
package hooks
