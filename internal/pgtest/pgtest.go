// Package pgtest starts throwaway PostgreSQL servers for tests: initdb into
// a temporary directory, then postgres on a free loopback port with its
// unix socket in that directory, so that tests can stop and fill them
// without touching anyone else's database (never the one on 5432).
//
// The binaries are looked for on PATH and then in Debian's
// /usr/lib/postgresql/<version>/bin (the newest version first). When there
// are none the test is skipped, unless the environment sets CI=true or
// REQUIRE_POSTGRES=1, in which case it fails. PostgreSQL refuses to run as
// root: as root, the server runs as the user "postgres" (or "nobody").
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/lib/pq" // the driver eventstore's backend uses

	"github.com/sluice-relay/sluice/internal/redistest"
)

// Server is one PostgreSQL server owned by a test.
type Server struct {
	tb   testing.TB
	bin  string // the directory of initdb, pg_ctl and postgres
	dir  string // data directory, socket directory and log
	Port int

	mu      sync.Mutex
	running bool
}

// binDir returns the directory holding initdb and pg_ctl, or "" when there
// is none.
func binDir() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { // newest first: 16 before 9
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

// required reports whether a missing PostgreSQL fails the test.
func required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("REQUIRE_POSTGRES") == "1"
}

// Start initialises a cluster in a fresh temporary directory, starts it on
// a free loopback port and stops it (and removes the directory) when the
// test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin := binDir()
	if bin == "" {
		if required() {
			tb.Fatal("pgtest: initdb not found (install Debian's postgresql package) and CI=true or REQUIRE_POSTGRES=1")
		}
		tb.Skip("pgtest: initdb not found (set REQUIRE_POSTGRES=1 to make this a failure)")
	}
	// Not tb.TempDir: its parent is private to root, and the server may
	// run as another user.
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if err := own(dir); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	s := &Server{tb: tb, bin: bin, dir: dir, Port: redistest.FreePort(tb)}
	out, err := s.command("initdb", "-D", s.data(), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		tb.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	s.start()
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// command runs a PostgreSQL binary as the user the server runs as.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	asServerUser(cmd)
	return cmd
}

func (s *Server) start() {
	s.tb.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200",
		s.Port, s.dir)
	out, err := s.command("pg_ctl", "-D", s.data(), "-l", filepath.Join(s.dir, "log"), "-o", opts, "-w", "-t", "60", "start").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		s.tb.Fatalf("pgtest: pg_ctl start: %v\n%s\nserver log:\n%s", err, out, log)
	}
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
}

// Stop stops the server at once (pg_ctl -m immediate: no checkpoint, as a
// crash would). It is safe to call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return
	}
	s.running = false
	_ = s.command("pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "stop").Run()
}

// Restart starts a stopped server again on the same port with the same
// data.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.start()
}

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns the URL of database db on this server as user postgres.
func (s *Server) URL(db string) string {
	return "postgres://postgres@" + s.Addr() + "/" + db + "?sslmode=disable"
}

// NewDatabase creates a database of its own for a test and returns its URL.
func (s *Server) NewDatabase(name string) string {
	s.tb.Helper()
	db, err := sql.Open("postgres", s.URL("postgres"))
	if err != nil {
		s.tb.Fatalf("pgtest: %v", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+quoteIdent(name)); err != nil {
		s.tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	return s.URL(name)
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
