//go:build !unix

package relay

import (
	"net"
	"syscall"
)

// The portable path: no write on the socket's descriptor that is sure not
// to wait (Windows sockets are written through the runtime's completion
// port), so every write to a tapped client is queued and written by the
// flush goroutine, with the write timeout to make progress (writeSock), as
// on a connection without a descriptor.

// sockConn returns nil: every write is queued.
func sockConn(net.Conn) syscall.RawConn { return nil }

// writeOn takes nothing of t.wv (tryWrite queues it all). It is never
// reached while sockConn returns nil.
func (t *tapConn) writeOn(uintptr) bool { return true }
