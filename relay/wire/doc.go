// Package wire names what a configuration says about Nostr client frames:
// the message types budgets are kept for (Type, the index of
// policy.Limits.Message), the Bounds on what one frame may ask of the
// relay, the longest subscription id, and the one check of whether an
// HTTP request asks for a WebSocket (IsUpgrade).
//
// The gate's bounded scanner, which reads frames against these names and
// writes its replies, is internal to package relay: no caller outside it
// needs the facts it reads, and keeping it unexported lets its reading
// change with the relays it defends without breaking an API. It imports
// only the standard library.
package wire
