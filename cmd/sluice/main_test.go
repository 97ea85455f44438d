package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestJSONLogDurations: JSON logs write durations as the text logs and the
// config do ("10s"), not as integer nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	for format, want := range map[string]string{"json": `"timeout":"10s"`, "text": "timeout=10s"} {
		var buf bytes.Buffer
		newLogger(&config{LogFormat: format, LogLevel: "info"}, &buf).Info("shutting down", "timeout", 10*time.Second)
		if !strings.Contains(buf.String(), want) {
			t.Errorf("%s log %q lacks %s", format, buf.String(), want)
		}
	}
}

// TestMakeRunHonoursEnvironment: make run passes no --listen or
// --data-dir, which would outrank SLUICE_LISTEN and SLUICE_DATA_DIR.
func TestMakeRunHonoursEnvironment(t *testing.T) {
	data, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	recipe := regexp.MustCompile(`(?m)^run:.*\n((?:\t.*\n)+)`).FindSubmatch(data)
	if recipe == nil {
		t.Fatal("Makefile has no run target")
	}
	for _, flag := range []string{"--listen", "--data-dir", "--metrics-listen"} {
		if bytes.Contains(recipe[1], []byte(flag)) {
			t.Errorf("make run passes %s, so the SLUICE_* variable cannot move it:\n%s", flag, recipe[1])
		}
	}
}

// TestReadmeGoVersion: the quick start names the Go that go.mod needs.
func TestReadmeGoVersion(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "With Go " + string(m[1]) + " or newer installed"; !bytes.Contains(readme, []byte(want)) {
		t.Errorf("README's quick start does not say %q (go.mod: go %s)", want, m[1])
	}
}
