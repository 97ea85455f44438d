//go:build !unix

package main

import (
	"errors"
	"syscall"
)

// setRcvbuf is not supported here: the slow-reader modes need a Unix
// socket buffer to shape the window the relay sees.
func setRcvbuf(syscall.RawConn, int) error {
	return errors.New("sluice-load: -rcvbuf needs a Unix system")
}
