//go:build !race

// End to end, like e2e_test.go, and left out of -race builds for the same
// reason (go-nostr's Relay races with itself on close).

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"
)

// signedKind is an event of kind by sk.
func signedKind(t *testing.T, sk string, kind int, content string) nostr.Event {
	t.Helper()
	ev := nostr.Event{CreatedAt: nostr.Now(), Kind: kind, Content: content, Tags: nostr.Tags{}}
	if err := ev.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return ev
}

// writeConfig writes body to path.
func writeConfig(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitLog waits until the log holds n lines containing all of subs, and
// fails the test when it does not within a minute (a bound on a hung
// process, not a timing assertion).
func (p *proc) waitLog(t *testing.T, n int, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		count := 0
		for _, line := range strings.Split(p.logs(), "\n") {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(line, s)
			}
			if all {
				count++
			}
		}
		if count >= n {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("sluice exited waiting for %d log lines with %q: %v\n%s", n, subs, p.waitErr, p.logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d log lines with %q within 1m:\n%s", n, subs, p.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hangup sends sluice SIGHUP.
func (p *proc) hangup(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

// refused reports whether the OK (ok, reason) is a rate-limited refusal
// with the wait, failing the test on any other refusal.
func refusedRateLimited(t *testing.T, ok bool, reason string) bool {
	t.Helper()
	if ok {
		return false
	}
	if !retryRe.MatchString("msg: " + reason) {
		t.Fatalf("refused with %q, want a rate-limited refusal with its wait", reason)
	}
	return true
}

// TestE2EKindClass: a kind class limits kind 7 on its own windows while
// kind 1 passes on EVENT's; a class whose window is in shadow refuses
// nothing and counts what it would have refused as shadow_limited.
func TestE2EKindClass(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	// Bursts of 2 (rate 2.5) that an hour's half-life does not refill
	// during the test.
	writeConfig(t, cfg, `limits:
  message: {EVENT: [{rate: 1000, period: 1s}]}
  kinds:
    reactions: {kinds: [7], limits: [{rate: 2.5, period: 1h}]}
    zaps: {kinds: ["9734-9735"], limits: [{rate: 2.5, period: 1h, shadow: true}]}
`)
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))
	c := dialRaw(t, ctx, p.url())
	c.challenge()
	sk := nostr.GeneratePrivateKey()
	for i := range 2 {
		if ok, reason := c.publish(signedKind(t, sk, 7, fmt.Sprintf("+%d", i))); !ok {
			t.Fatalf("reaction %d within the class's burst refused: %q", i, reason)
		}
	}
	if ok, reason := c.publish(signedKind(t, sk, 7, "+2")); !refusedRateLimited(t, ok, reason) {
		t.Fatalf("a third reaction admitted past the class's burst of 2")
	}
	for i := range 5 {
		if ok, reason := c.publish(signedKind(t, sk, 1, fmt.Sprintf("note %d", i))); !ok {
			t.Fatalf("kind 1 note %d refused while only reactions are spent: %q", i, reason)
		}
	}
	for i := range 4 {
		if ok, reason := c.publish(signedKind(t, sk, 9735, fmt.Sprintf("zap %d", i))); !ok {
			t.Fatalf("kind 9735 event %d refused by a window in shadow: %q", i, reason)
		}
	}
	if n := p.metric(t, `sluice_frames_total{outcome="shadow_limited",type="EVENT"}`); n < 2 {
		t.Errorf("shadow_limited EVENT frames = %v, want ≥ 2 (zaps past the shadow burst of 2)", n)
	}
	if n := p.metric(t, `sluice_shadow_windows{budget="kind zaps"}`); n != 1 {
		t.Errorf("sluice_shadow_windows{kind zaps} = %v, want 1", n)
	}
	rl := getNIP11(t, ctx, p.url()).RateLimits
	if kinds, _ := rl["kinds"].(map[string]any); kinds["reactions"] == nil || kinds["zaps"] == nil {
		t.Errorf("NIP-11 rate_limits.kinds = %v, want reactions and zaps", rl["kinds"])
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d\n%s", code, p.logs())
	}
}

// TestE2EShadowMode: mode shadow forwards everything the same config in
// enforce mode refuses, and counts it as shadow_limited.
func TestE2EShadowMode(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	limits := "limits: {message: {EVENT: [{rate: 1.5, period: 1h}]}}\n"
	for _, mode := range []string{"enforce", "shadow"} {
		t.Run(mode, func(t *testing.T) {
			cfg := filepath.Join(dir, mode+".yaml")
			writeConfig(t, cfg, "mode: "+mode+"\n"+limits)
			p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, mode))
			c := dialRaw(t, ctx, p.url())
			c.challenge()
			sk := nostr.GeneratePrivateKey()
			refused := 0
			var last nostr.Event
			for i := range 5 {
				ev := signed(t, sk, fmt.Sprintf("%s %d", mode, i))
				last = ev
				if ok, reason := c.publish(ev); refusedRateLimited(t, ok, reason) {
					refused++
				}
			}
			shadowed := p.metric(t, `sluice_frames_total{outcome="shadow_limited",type="EVENT"}`)
			switch mode {
			case "enforce":
				if refused != 4 || shadowed != 0 {
					t.Errorf("enforce: %d of 5 refused, %v shadow_limited; want 4 refused (a burst of 1), none shadowed", refused, shadowed)
				}
			case "shadow":
				if refused != 0 {
					t.Errorf("shadow: %d of 5 refused, want none", refused)
				}
				if shadowed != 4 {
					t.Errorf("shadow: shadow_limited EVENT frames = %v, want the 4 enforce refuses", shadowed)
				}
				// Forwarded for real: the relay stored the fifth.
				readBack(t, ctx, p.url(), last)
			}
			if code := p.stop(); code != 0 {
				t.Errorf("exit code %d\n%s", code, p.logs())
			}
		})
	}
}

