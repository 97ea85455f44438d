package relay

import (
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// unsentBytes returns the bytes conn's socket holds that the peer has not
// acknowledged (SIOCOUTQ), and whether it could tell: a count that falls
// while a write is blocked is a client that reads.
func unsentBytes(conn net.Conn) (int, bool) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var n int32
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n)))
	}); err != nil || errno != 0 {
		return 0, false
	}
	return int(n), true
}

// ackedBytes returns how many bytes the peer has acknowledged on conn's
// socket since it opened (TCP_INFO's bytes_acked), and whether it could
// tell.
func ackedBytes(conn net.Conn) (int64, bool) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ierr != nil {
		return 0, false
	}
	return int64(info.Bytes_acked), true
}
