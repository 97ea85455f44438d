package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-relay/sluice/internal/redistest"
)

// sluice check --redis dials the store: a Redis that answers passes, one
// that is not there fails the check (exit 1, named), and --offline skips
// the dial.
func TestCheckDialsRedis(t *testing.T) {
	srv := redistest.Start(t)
	absent := fmt.Sprintf("redis://127.0.0.1:%d/0", redistest.FreePort(t))
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"check", "--redis", srv.URL()}, exitOK, "redis: answered PING"},
		{[]string{"check", "--redis", absent}, exitFailure, "did not answer PING"},
		{[]string{"check", "--offline", "--redis", absent}, exitOK, ""},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, func(string) string { return "" }, &out, &errb)
		all := out.String() + errb.String()
		if code != tc.code || !strings.Contains(all, tc.out) {
			t.Errorf("%v: exit %d, want %d with %q; output:\n%s", tc.args, code, tc.code, tc.out, all)
		}
		if tc.out == "" && strings.Contains(all, "PING") {
			t.Errorf("%v dialed Redis:\n%s", tc.args, all)
		}
	}
}
