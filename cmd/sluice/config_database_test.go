package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestConfigDatabase: database is taken from the flag, SLUICE_DATABASE or
// the file; anything but a postgres:// URL with a host is refused with the
// field named and without echoing the value, which may hold a password.
func TestConfigDatabase(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		ok   bool
	}{
		{"flag", []string{"--database", "postgres://u:pw@db:5432/x"}, nil, true},
		{"postgresql scheme", []string{"--database", "postgresql://u@db/x"}, nil, true},
		{"env", nil, map[string]string{"SLUICE_DATABASE": "postgres://u:pw@db/x"}, true},
		{"mysql", []string{"--database", "mysql://u:secretpw@db/x"}, nil, false},
		{"no host", nil, map[string]string{"SLUICE_DATABASE": "postgres:///x?password=secretpw"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), append([]string{"check"}, tc.args...), env(tc.env), &out, &errb)
			if tc.ok != (code == exitOK) {
				t.Fatalf("exit %d, want ok=%v\n%s", code, tc.ok, errb.String())
			}
			if tc.ok {
				if !strings.Contains(out.String(), "events (sluice relay): postgres") || strings.Contains(out.String(), ":pw@") {
					t.Errorf("check does not name the database, or shows its password:\n%s", out.String())
				}
			}
			if !tc.ok {
				if !strings.Contains(errb.String(), "database") {
					t.Errorf("error does not name database: %s", errb.String())
				}
				if strings.Contains(errb.String(), "secretpw") {
					t.Errorf("error echoes the password: %s", errb.String())
				}
			}
		})
	}
}