// TestE2EReload: SIGHUP with an invalid file is refused in the log (level
// error, the field named), the running policy kept whole (the file's
// tighter EVENT does not apply) and sluice keeps serving; a valid file
// tightening EVENT then applies to a connection that stayed open, and to
// the NIP-11 document.
func TestE2EReload(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	writeConfig(t, cfg, "limits: {message: {EVENT: [{rate: 1000, period: 1s}]}}\n")
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))
	c := dialRaw(t, ctx, p.url())
	c.challenge()
	sk := nostr.GeneratePrivateKey()
	for i := range 3 {
		if ok, reason := c.publish(signed(t, sk, fmt.Sprintf("before %d", i))); !ok {
			t.Fatalf("event %d under 1000/1s refused: %q", i, reason)
		}
	}

	// An invalid file that would also tighten EVENT: refused, named, and
	// none of it applied.
	writeConfig(t, cfg, "limits: {message: {EVENT: [{rate: 1.5, period: 1h}]}, kinds: {r: {kinds: [70000], limits: [{rate: 5, period: 1s}]}}}\n")
	p.hangup(t)
	p.waitLog(t, 1, `"level":"ERROR"`, "reload refused", "limits.kinds.r.kinds[0]")
	for i := range 3 {
		if ok, reason := c.publish(signed(t, sk, fmt.Sprintf("after the invalid file %d", i))); !ok {
			t.Fatalf("event %d refused after an invalid reload (%q): the running 1000/1s was not kept", i, reason)
		}
	}
	c2 := dialRaw(t, ctx, p.url()) // still serving new connections
	c2.challenge()

	// Tighten EVENT to a burst of 1, never refilled during the test: the
	// connection that stayed open is refused within three events.
	writeConfig(t, cfg, "limits: {message: {EVENT: [{rate: 1.5, period: 1h}]}}\n")
	p.hangup(t)
	p.waitLog(t, 1, `"msg":"configuration reloaded"`)
	refusedAt := -1
	for i := range 3 {
		if ok, reason := c.publish(signed(t, sk, fmt.Sprintf("after %d", i))); refusedRateLimited(t, ok, reason) {
			refusedAt = i
			break
		}
	}
	if refusedAt < 0 {
		t.Fatalf("3 events on the open connection admitted after reloading a burst of 1")
	}
	if ev := getNIP11(t, ctx, p.url()).RateLimits["message"].(map[string]any)["EVENT"].([]any); len(ev) != 1 || ev[0].(map[string]any)["rate"] != 1.5 {
		t.Errorf("NIP-11 after reload: EVENT %v, want the one 1.5/1h window", ev)
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d\n%s", code, p.logs())
	}
}

