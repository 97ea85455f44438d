//go:build unix

package main

import "syscall"

// setRcvbuf sets a socket's receive buffer before it connects.
func setRcvbuf(rc syscall.RawConn, n int) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, n)
	})
	if err != nil {
		return err
	}
	return serr
}
