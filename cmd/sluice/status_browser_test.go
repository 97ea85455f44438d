package main

import (
	"bytes"
	"context"
	"flag"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

var updateScreenshot = flag.Bool("update-screenshot", false, "write docs/status.png from the browser test")

// chromium returns Debian's chromium, skipping the test without one unless
// CI=true or REQUIRE_BROWSER=1 (then it fails: .ci/run installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "/usr/bin/chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" || os.Getenv("REQUIRE_BROWSER") == "1" {
		t.Fatal("chromium not found (CI=true or REQUIRE_BROWSER=1): install Debian's chromium")
	}
	t.Skip("chromium not found: the status page is not tested in a browser (apt-get install chromium; REQUIRE_BROWSER=1 makes this a failure)")
	return ""
}

// headless runs chromium headless on url with extra flags, in a profile
// of its own, and returns its standard output.
func headless(t *testing.T, bin, url string, extra ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
		"--user-data-dir=" + t.TempDir(),
	}, extra...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", extra, err, stderr.String())
	}
	return stdout.Bytes()
}

// TestStatusPageInBrowser loads the status page in headless chromium:
// the DOM it builds holds the readiness, the counts and the chart, and
// its screenshot shows the green and red the page draws them in.
func TestStatusPageInBrowser(t *testing.T) {
	bin := chromium(t)
	if testing.Short() {
		t.Skip("starts a browser; skipped with -short")
	}
	// The fixture's 20 rate-limited EVENTs come from 203.0.113.7.
	m, s, _ := statusFixture(t, storeCheck(ratelimit.NewMemoryStore(16), nil))
	srv := newLoopbackServer(t, m.handler(s))
	url := srv + "/status"

	dom := string(headless(t, bin, url, "--dump-dom"))
	for _, want := range []string{
		`<title>sluice status</title>`,
		`id="ready">ready</span>`,
		`<tr data-type="EVENT"><td>EVENT</td><td>780</td><td>20</td>`,
		`<td id="total">879</td>`,
		`<tr><td>203.0.113.7</td><td>20.0</td>`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the browser's DOM lacks %q", want)
		}
	}
	if n := strings.Count(dom, `<rect class="admitted"`); n != 13 {
		t.Errorf("the chart has %d bars, want 13 (12 intervals and the live one)", n)
	}

	shot := filepath.Join(t.TempDir(), "status.png")
	headless(t, bin, url, "--screenshot="+shot, "--window-size=1000,820", "--hide-scrollbars")
	data, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1000 || b.Dy() != 820 {
		t.Errorf("screenshot is %v, want 1000x820", b)
	}
	green, red := countColor(img, 0x1a, 0x7f, 0x37), countColor(img, 0xcf, 0x22, 0x2e)
	if green < 2000 { // the admitted bars and the ready badge
		t.Errorf("%d green pixels: the chart's admitted bars were not drawn", green)
	}
	if red < 20 { // the refused bars and the legend
		t.Errorf("%d red pixels: the refused bars were not drawn", red)
	}
	if *updateScreenshot {
		if err := os.WriteFile("../../docs/status.png", data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// countColor counts the pixels of img within a small distance of r, g, b.
func countColor(img image.Image, r, g, b uint8) int {
	near := func(a uint32, want uint8) bool {
		d := int(a>>8) - int(want)
		return d > -8 && d < 8
	}
	n := 0
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			pr, pg, pb, _ := img.At(x, y).RGBA()
			if near(pr, r) && near(pg, g) && near(pb, b) {
				n++
			}
		}
	}
	return n
}
