// Package scripts holds sluice's Redis Lua sources, embedded at build time so
// that the binary and the tests run exactly the file under review.
package scripts

import (
	"embed"
	"strings"
)

// pieces are the Lua parts several scripts share, each written once and
// spliced into every script that names it (see include).
//
//go:embed decay.lua waitms.lua clock.lua keptid.lua room.lua
var pieces embed.FS

//go:embed ewma.lua
var ewmaSource string

//go:embed ewma1.lua
var ewma1Source string

// EWMA is the source of ewma.lua: multi-window EWMA decisions (read, decay,
// admit-all-or-nothing, write with a TTL, idempotent by request id), one or
// more per call, each atomic and decided in order, of one client or of
// several. Its header comment documents KEYS, ARGV and the reply.
var EWMA = include(ewmaSource)

// EWMA1 is the source of ewma1.lua: the lean call of EWMA for one decision
// of one or two windows sent alone, with a request id or without (for a
// client that never resends a command), and optionally an actor quota's
// room decided with it. Same decisions, stored values and reply as EWMA
// deciding that one message (with the room: the two as one group).
var EWMA1 = include(ewma1Source)

//go:embed refund.lua
var refundSource string

// Refund is the source of refund.lua: it takes one admission back off a
// key (what its cost still weighs, decayed), for a message whose budgets
// span masters of a Redis Cluster and that another master refused. Its
// header comment documents KEYS, ARGV and the reply.
var Refund = include(refundSource)

// Quota is the source of quota.lua: the actor quota's fixed windows in
// Redis, one key per actor holding its window and count with a TTL of the
// rest of the window, numbered from Redis TIME (or a given instant). Its
// header comment documents KEYS, ARGV and the reply.
//
//go:embed quota.lua
var Quota string

// EWMACluster is EWMA for a master of Redis Cluster 7.0 or later: one call
// decides messages of any clients whose keys that master serves, although
// their keys are in different slots. Redis refuses a call whose declared
// keys are in different slots (CROSSSLOT, flag or not), so only the first
// decision's key is declared (it routes the call, and Redis redirects it if
// its slot moved); the other decisions' keys follow EWMA's arguments, then
// their count. The shebang's allow-cross-slot-keys lets the script touch
// them, and Redis still refuses, before anything is written, a key this
// master does not serve or a missing key of a slot migrating away ("Script
// attempted to access a non local key"): every value is read up front, one
// GET per key (a cross-slot MGET is refused even so), before the first
// write. The store then decides that call's messages one by one, each
// routed by go-redis. The rest is EWMA, byte for byte (the same replies and
// stored values on random batches: TestBatchEqualsAlone); a Redis older
// than 7.0 does not compile the shebang, and the store then sends one
// decision per call.
//
// Arguments: KEYS[1] the first decision's key; ARGV EWMA's arguments, then
// the keys of decisions 2..m, then m-1.
var EWMACluster = clusterVariant(EWMA)

// clusterMGET is what EWMA reads every key with, replaced in EWMACluster.
const clusterMGET = "redis.call('MGET', tunpack(KEYS))"

// clusterPrelude rebuilds KEYS and ARGV as EWMA reads them, and reads keys
// one GET each.
const clusterPrelude = `#!lua flags=allow-cross-slot-keys
-- ewma.lua for a Redis Cluster master: see scripts.EWMACluster.
local KEYS, ARGV = KEYS, ARGV
do
  local na = #ARGV
  local x = tonumber(ARGV[na])
  if not (#KEYS == 1 and x and x >= 0 and x % 1 == 0 and x <= na - 1) then
    return redis.error_reply('ERR sluice ewma: want one declared key and the count of the others last')
  end
  local k, a = {KEYS[1]}, {}
  for i = 1, na - 1 - x do a[i] = ARGV[i] end
  for i = 1, x do k[i + 1] = ARGV[na - 1 - x + i] end
  KEYS, ARGV = k, a
end
local function getEach(keys)
  local v = {}
  for i = 1, #keys do v[i] = redis.call('GET', keys[i]) end
  return v
end
`

func clusterVariant(src string) string {
	if strings.Count(src, clusterMGET) != 1 {
		panic("scripts: ewma.lua must read its keys with exactly one " + clusterMGET)
	}
	return clusterPrelude + strings.Replace(src, clusterMGET, "getEach(KEYS)", 1)
}

// includeMark starts a line that include replaces with the named piece.
const includeMark = "-- #include "

// include returns src with every line "-- #include <piece>" (indentation
// aside) replaced by that piece's source. It panics on a piece that does
// not exist: the sources are embedded, so that is a build mistake, and
// every test that loads a script finds it.
func include(src string) string {
	var b strings.Builder
	for line := range strings.Lines(src) {
		name, ok := strings.CutPrefix(strings.TrimLeft(line, " "), includeMark)
		if !ok {
			b.WriteString(line)
			continue
		}
		piece, err := pieces.ReadFile(strings.TrimSpace(name))
		if err != nil {
			panic("scripts: " + err.Error())
		}
		b.Write(piece)
	}
	return b.String()
}
