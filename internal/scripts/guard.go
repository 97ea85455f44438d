package scripts

import _ "embed"

// Guard is the source of guard.lua: a client's open connections per gate
// instance (leases that expire unless renewed) and the penalty box's
// records, decided on Redis TIME. Its header comment documents KEYS, ARGV
// and the replies.
//
//go:embed guard.lua
var Guard string
