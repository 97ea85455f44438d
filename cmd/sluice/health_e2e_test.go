//go:build !race

package main

import (
	"errors"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// healthExit runs the sluice binary's health command and returns its exit
// code and output.
func healthExit(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(sluiceBinary(t), append([]string{"health"}, args...)...)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	case err != nil:
		t.Fatal(err)
	}
	return 0, string(out)
}

// TestE2EHealth: "sluice health" against a running sluice relay (ready),
// a sluice proxy whose upstream is gone (not ready, the upstream named),
// and an address nothing listens on.
func TestE2EHealth(t *testing.T) {
	relay := startSluice(t, "relay", "--data-dir", filepath.Join(t.TempDir(), "data"))
	relay.mu.Lock()
	maddr := relay.metrics
	relay.mu.Unlock()
	if code, out := healthExit(t, "--metrics-listen", maddr); code != 0 || !strings.Contains(out, `"name":"store","ok":true`) {
		t.Errorf("health of a running relay: exit %d\n%s", code, out)
	}
	resp, err := http.Get("http://" + maddr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), `id="ready">ready<`) {
		t.Errorf("/status of a running relay: %d\n%s", resp.StatusCode, page)
	}

	proxy := startSluice(t, "proxy", "--upstream", "ws://"+deadAddr(t))
	proxy.mu.Lock()
	paddr := proxy.metrics
	proxy.mu.Unlock()
	code, out := healthExit(t, "--url", "http://"+paddr)
	if code != 1 || !strings.Contains(out, `"name":"upstream","ok":false`) {
		t.Errorf("health of a proxy with a dead upstream: exit %d, want 1\n%s", code, out)
	}
	if code, out := healthExit(t, "--url", "http://"+paddr+"/healthz"); code != 0 {
		t.Errorf("liveness of a proxy with a dead upstream: exit %d, want 0\n%s", code, out)
	}
	if code, out := healthExit(t, "--url", "http://"+deadAddr(t)); code != 1 {
		t.Errorf("health with nothing listening: exit %d, want 1\n%s", code, out)
	}
}
