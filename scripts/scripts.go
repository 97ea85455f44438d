// Package scripts holds sluice's Redis Lua sources, embedded at build time so
// that the binary and the tests run exactly the file under review.
package scripts

import _ "embed"

// EWMA is the source of ewma.lua: the atomic multi-window EWMA decision
// (read, decay, admit-all-or-nothing, write with a TTL, idempotent by
// request id). Its header comment documents KEYS, ARGV and the reply.
//
//go:embed ewma.lua
var EWMA string
