// Package scripts holds sluice's Redis Lua sources, embedded at build time so
// that the binary and the tests run exactly the file under review.
package scripts

import _ "embed"

// EWMA is the source of ewma.lua: multi-window EWMA decisions (read, decay,
// admit-all-or-nothing, write with a TTL, idempotent by request id), one or
// more per call, each atomic and decided in order, of one client or of
// several. Its header comment documents KEYS, ARGV and the reply.
//
//go:embed ewma.lua
var EWMA string

// EWMA1 is the source of ewma1.lua: the lean call of EWMA for one decision
// sent alone, without a request id (for a client that never resends a
// command). Same decisions, stored values and reply as EWMA deciding one
// message with request id "".
//
//go:embed ewma1.lua
var EWMA1 string

// Quota is the source of quota.lua: the actor quota's fixed windows in
// Redis, one key per actor holding its window and count with a TTL of the
// rest of the window, numbered from Redis TIME (or a given instant). Its
// header comment documents KEYS, ARGV and the reply.
//
//go:embed quota.lua
var Quota string
