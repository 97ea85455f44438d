//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package noderelay

import (
	"os"
	"sync"
	"syscall"
)

// lockFile takes an exclusive lock on path (created if missing), waiting
// for another process that holds it, and returns its release (safe to
// call twice): test binaries of several packages run at once and share
// the cache directory.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { f.Close() }) }, nil // closing releases the lock
}
