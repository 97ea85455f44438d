//go:build !race

// The end-to-end tests are left out of -race builds: go-nostr v0.52.3's
// Relay races with itself when a connection closes (relay.go: the writer
// goroutine sets r.Connection to nil while close reads it), which the race
// detector reports in this test process whatever sluice does. The Makefile
// runs them in a separate pass without -race, so "make test" always
// includes them.

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/redis/go-redis/v9"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/redistest"
)

// These tests build the sluice binary and run it as an operator would:
// as a process, configured by flags and files, talked to over TCP by a
// go-nostr client, stopped with SIGTERM.

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// sluiceBinary builds the binary once per test run.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "sluice-e2e")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "sluice")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out.String())
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// proc is a running sluice.
type proc struct {
	t       *testing.T
	cmd     *exec.Cmd
	addr    string // where clients connect
	metrics string // where /metrics is
	done    chan struct{}
	waitErr error

	mu  sync.Mutex
	log bytes.Buffer
}

// startSluice runs sluice with args on free loopback ports (unless args
// say otherwise) and waits until it listens.
func startSluice(t *testing.T, args ...string) *proc {
	t.Helper()
	bin := sluiceBinary(t)
	full := append([]string{}, args...)
	if len(args) > 0 && (args[0] == "relay" || args[0] == "proxy") {
		full = append(full, "--log-format", "json")
		if !hasFlag(args, "--listen") {
			full = append(full, "--listen", "127.0.0.1:0")
		}
		if !hasFlag(args, "--metrics-listen") {
			full = append(full, "--metrics-listen", "127.0.0.1:0")
		}
	}
	cmd := exec.Command(bin, full...)
	cmd.Env = cleanEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		signalled := false
		for sc.Scan() {
			line := sc.Bytes()
			p.mu.Lock()
			p.log.Write(line)
			p.log.WriteByte('\n')
			p.mu.Unlock()
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(line, &rec) == nil {
				switch rec.Msg {
				case "metrics":
					p.mu.Lock()
					p.metrics = rec.Addr
					p.mu.Unlock()
				case "listening":
					p.mu.Lock()
					p.addr = rec.Addr
					p.mu.Unlock()
					if !signalled {
						signalled = true
						close(ready)
					}
				}
			}
		}
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	select {
	case <-ready:
	case <-p.done:
		t.Fatalf("sluice %v exited before listening: %v\n%s", full, p.waitErr, p.logs())
	case <-time.After(2 * time.Minute):
		p.kill()
		t.Fatalf("sluice %v did not listen within 2m\n%s", full, p.logs())
	}
	t.Cleanup(p.kill)
	return p
}

// freeAddr returns a loopback address with a port that was free a moment
// ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// cleanEnv is the test's environment without SLUICE_* variables, so a
// developer's shell cannot change what the tests run.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return env
}

func (p *proc) url() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return "ws://" + p.addr
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Kill()
		<-p.done
	}
}

// stop sends SIGTERM and returns the exit code.
func (p *proc) stop() int {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		p.kill()
		p.t.Fatalf("sluice did not exit within 1m of SIGTERM\n%s", p.logs())
	}
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		return ee.ExitCode()
	}
	if p.waitErr != nil {
		p.t.Fatal(p.waitErr)
	}
	return 0
}

