//go:build unix

package pgtest

import (
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
)

// serverUser is the user the server runs as when the tests run as root
// (initdb and postgres refuse root); nil otherwise.
func serverUser() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 == nil && err2 == nil {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		}
	}
	return nil
}

// own gives dir to the server's user.
func own(dir string) error {
	if c := serverUser(); c != nil {
		return os.Chown(dir, int(c.Uid), int(c.Gid))
	}
	return nil
}

func asServerUser(cmd *exec.Cmd) {
	if c := serverUser(); c != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c}
	}
}
