// Package noderelay starts, for tests, a Nostr relay not written in Go:
// @nostr-relay/core (TypeScript, SQLite), the server in testdata/noderelay.
// It installs the server's packages (npm ci, from the committed
// package-lock.json) into a cache directory once, and starts the server on
// a free loopback port. Without node and npm a test is skipped, unless CI
// is set: then it fails.
package noderelay

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// sourceDir is testdata/noderelay at the top of the module, found from
// this file's own path so that a test of any package can start the relay.
func sourceDir(t testing.TB) string {
	t.Helper()
	if _, file, _, ok := runtime.Caller(0); ok {
		dir := filepath.Join(filepath.Dir(file), "..", "..", "testdata", "noderelay")
		if _, err := os.Stat(filepath.Join(dir, "server.js")); err == nil {
			return dir
		}
	}
	// Built with -trimpath: look up from the test's directory.
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		src := filepath.Join(dir, "testdata", "noderelay")
		if _, err := os.Stat(filepath.Join(src, "server.js")); err == nil {
			return src
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("noderelay: testdata/noderelay not found above the test's directory")
		}
		dir = up
	}
}

// Start starts testdata/noderelay/server.js with NIP-42 for hostname
// (none when "") and returns its ws:// URL; it stops with the test.
func Start(t testing.TB, hostname string) string {
	t.Helper()
	node, errNode := exec.LookPath("node")
	npm, errNPM := exec.LookPath("npm")
	if errNode != nil || errNPM != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node and npm are needed for the non-Go relay test (.ci/run installs them): %v %v", errNode, errNPM)
		}
		t.Skip("node or npm not installed")
	}
	src := sourceDir(t)
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256(lock)
	dir := filepath.Join(cache, "sluice-noderelay", hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	// The test binaries of several packages start the server at once: one
	// installs while the others wait (npm ci empties node_modules first).
	unlock, err := lockFile(dir + ".lock")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "better-sqlite3", "build", "Release", "better_sqlite3.node")); err != nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"package.json", "package-lock.json"} {
			b, err := os.ReadFile(filepath.Join(src, f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// npm 11 may skip better-sqlite3's install script: rebuild it.
		for _, args := range [][]string{{"ci", "--no-audit", "--no-fund"}, {"rebuild", "better-sqlite3"}} {
			cmd := exec.Command(npm, args...)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("npm %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	}
	server, err := os.ReadFile(filepath.Join(src, "server.js"))
	if err != nil {
		t.Fatal(err)
	}
	// Written only when it changed: another binary may be starting it.
	if old, err := os.ReadFile(filepath.Join(dir, "server.js")); err != nil || !bytes.Equal(old, server) {
		if err := os.WriteFile(filepath.Join(dir, "server.js"), server, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	unlock()
	cmd := exec.Command(node, "server.js")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "RELAY_HOSTNAME="+hostname)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if p, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				port <- p
			}
		}
	}()
	select {
	case p := <-port:
		return "ws://127.0.0.1:" + p
	case <-time.After(30 * time.Second):
		t.Fatal("the node relay did not start")
	}
	return ""
}
