//go:build !unix

package pgtest

import "os/exec"

func own(string) error { return nil }

func asServerUser(*exec.Cmd) {}
