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
