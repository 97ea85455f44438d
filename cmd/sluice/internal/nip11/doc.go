// Package nip11 serves NIP-11 relay information documents with sluice's
// limits in them: Merge writes the bounds the gate enforces (read limit,
// filters, subscription id length, subscriptions) into a document's
// limitation object and adds a top-level rate_limits object with every
// window, what it allows, and the actor quota; Handler serves a document
// fetched from the relay (proxy mode) or built in (relay mode), cached on
// the one clock. It lives beside the gate, not in it: the binary wires it.
package nip11