// get fetches path from p's metrics listener (/metrics, /readyz, /top);
// the caller closes the body.
func (p *proc) get(t *testing.T, path string) *http.Response {
	t.Helper()
	p.mu.Lock()
	addr := p.metrics
	p.mu.Unlock()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// metric returns the value of one sample line ("name{labels}") of /metrics.
func (p *proc) metric(t *testing.T, sample string) float64 {
	t.Helper()
	resp := p.get(t, "/metrics")
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics:\n%s", sample, body)
	return 0
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, ctx context.Context, url string) *nostr.Relay {
	t.Helper()
	r, err := nostr.RelayConnect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func signed(t *testing.T, sk, content string) nostr.Event {
	t.Helper()
	ev := nostr.Event{CreatedAt: nostr.Now(), Kind: 1, Content: content, Tags: nostr.Tags{}}
	if err := ev.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return ev
}

// newKey is a fresh secret key and its public key.
func newKey(t *testing.T) (sk, pk string) {
	t.Helper()
	sk = nostr.GeneratePrivateKey()
	pk, err := nostr.GetPublicKey(sk)
	if err != nil {
		t.Fatal(err)
	}
	return sk, pk
}

func publishAndRead(t *testing.T, ctx context.Context, url string, ev nostr.Event) {
	t.Helper()
	r := connect(t, ctx, url)
	if err := r.Publish(ctx, ev); err != nil {
		t.Fatalf("publish through %s: %v", url, err)
	}
	readBack(t, ctx, url, ev)
}

func readBack(t *testing.T, ctx context.Context, url string, ev nostr.Event) {
	t.Helper()
	r := connect(t, ctx, url)
	got, err := r.QuerySync(ctx, nostr.Filter{IDs: []string{ev.ID}})
	if err != nil {
		t.Fatalf("query %s: %v", url, err)
	}
	if len(got) != 1 || got[0].ID != ev.ID || got[0].Content != ev.Content {
		t.Fatalf("query %s for %s: got %v", url, ev.ID, got)
	}
}

var retryRe = regexp.MustCompile(`^msg: rate-limited: .+; retry in [1-9][0-9]*s$`)

// flood publishes fresh events on one connection until one is refused, and
// returns how many were admitted and the refusal. It fails the test if no
// refusal comes within max events.
func flood(t *testing.T, ctx context.Context, r *nostr.Relay, sk string, max int) (int, error) {
	t.Helper()
	for i := range max {
		ev := signed(t, sk, fmt.Sprintf("flood %d", i))
		if err := r.Publish(ctx, ev); err != nil {
			return i, err
		}
	}
	t.Fatalf("no refusal within %d events", max)
	return max, nil
}

func checkRefusal(t *testing.T, err error) {
	t.Helper()
	if !retryRe.MatchString(err.Error()) {
		t.Errorf("refusal %q does not match %v", err, retryRe)
	}
}

// TestE2ERelay: publish, read back, survive a graceful restart, and refuse
// a flood with the wait the limit means.
func TestE2ERelay(t *testing.T) {
	ctx := testCtx(t)
	data := t.TempDir()
	sk := nostr.GeneratePrivateKey()

	p := startSluice(t, "relay", "--data-dir", data)
	ev := signed(t, sk, "hello from the e2e test")
	publishAndRead(t, ctx, p.url(), ev)

	// A client still connected while sluice stops must not keep it from
	// stopping cleanly: the gate says goodbye (1001) and drains it.
	idle, _, err := websocket.DefaultDialer.DialContext(ctx, p.url(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if code := p.stop(); code != 0 {
		t.Fatalf("SIGTERM: exit code %d, want 0 (graceful)\n%s", code, p.logs())
	}
	idle.SetReadDeadline(time.Now().Add(30 * time.Second))
	for err == nil { // the relay's NIP-42 challenge comes first
		_, _, err = idle.ReadMessage()
	}
	if !websocket.IsCloseError(err, websocket.CloseGoingAway) {
		t.Errorf("idle client got %v at shutdown, want close 1001 (going away)", err)
	}
	if !strings.Contains(p.logs(), `"msg":"stopped cleanly"`) {
		t.Errorf("no clean stop in the log:\n%s", p.logs())
	}

	p = startSluice(t, "relay", "--data-dir", data)
	readBack(t, ctx, p.url(), ev)

	doc := getNIP11(t, ctx, p.url())
	if doc.Name != "sluice" || doc.Limitation["max_message_length"] != float64(524288) || doc.RateLimits["message"] == nil {
		t.Errorf("relay NIP-11: name %q limitation %v rate_limits %v", doc.Name, doc.Limitation, doc.RateLimits)
	}
	if !slices.Contains(doc.SupportedNIPs, 11) || !slices.Contains(doc.SupportedNIPs, 42) || !slices.Contains(doc.SupportedNIPs, 77) {
		t.Errorf("relay NIP-11 supported_nips = %v, want 11, 42 and 77 among them", doc.SupportedNIPs)
	}
	if _, ok := doc.Limitation["max_filters"]; ok || doc.Limitation["max_subid_length"] != float64(64) {
		t.Errorf("relay NIP-11 limitation = %v, want max_subid_length 64 and no max_filters (NIP-11 dropped it)", doc.Limitation)
	}
	resp, err := http.Get("http" + strings.TrimPrefix(p.url(), "ws") + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), "Nostr relay") {
		t.Errorf("plain GET: %d %q", resp.StatusCode, page)
	}

	r := connect(t, ctx, p.url())
	admitted, err := flood(t, ctx, r, sk, 500)
	checkRefusal(t, err)
	if admitted < 10 {
		t.Errorf("refused after %d events, want at least the burst of 10", admitted)
	}
	if n := p.metric(t, `sluice_frames_total{outcome="rate_limited",type="EVENT"}`); n < 1 {
		t.Errorf("rate_limited EVENT frames = %v, want ≥ 1", n)
	}
	if n := p.metric(t, `sluice_open_connections`); n < 1 {
		t.Errorf("open connections = %v, want ≥ 1", n)
	}
	// The same client's REQs still pass: budgets are per type.
	readBack(t, ctx, p.url(), ev)
	if code := p.stop(); code != 0 {
		t.Fatalf("exit code %d\n%s", code, p.logs())
	}
}

// TestE2EProxy: sluice proxy in front of sluice relay: events pass both
// ways, a flood is refused by the proxy, NIP-11 is the upstream's with
// sluice's limits merged in.
func TestE2EProxy(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "upstream.yaml")
	if err := os.WriteFile(cfg, []byte("info: {name: the-upstream, contact: ops@example.org}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A fixed address, so the relay can come back where the proxy looks.
	upAddr := freeAddr(t)
	upArgs := []string{"relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", upAddr}
	up := startSluice(t, upArgs...)
	px := startSluice(t, "proxy", "--upstream", up.url())

	sk := nostr.GeneratePrivateKey()
	ev := signed(t, sk, "through the proxy")
	publishAndRead(t, ctx, px.url(), ev)
	readBack(t, ctx, up.url(), ev) // it really reached the relay

	// Restart the relay behind the proxy: new clients of the proxy reach
	// it again, and the event is still there.
	if code := up.stop(); code != 0 {
		t.Fatalf("relay exit code %d\n%s", code, up.logs())
	}
	up = startSluice(t, upArgs...)
	readBack(t, ctx, px.url(), ev)

	r := connect(t, ctx, px.url())
	_, err := flood(t, ctx, r, sk, 500)
	checkRefusal(t, err)
	if n := px.metric(t, `sluice_frames_total{outcome="rate_limited",type="EVENT"}`); n < 1 {
		t.Errorf("the proxy refused %v EVENTs, want ≥ 1 (the refusal must come from the proxy)", n)
	}

	doc := getNIP11(t, ctx, px.url())
	if doc.Name != "the-upstream" || doc.Contact != "ops@example.org" {
		t.Errorf("NIP-11 name %q contact %q: want the upstream's own document", doc.Name, doc.Contact)
	}
	if doc.Limitation["max_message_length"] != float64(524288) {
		t.Errorf("NIP-11 limitation = %v, want max_message_length 524288", doc.Limitation)
	}
	if doc.RateLimits["message"] == nil {
		t.Errorf("NIP-11 rate_limits = %v, want the message limits", doc.RateLimits)
	}

	for _, p := range []*proc{px, up} {
		if code := p.stop(); code != 0 {
			t.Errorf("exit code %d\n%s", code, p.logs())
		}
	}
}

type nip11Doc struct {
	Name          string
	Contact       string
	SupportedNIPs []int `json:"supported_nips"`
	Limitation    map[string]any
	RateLimits    map[string]any `json:"rate_limits"`
}

// getNIP11 GETs the NIP-11 document of the relay at a ws:// URL.
func getNIP11(t *testing.T, ctx context.Context, wsURL string) nip11Doc {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http"+strings.TrimPrefix(wsURL, "ws")+"/", nil)
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/nostr+json" {
		t.Errorf("NIP-11 Content-Type = %q", ct)
	}
	var doc nip11Doc
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestE2EPortInUse: a taken address is an error at start-up, exit 1.
func TestE2EPortInUse(t *testing.T) {
	bin := sluiceBinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(bin, "relay", "--listen", ln.Addr().String(), "--metrics-listen", "", "--data-dir", t.TempDir())
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitFailure {
		t.Errorf("relay on a taken port: %v, want exit %d\n%s", err, exitFailure, out)
	}
	if !strings.Contains(string(out), "address already in use") {
		t.Errorf("output does not say why:\n%s", out)
	}
}

// TestE2ECheck: sluice check as a person runs it.
func TestE2ECheck(t *testing.T) {
	bin := sluiceBinary(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("limits:\n  message:\n    EVENT: [{rate: 10, period: 1s}, {rate: 1, period: 60s}]\n"), 0o600)

	cmd := exec.Command(bin, "check", "--config", bad)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage {
		t.Errorf("check of a bad config: %v, want exit %d", err, exitUsage)
	}
	if !strings.Contains(string(out), "limits.message.EVENT[1] (line 3, column 37): ratelimit: invalid limit: rate 1 must be greater than cost 1") {
		t.Errorf("check output does not name the field:\n%s", out)
	}

	// The environment is read too, and a bad value is named the same way.
	cmd = exec.Command(bin, "check")
	cmd.Env = append(cleanEnv(), "SLUICE_REDIS=redis://h:notaport/0", "SLUICE_LISTEN=nowhere")
	out, err = cmd.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage ||
		!strings.Contains(string(out), "store.redis:") || !strings.Contains(string(out), "listen: want host:port") {
		t.Errorf("check with bad SLUICE_* values: %v\n%s", err, out)
	}

	cmd = exec.Command(bin, "check", "--config", examplePath)
	cmd.Env = cleanEnv()
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("check of the example: %v\n%s", err, out)
	}
	for _, want := range []string{"configuration OK", "burst 10", "sustained 6.58/s", "240/60s", "CLOSE       free"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
}

// TestE2ESharedRedis: two sluice relays on one Redis share one budget. A
// one-hour half-life makes refill negligible during the test, so the
// count is exact: the burst of 10, not 10 per process.
func TestE2ESharedRedis(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	// A generous store deadline: a test machine may be shared and loaded, and
	// the test is about sharing, not latency.
	conf := "store: {timeout: 5s}\nlimits: {message: {EVENT: [{rate: 10, period: 1h}]}}\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startSluice(t, "relay", "--config", cfg, "--redis", srv.URL(), "--data-dir", filepath.Join(dir, "a"))
	b := startSluice(t, "relay", "--config", cfg, "--redis", srv.URL(), "--data-dir", filepath.Join(dir, "b"))
	ra, rb := connect(t, ctx, a.url()), connect(t, ctx, b.url())

	sk := nostr.GeneratePrivateKey()
	admitted := 0
	var refusal error
	for i := 0; i < 40 && refusal == nil; i++ {
		r := ra
		if i%2 == 1 {
			r = rb
		}
		if err := r.Publish(ctx, signed(t, sk, fmt.Sprintf("shared %d", i))); err != nil {
			refusal = err
			break
		}
		admitted++
	}
	if refusal == nil {
		t.Fatalf("40 events admitted across two relays with a shared burst of 10")
	}
	checkRefusal(t, refusal)
	if admitted != 10 {
		t.Errorf("admitted %d events across two relays, want exactly the shared burst of 10", admitted)
	}
	// The breaker gauge exists and is closed while Redis is up.
	if v := a.metric(t, "sluice_breaker_open"); v != 0 {
		t.Errorf("sluice_breaker_open = %v with Redis up", v)
	}
	for _, p := range []*proc{a, b} {
		if code := p.stop(); code != 0 {
			t.Errorf("exit code %d\n%s", code, p.logs())
		}
	}
}

// TestE2ERedisOutage: with Redis gone, sluice relay refuses honestly —
// "error: rate limiter unavailable" on events, 503 on upgrades, never
// "rate-limited:" — and admits again by itself once Redis is back.
func TestE2ERedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfg, []byte("store: {timeout: 2s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, "relay", "--config", cfg, "--redis", srv.URL(), "--data-dir", filepath.Join(dir, "data"))
	sk := nostr.GeneratePrivateKey()
	r := connect(t, ctx, p.url())
	if err := r.Publish(ctx, signed(t, sk, "before the outage")); err != nil {
		t.Fatalf("publish with Redis up: %v", err)
	}

	srv.Kill()
	err := r.Publish(ctx, signed(t, sk, "during the outage"))
	if err == nil || err.Error() != "msg: error: rate limiter unavailable" {
		t.Errorf("publish with Redis down: %v, want msg: error: rate limiter unavailable", err)
	}
	// NIP-11 is not gated: clients can still read what the relay is.
	if doc := getNIP11(t, ctx, p.url()); doc.Name != "sluice" {
		t.Errorf("NIP-11 during the outage: %+v", doc)
	}
	code, body := upgrade(t, ctx, p.url())
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "error: rate limiter unavailable") {
		t.Errorf("upgrade with Redis down: %d %q, want 503 error: rate limiter unavailable", code, body)
	}

	srv.Restart()
	// The breaker lets a probe through after its cool-down: poll, do not
	// assume how long that is.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := r.Publish(ctx, signed(t, sk, "after the outage"))
		if err == nil {
			break
		}
		if err.Error() != "msg: error: rate limiter unavailable" {
			t.Fatalf("after restart: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("still unavailable 30s after Redis came back")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The outage's end is logged within a second of the first success.
	for !strings.Contains(p.logs(), "rate limiter store answers again") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	for _, want := range []string{"rate limiter store unavailable", "rate limiter store answers again"} {
		if !strings.Contains(p.logs(), want) {
			t.Errorf("%q is not in the log:\n%s", want, p.logs())
		}
	}
	if v := p.metric(t, `sluice_frames_total{outcome="unavailable",type="EVENT"}`); v < 1 {
		t.Errorf("unavailable EVENT frames = %v, want ≥ 1", v)
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d\n%s", code, p.logs())
	}
	// One outage, one line each: a second line would report an outage or
	// a recovery that did not happen.
	for _, line := range []string{"rate limiter store unavailable", "rate limiter store answers again"} {
		if n := strings.Count(p.logs(), line); n != 1 {
			t.Errorf("%q logged %d times, want once:\n%s", line, n, p.logs())
		}
	}
}

// upgrade attempts a WebSocket upgrade and returns the HTTP status and
// body of a refusal (101 and "" when it was accepted).
func upgrade(t *testing.T, ctx context.Context, url string) (int, string) {
	t.Helper()
	c, resp, err := websocket.DefaultDialer.DialContext(ctx, url, nil)
	if err == nil {
		c.Close()
		return http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		t.Fatalf("upgrade %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestE2EQuota: the per-actor quota is wired into sluice relay: one pubkey
// past its quota is refused while another on the same connection is not.
func TestE2EQuota(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	conf := "quota: {events: 3, window: 1h}\nlimits: {message: {EVENT: [{rate: 1000, period: 1s}]}}\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))
	r := connect(t, ctx, p.url())
	a := nostr.GeneratePrivateKey()
	for i := range 3 {
		if err := r.Publish(ctx, signed(t, a, fmt.Sprintf("a %d", i))); err != nil {
			t.Fatalf("event %d within the quota: %v", i, err)
		}
	}
	// The gate charges the quota on the relay's OK before passing it on,
	// so the fourth event is refused, not a later one.
	err := r.Publish(ctx, signed(t, a, "a 3"))
	if err == nil {
		t.Fatalf("a fourth event from one pubkey admitted with a quota of 3")
	}
	checkRefusal(t, err)
	// Another pubkey is admitted. The quota's 1,024 slots are seeded at
	// random inside the sluice process, so a fresh pubkey shares a's slot
	// (and budget) once in 1,024: a refused one is retried with another, up
	// to 3 (a quota shared by every pubkey fails all 3).
	for try := 0; ; try++ {
		err := r.Publish(ctx, signed(t, nostr.GeneratePrivateKey(), "b 0"))
		if err == nil {
			break
		}
		if try == 2 {
			t.Fatalf("3 other pubkeys on the same connection refused: %v", err)
		}
	}
	if v := p.metric(t, `sluice_frames_total{outcome="quota_exceeded",type="EVENT"}`); v < 1 {
		t.Errorf("quota_exceeded EVENT frames = %v, want ≥ 1", v)
	}
}

// TestE2EQuotaSharedByInstances: with Redis, the actor quota lives there:
// one pubkey publishing round-robin to three sluice relays gets its quota
// of 5 accepted once, not once per instance (15 with the in-process quota),
// within the bound of charges batched off the event's path: an instance
// learns the actor is full from the reply to its own charge, which comes
// back after the relay's OK, so each instance may accept one event more
// (docs/protocol.md).
func TestE2EQuotaSharedByInstances(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	conf := "store: {timeout: 5s}\nquota: {events: 5, window: 1h}\nlimits: {message: {EVENT: [{rate: 1000, period: 1s}]}}\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var relays []*nostr.Relay
	var procs []*proc
	for _, name := range []string{"a", "b", "c"} {
		p := startSluice(t, "relay", "--config", cfg, "--redis", srv.URL(), "--data-dir", filepath.Join(dir, name))
		procs = append(procs, p)
		relays = append(relays, connect(t, ctx, p.url()))
	}
	// Each instance reads the actor's room in the frame's own script call,
	// from the count every instance's charges write; the documented bound
	// is the events sent before the last charges land, so the test waits
	// for each charge of the quota's events to land in Redis (its seen
	// key; a charge refused at the limit writes nothing) before the next
	// publish, and then the one quota is exact. (Asked from each
	// instance's memory of its own charges instead, 7 of 15 were accepted.)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rc.Close()
	landed := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // polls a real process's batch
			keys, err := rc.Keys(ctx, "*:seen:*").Result()
			if err == nil && len(keys) >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d charges landed in Redis 10 s after %d events were accepted (err %v)", len(keys), n, err)
			}
		}
	}
	sk := nostr.GeneratePrivateKey()
	accepted := 0
	for i := range 15 {
		err := relays[i%3].Publish(ctx, signed(t, sk, fmt.Sprintf("q %d", i)))
		if err == nil {
			accepted++
			landed(min(accepted, 5))
			continue
		}
		checkRefusal(t, err)
	}
	t.Logf("one pubkey, three instances, quota 5: %d of 15 accepted", accepted)
	if accepted != 5 {
		t.Errorf("accepted %d of 15 events across three instances, want the one quota of 5", accepted)
	}
	for _, p := range procs {
		if code := p.stop(); code != 0 {
			t.Errorf("exit code %d\n%s", code, p.logs())
		}
	}
}

// TestE2EAuthAllowlist: sluice relay sends a NIP-42 challenge as soon as a
// connection opens, and a pubkey on allow.pubkeys that answers it with a
// valid AUTH is exempt from an EVENT limit that refuses its address; an
// AUTH naming another relay exempts nothing.
func TestE2EAuthAllowlist(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	sk, pk := newKey(t)
	cfg := filepath.Join(dir, "c.yaml")
	// A burst of one, which an hour's half-life does not refill during
	// the test: the second EVENT from the address is refused.
	// An allow-listed pubkey needs relay_url, which the AUTH must name.
	const relayURL = "ws://sluice.test"
	conf := fmt.Sprintf("relay_url: %s\nlimits: {message: {EVENT: [{rate: 1.5, period: 1h}]}}\nallow: {pubkeys: [%s]}\n", relayURL, pk)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))

	// Unauthenticated, the address's burst is spent and then refused.
	anon := dialRaw(t, ctx, p.url())
	anon.challenge()
	other := nostr.GeneratePrivateKey()
	if ok, reason := anon.publish(signed(t, other, "anon 0")); !ok {
		t.Fatalf("first EVENT refused: %s", reason)
	}
	ok, reason := anon.publish(signed(t, other, "anon 1"))
	if ok || !retryRe.MatchString("msg: "+reason) {
		t.Fatalf("second unauthenticated EVENT: ok %v %q, want a rate-limited refusal", ok, reason)
	}

	// A fresh connection from the same address gets its own challenge.
	c := dialRaw(t, ctx, p.url())
	ch := c.challenge()
	if ch == anon.challenge0 {
		t.Errorf("two connections got the same challenge %q", ch)
	}
	// An AUTH for another relay is refused by the gate and exempts nothing.
	if ok, reason := c.auth(sk, "ws://elsewhere.example", ch); ok || !strings.HasPrefix(reason, "invalid:") {
		t.Errorf("AUTH naming another relay: ok %v %q, want invalid:", ok, reason)
	}
	if ok, reason := c.publish(signed(t, sk, "before auth")); ok || !retryRe.MatchString("msg: "+reason) {
		t.Errorf("EVENT after a refused AUTH: ok %v %q, want a rate-limited refusal", ok, reason)
	}
	// The AUTH NIP-42 asks for: relay = the URL connected to, challenge =
	// the one received.
	if ok, reason := c.auth(sk, relayURL, ch); !ok {
		t.Fatalf("AUTH of the allow-listed pubkey refused: %q", reason)
	}
	for i := range 5 {
		if ok, reason := c.publish(signed(t, sk, fmt.Sprintf("allowed %d", i))); !ok {
			t.Fatalf("EVENT %d of the authenticated allow-listed pubkey refused: %q", i, reason)
		}
	}
	// The exemption is the connection's, not the address's.
	if ok, reason := anon.publish(signed(t, other, "anon 2")); ok || !retryRe.MatchString("msg: "+reason) {
		t.Errorf("unauthenticated EVENT after the other's AUTH: ok %v %q, want a rate-limited refusal", ok, reason)
	}
	if n := p.metric(t, `sluice_frames_total{outcome="allowlisted",type="EVENT"}`); n < 5 {
		t.Errorf("allowlisted EVENT frames = %v, want ≥ 5", n)
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d\n%s", code, p.logs())
	}
}

// rawClient is a WebSocket client that sees every frame, for a NIP-42
// exchange that go-nostr's Relay would do out of sight.
type rawClient struct {
	t          *testing.T
	c          *websocket.Conn
	challenge0 string // the challenge received on connecting
}

func dialRaw(t *testing.T, ctx context.Context, url string) *rawClient {
	t.Helper()
	c, _, err := websocket.DefaultDialer.DialContext(ctx, url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, c: c}
}

// read returns the next frame as its JSON elements. The deadline only
// keeps a broken sluice from hanging the test.
func (r *rawClient) read() []json.RawMessage {
	r.t.Helper()
	r.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, data, err := r.c.ReadMessage()
	if err != nil {
		r.t.Fatalf("read: %v", err)
	}
	var msg []json.RawMessage
	if err := json.Unmarshal(data, &msg); err != nil || len(msg) == 0 {
		r.t.Fatalf("frame %s is not a JSON array", data)
	}
	return msg
}

// challenge reads the first frame of the connection, which must be
// ["AUTH","<challenge>"], and returns the challenge.
func (r *rawClient) challenge() string {
	r.t.Helper()
	msg := r.read()
	var label, ch string
	if len(msg) != 2 || json.Unmarshal(msg[0], &label) != nil || label != "AUTH" ||
		json.Unmarshal(msg[1], &ch) != nil || ch == "" {
		r.t.Fatalf("first frame is %s, want [\"AUTH\",\"<challenge>\"]", msg)
	}
	r.challenge0 = ch
	return ch
}

func (r *rawClient) send(v json.Marshaler) {
	r.t.Helper()
	data, err := v.MarshalJSON()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.c.WriteMessage(websocket.TextMessage, data); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// ok reads frames until the OK for id and returns it.
func (r *rawClient) ok(id string) (bool, string) {
	r.t.Helper()
	for {
		msg := r.read()
		var label, got, reason string
		var accepted bool
		if json.Unmarshal(msg[0], &label) != nil || label != "OK" {
			continue
		}
		if len(msg) != 4 || json.Unmarshal(msg[1], &got) != nil || json.Unmarshal(msg[2], &accepted) != nil ||
			json.Unmarshal(msg[3], &reason) != nil {
			r.t.Fatalf("malformed OK %s", msg)
		}
		if got == id {
			return accepted, reason
		}
	}
}

func (r *rawClient) publish(ev nostr.Event) (bool, string) {
	r.t.Helper()
	r.send(nostr.EventEnvelope{Event: ev})
	return r.ok(ev.ID)
}

// auth sends a kind-22242 event signed by sk with the given relay and
// challenge tags, and returns the OK that answers it.
func (r *rawClient) auth(sk, relayURL, challenge string) (bool, string) {
	r.t.Helper()
	ev := nostr.Event{
		CreatedAt: nostr.Now(),
		Kind:      nostr.KindClientAuthentication,
		Tags:      nostr.Tags{{"relay", relayURL}, {"challenge", challenge}},
	}
	if err := ev.Sign(sk); err != nil {
		r.t.Fatal(err)
	}
	r.send(nostr.AuthEnvelope{Event: ev})
	return r.ok(ev.ID)
}

// TestE2EAuthRelayURL: with relay_url set, an AUTH must name that URL,
// not the address the client happened to connect to, and both the gate
// and khatru (its ServiceURL) agree on it: the allow-listed pubkey is
// bound only by an AUTH naming relay_url.
func TestE2EAuthRelayURL(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	sk, pk := newKey(t)
	const public = "wss://relay.example.com/nostr"
	cfg := filepath.Join(dir, "c.yaml")
	conf := fmt.Sprintf("relay_url: %s\nlimits: {message: {EVENT: [{rate: 1.5, period: 1h}]}}\nallow: {pubkeys: [%s]}\n", public, pk)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))

	c := dialRaw(t, ctx, p.url())
	ch := c.challenge()
	if ok, reason := c.auth(sk, p.url(), ch); ok || !strings.HasPrefix(reason, "invalid:") {
		t.Errorf("AUTH naming the connected address instead of relay_url: ok %v %q, want invalid:", ok, reason)
	}
	if ok, reason := c.auth(sk, public, ch); !ok {
		t.Fatalf("AUTH naming relay_url refused: %q", reason)
	}
	for i := range 3 { // past the burst of one
		if ok, reason := c.publish(signed(t, sk, fmt.Sprintf("allowed %d", i))); !ok {
			t.Fatalf("EVENT %d of the authenticated allow-listed pubkey refused: %q", i, reason)
		}
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d\n%s", code, p.logs())
	}
}
