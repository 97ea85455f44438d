package redistest

import "testing"

func TestStartKillRestart(t *testing.T) {
	s := Start(t)
	if err := s.ping(); err != nil {
		t.Fatalf("fresh server does not answer: %v", err)
	}
	s.Kill()
	if err := s.ping(); err == nil {
		t.Fatal("killed server still answers PING")
	}
	s.Restart()
	if err := s.ping(); err != nil {
		t.Fatalf("restarted server does not answer: %v", err)
	}
}

// outcomeTB records how a test was first ended, failed or skipped,
// without ending the goroutine that asked (so what follows the end runs
// too, and is not recorded).
type outcomeTB struct {
	testing.TB
	first string
}

func (o *outcomeTB) end(how string) {
	if o.first == "" {
		o.first = how
	}
}

func (o *outcomeTB) Helper()               {}
func (o *outcomeTB) Fatalf(string, ...any) { o.end("failed") }
func (o *outcomeTB) Skipf(string, ...any)  { o.end("skipped") }

// TestMissingBinaryFailsInCI: without redis-server, a test is skipped on a
// developer's machine and fails in CI (CI=true, as for PostgreSQL, or
// REQUIRE_REDIS=1).
func TestMissingBinaryFailsInCI(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, c := range []struct{ ci, require, want string }{
		{"", "", "skipped"}, {"true", "", "failed"}, {"", "1", "failed"},
	} {
		t.Setenv("CI", c.ci)
		t.Setenv("REQUIRE_REDIS", c.require)
		o := &outcomeTB{}
		Binary(o)
		if o.first != c.want {
			t.Errorf("CI=%q REQUIRE_REDIS=%q: %s, want %s", c.ci, c.require, o.first, c.want)
		}
	}
}
