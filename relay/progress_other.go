//go:build !linux

package relay

import "net"

// unsentBytes cannot tell on this system: a blocked write shows progress
// only by the bytes it takes (writeProgressing).
func unsentBytes(net.Conn) (int, bool) { return 0, false }

// ackedBytes cannot tell on this system: a client's keepalive is its
// answers to pings alone.
func ackedBytes(net.Conn) (int64, bool) { return 0, false }
