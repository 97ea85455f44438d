// Package policy is how sluice's charging rules are configured: what a
// frame costs and who pays, for the gate (package relay) and the framework
// hooks (package relay/hooks) alike, through one value of type Config.
//
// A Config holds the address's Limits (per message type and per
// connection), the frame Bounds, the EVENT kind classes, the member tiers,
// the prefix aggregates, shadow mode, the actor quota and the Identity
// (how a request becomes a client, and the allow-lists of those charged
// nothing). Its zero value is the defaults. Config.Validate reports all
// that a gate would refuse, each a FieldError naming its field; the gate and the hooks compile a Config once, on New
// and on Reload, and only read the result per frame. Observer is how their
// decisions are seen (metrics callbacks, by Outcome).
//
// It imports ratelimit, relay/wire and the gate's scanner
// (relay/internal/scan), and nothing that does I/O.
package policy
