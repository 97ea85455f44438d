// Package policy is sluice's charging rules: what a frame costs and who
// pays, compiled once and read by the gate (package relay) and the
// framework hooks (package relay/hooks) alike, so that the two cannot
// disagree.
//
// Compile turns a Config — the address's Limits (per message type and per
// connection), the EVENT kind classes, the member tiers, the prefix
// aggregates, shadow mode, the actor quota and the Identity — into a
// Policy: every limit validated, every set of windows prepared
// (ratelimit.Windows) with its key suffixes and script arguments and split
// into the windows that enforce and those in shadow, and REQ's windows for
// every filter count, since a REQ of n filters costs n REQs.
// Identity turns a request into the client a budget belongs to (IPv4
// whole, IPv6 by prefix, forwarding headers only from trusted proxies), and
// AllowList says who is charged nothing and for what. Observer and
// Offenders are how a decision is seen: metrics callbacks, and a bounded
// view of the clients refused most.
//
// It imports ratelimit and relay/wire, and nothing that does I/O.
package policy
