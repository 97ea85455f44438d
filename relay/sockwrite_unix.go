//go:build unix

package relay

import (
	"net"
	"syscall"
)

// This file holds the tap's direct write to the client's socket: one
// system call on the socket's descriptor that takes what the kernel
// accepts without waiting and never parks the writer (tryWrite). Where the
// system has no such call (sockwrite_other.go) every write goes through
// the queue.

// sockConn returns raw's descriptor for writes that do not wait, or nil
// when raw has none (then every write is queued: writeSock).
func sockConn(raw net.Conn) syscall.RawConn {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// writeOn is tryWrite's write on the socket's descriptor: t.wv, as far as
// the socket takes it without waiting, the rest left in t.wv. A method
// value made once per connection (newTap), so that a write allocates no
// closure.
func (t *tapConn) writeOn(fd uintptr) bool {
	for len(t.wv) > 0 {
		b := t.wv[0]
		if len(b) == 0 {
			t.wv = t.wv[1:]
			continue
		}
		n, e := syscall.Write(int(fd), b)
		if e == syscall.EINTR {
			continue
		}
		if e != nil {
			if e != syscall.EAGAIN {
				t.werr = e
			}
			return true
		}
		t.wv[0] = b[n:]
		if n < len(b) {
			return true // the socket is full
		}
		t.wv = t.wv[1:]
	}
	return true
}