// TestE2EReloadLoosens: a reload that loosens EVENT admits a client the
// old policy refused: the limiter's local table of refused clients
// (ratelimit.Limiter.Refused, asked by the gate before a frame is read)
// would keep the wait the old windows gave (here an hour) whatever the new
// ones say; Gate.Reload makes the limiter forget it.
func TestE2EReloadLoosens(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	writeConfig(t, cfg, "limits: {message: {EVENT: [{rate: 1.5, period: 1h}]}}\n")
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))
	c := dialRaw(t, ctx, p.url())
	c.challenge()
	sk := nostr.GeneratePrivateKey()
	c.publish(signed(t, sk, "burst"))
	if ok, reason := c.publish(signed(t, sk, "refused")); !refusedRateLimited(t, ok, reason) {
		t.Fatal("the second EVENT was admitted past a burst of 1")
	}
	writeConfig(t, cfg, "limits: {message: {EVENT: [{rate: 1000, period: 1s}]}}\n")
	p.hangup(t)
	p.waitLog(t, 1, `"msg":"configuration reloaded"`)
	if ok, reason := c.publish(signed(t, sk, "loosened")); !ok {
		t.Errorf("refused after reloading 1000/1s: %q", reason)
	}
}

// TestE2ETier: a pubkey of a tier (read from its pubkeys_file) that
// authenticates with NIP-42 gets the tier's EVENT budget while its
// address's is spent; a pubkey in no tier stays on the address's.
func TestE2ETier(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	sk, pk := newKey(t)
	if err := os.WriteFile(filepath.Join(dir, "members.txt"), []byte("# members\n"+pk+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "c.yaml")
	// Member tiers need relay_url, which the AUTHs must name.
	const relayURL = "ws://sluice.test"
	writeConfig(t, cfg, `relay_url: `+relayURL+`
limits: {message: {EVENT: [{rate: 1.5, period: 1h}]}}
tiers:
  members:
    pubkeys_file: members.txt
    limits: {message: {EVENT: [{rate: 1000, period: 1s}]}}
`)
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))

	anon := dialRaw(t, ctx, p.url())
	anon.challenge()
	other := nostr.GeneratePrivateKey()
	if ok, reason := anon.publish(signed(t, other, "anon 0")); !ok {
		t.Fatalf("first EVENT refused: %q", reason)
	}
	if ok, reason := anon.publish(signed(t, other, "anon 1")); !refusedRateLimited(t, ok, reason) {
		t.Fatalf("second EVENT of the address admitted past a burst of 1")
	}

	// A pubkey in no tier that authenticates stays on the address.
	stranger := dialRaw(t, ctx, p.url())
	ch := stranger.challenge()
	if ok, reason := stranger.auth(other, relayURL, ch); !ok {
		t.Fatalf("AUTH of a pubkey in no tier refused: %q", reason)
	}
	if ok, reason := stranger.publish(signed(t, other, "stranger")); !refusedRateLimited(t, ok, reason) {
		t.Errorf("a pubkey in no tier was admitted on a spent address budget")
	}

	member := dialRaw(t, ctx, p.url())
	ch = member.challenge()
	if ok, reason := member.publish(signed(t, sk, "before auth")); !refusedRateLimited(t, ok, reason) {
		t.Errorf("the member's EVENT before AUTH was admitted on the spent address budget")
	}
	if ok, reason := member.auth(sk, relayURL, ch); !ok {
		t.Fatalf("AUTH of the member refused: %q", reason)
	}
	for i := range 5 {
		if ok, reason := member.publish(signed(t, sk, fmt.Sprintf("member %d", i))); !ok {
			t.Fatalf("member EVENT %d refused on its tier's 1000/1s: %q", i, reason)
		}
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d\n%s", code, p.logs())
	}
}

