// Package redistest starts throwaway redis-server processes on free loopback
// ports for tests, so that tests can kill, restart and flush them without
// touching anyone else's data.
//
// When redis-server is not on PATH the test is skipped, unless the
// environment sets CI=true or REQUIRE_REDIS=1 (as CI does), in which case
// it fails.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is one redis-server process owned by a test.
type Server struct {
	tb   testing.TB
	bin  string
	dir  string
	args []string
	Port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Binary returns the path of redis-server, skipping (or, under CI=true or
// REQUIRE_REDIS=1, failing) the test when there is none.
func Binary(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" || os.Getenv("REQUIRE_REDIS") == "1" {
			tb.Fatalf("redis-server not found and CI=true or REQUIRE_REDIS=1: %v", err)
		}
		tb.Skipf("redis-server not found (set REQUIRE_REDIS=1 to make this a failure): %v", err)
	}
	return bin
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// freeBusPort returns a loopback port that was free a moment ago together
// with port+10000, which a Redis Cluster node listens on for its bus: a
// node whose bus port is taken exits at start.
func freeBusPort(tb testing.TB) int {
	tb.Helper()
	for range 100 {
		p := FreePort(tb)
		if p+10000 > 65535 {
			continue
		}
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000)); err == nil {
			l.Close()
			return p
		}
	}
	tb.Fatal("no free port with a free cluster bus port")
	return 0
}

// Start starts a redis-server on a free loopback port with no persistence and
// stops it when the test ends. Extra arguments are passed to redis-server
// (for example "--cluster-enabled", "yes").
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	port := FreePort(tb)
	if slices.Contains(extra, "--cluster-enabled") {
		port = freeBusPort(tb)
	}
	s := &Server{tb: tb, bin: Binary(tb), dir: tb.TempDir(), Port: port}
	s.args = append([]string{
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--protected-mode", "no",
	}, extra...)
	s.start()
	tb.Cleanup(s.Kill)
	return s
}

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns "redis://127.0.0.1:port/0".
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

func (s *Server) start() {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	logPath := filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err != nil {
		s.tb.Fatalf("redis log: %v", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("start redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s.ping() == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			s.tb.Fatalf("redis-server on %s did not answer PING within 10s; its log:\n%s", s.Addr(), log[max(0, len(log)-2000):])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping sends a raw PING and expects +PONG.
func (s *Server) ping() error {
	c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

// Kill stops the server with SIGKILL and waits until the process has
// exited (so its files, such as a cluster node's locked nodes.conf, are
// free for a restart) and its port refuses connections. It is safe to call
// more than once.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.ping() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *Server) signal(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Restart starts the server again on the same port (empty: nothing is saved).
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	s.start()
}