// TestE2EProxyReload: sluice proxy reloads on SIGHUP too: the NIP-11
// document it serves (the upstream's, merged) gains the new kind class and
// mode, the upstream's own fields kept, and the new class limits kind 7 on
// a connection that stayed open.
func TestE2EProxyReload(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	upCfg := filepath.Join(dir, "upstream.yaml")
	writeConfig(t, upCfg, "info: {name: the-upstream}\nlimits: {message: {EVENT: [{rate: 1000, period: 1s}]}}\n")
	up := startSluice(t, "relay", "--config", upCfg, "--data-dir", filepath.Join(dir, "data"))
	cfg := filepath.Join(dir, "proxy.yaml")
	writeConfig(t, cfg, "limits: {message: {EVENT: [{rate: 1000, period: 1s}]}}\n")
	px := startSluice(t, "proxy", "--config", cfg, "--upstream", up.url())

	if doc := getNIP11(t, ctx, px.url()); doc.Name != "the-upstream" || doc.RateLimits["kinds"] != nil || doc.RateLimits["mode"] != "enforce" {
		t.Fatalf("NIP-11 before reload: name %q, rate_limits %v", doc.Name, doc.RateLimits)
	}
	c := dialRaw(t, ctx, px.url())
	c.challenge() // the upstream relay's, through the proxy
	sk := nostr.GeneratePrivateKey()
	for i := range 3 {
		if ok, reason := c.publish(signedKind(t, sk, 7, fmt.Sprintf("+%d", i))); !ok {
			t.Fatalf("reaction %d before reload refused: %q", i, reason)
		}
	}

	writeConfig(t, cfg, "limits:\n  message: {EVENT: [{rate: 1000, period: 1s}]}\n  kinds: {reactions: {kinds: [7], limits: [{rate: 1.5, period: 1h}]}}\n")
	px.hangup(t)
	px.waitLog(t, 1, `"msg":"configuration reloaded"`, `"kind_classes":1`)
	doc := getNIP11(t, ctx, px.url())
	if kinds, _ := doc.RateLimits["kinds"].(map[string]any); doc.Name != "the-upstream" || kinds["reactions"] == nil {
		t.Errorf("NIP-11 after reload: name %q, rate_limits.kinds %v: want the upstream's name and the reactions class", doc.Name, doc.RateLimits["kinds"])
	}
	refused := false
	for i := range 3 {
		if ok, reason := c.publish(signedKind(t, sk, 7, fmt.Sprintf("after %d", i))); refusedRateLimited(t, ok, reason) {
			refused = true
			break
		}
	}
	if !refused {
		t.Errorf("3 reactions admitted on the open connection after reloading a class with a burst of 1")
	}
	if ok, reason := c.publish(signedKind(t, sk, 1, "a note")); !ok {
		t.Errorf("kind 1 refused after the reactions class was spent: %q", reason)
	}
	for _, p := range []*proc{px, up} {
		if code := p.stop(); code != 0 {
			t.Errorf("exit code %d\n%s", code, p.logs())
		}
	}
}

// dialRawFrom dials url from the loopback address local; it returns the
// client, or nil and the HTTP status when the upgrade was refused.
func dialRawFrom(t *testing.T, ctx context.Context, url, local string) (*rawClient, int) {
	t.Helper()
	nd := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	d := websocket.Dialer{NetDialContext: nd.DialContext, HandshakeTimeout: 30 * time.Second}
	c, resp, err := d.DialContext(ctx, url, nil)
	if err != nil {
		if resp != nil {
			return nil, resp.StatusCode
		}
		t.Fatalf("dial %s from %s: %v", url, local, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, c: c}, http.StatusSwitchingProtocols
}

// TestE2EAggregate: clients at two addresses of one IPv4 /24 share the
// aggregate's windows: once the first has spent them, the second, whose
// own budget is untouched, is refused too (its upgrade with 429, or its
// first EVENT).
func TestE2EAggregate(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	// Per client, nothing this test sends is refused; the /24 has a burst
	// of 6 (upgrades and frames alike), not refilled during the test.
	writeConfig(t, cfg, `limits:
  connection: [{rate: 1000, period: 1s}]
  message: {EVENT: [{rate: 1000, period: 1s}]}
identity:
  ipv4_aggregate: [{prefix: 24, limits: [{rate: 6.5, period: 1h}]}]
`)
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))
	if a, code := dialRawFrom(t, ctx, p.url(), "127.0.0.2"); a == nil {
		t.Skipf("cannot connect from 127.0.0.2 (status %d)", code)
	}
	a, code := dialRawFrom(t, ctx, p.url(), "127.0.0.1")
	if a == nil {
		t.Fatalf("first client's upgrade refused: %d", code)
	}
	a.challenge()
	sk := nostr.GeneratePrivateKey()
	spent := false
	for i := range 10 {
		if ok, reason := a.publish(signed(t, sk, fmt.Sprintf("a %d", i))); refusedRateLimited(t, ok, reason) {
			spent = true
			break
		}
	}
	if !spent {
		t.Fatalf("10 EVENTs admitted within an aggregate burst of 6")
	}
	b, code := dialRawFrom(t, ctx, p.url(), "127.0.0.3")
	if b == nil {
		if code != http.StatusTooManyRequests {
			t.Errorf("second client's upgrade refused with %d, want 429", code)
		}
	} else {
		b.challenge()
		if ok, reason := b.publish(signed(t, sk, "b")); !refusedRateLimited(t, ok, reason) {
			t.Errorf("an EVENT from 127.0.0.3 was admitted after 127.0.0.1 spent their /24")
		}
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d\n%s", code, p.logs())
	}
}
