//go:build !race

package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/noderelay"
)

// rawText sends frame as text on r and returns the next frame r reads.
func (r *rawClient) rawText(frame string) string {
	r.t.Helper()
	if err := r.c.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
		r.t.Fatalf("write: %v", err)
	}
	r.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, data, err := r.c.ReadMessage()
	if err != nil {
		r.t.Fatalf("read: %v", err)
	}
	return string(data)
}

// hostileFrames reads the shared hostile corpus (testdata/hostile): each
// frame as text, and the reply the gate must give instead of forwarding it.
func hostileFrames(t *testing.T) []struct{ Name, Frame, Want string } {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "hostile", "frames.json"))
	if err != nil {
		t.Fatal(err)
	}
	var frames []struct {
		Name     string `json:"name"`
		Frame    string `json:"frame"`
		FrameHex string `json:"frame_hex"`
		Want     string `json:"want"`
	}
	if err := json.Unmarshal(b, &frames); err != nil {
		t.Fatal(err)
	}
	if len(frames) < 40 {
		t.Fatalf("the hostile corpus has %d frames; it lost some", len(frames))
	}
	out := make([]struct{ Name, Frame, Want string }, len(frames))
	for i, f := range frames {
		if f.FrameHex != "" {
			raw, err := hex.DecodeString(f.FrameHex)
			if err != nil {
				t.Fatalf("%s: %v", f.Name, err)
			}
			f.Frame = string(raw)
		}
		out[i] = struct{ Name, Frame, Want string }{f.Name, f.Frame, f.Want}
	}
	return out
}

// TestE2EProxyNodeRelay: sluice proxy in front of a relay not written in
// Go (@nostr-relay/core, TypeScript; internal/noderelay), which serves no
// NIP-11 document and does no COUNT, negentropy or NIP-42. Through the
// binary: events published are stored and reach a live subscription; an
// author past its quota is refused with the quota's reason; COUNT and
// NEG-OPEN are refused "unsupported:" and not listed in NIP-11; every frame
// of the hostile corpus gets the gate's reply and the relay lives on; and,
// with auth: gate, an allow-listed pubkey that authenticates to the gate is
// charged nothing.
func TestE2EProxyNodeRelay(t *testing.T) {
	up := noderelay.Start(t, "") // may wait minutes for another test binary's install
	ctx := testCtx(t)
	dir := t.TempDir()

	var generous strings.Builder
	for _, typ := range []string{"EVENT", "REQ", "CLOSE", "COUNT", "AUTH", "NEG-OPEN", "NEG-MSG", "NEG-CLOSE", "OTHER"} {
		fmt.Fprintf(&generous, "%s: [{rate: 100000, period: 1s}], ", typ)
	}
	cfgA := filepath.Join(dir, "a.yaml")
	writeConfig(t, cfgA, "quota: {events: 2, window: 60s}\nlimits: {message: {"+strings.TrimSuffix(generous.String(), ", ")+"}}\n")
	pxA := startSluice(t, "proxy", "--config", cfgA, "--upstream", up)

	t.Run("publish and subscribe, quota", func(t *testing.T) {
		sk, pk := newKey(t)
		r := connect(t, ctx, pxA.url())
		sub, err := r.Subscribe(ctx, nostr.Filters{{Authors: []string{pk}}})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for i := range 2 {
			ev := signed(t, sk, fmt.Sprintf("note %d", i))
			if err := r.Publish(ctx, ev); err != nil {
				t.Fatalf("event %d within the quota: %v", i, err)
			}
			ids = append(ids, ev.ID)
		}
		err = r.Publish(ctx, signed(t, sk, "past the quota"))
		if err == nil || !strings.HasPrefix(err.Error(), "msg: rate-limited: quota: 2 events per 60s for this pubkey; retry in ") {
			t.Fatalf("event past the quota: %v, want the quota's refusal", err)
		}
		for i := range 2 {
			select {
			case ev := <-sub.Events:
				if !slices.Contains(ids, ev.ID) {
					t.Fatalf("live event %s, want one of %v", ev.ID, ids)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%d of 2 events reached the live subscription", i)
			}
		}
		got, err := connect(t, ctx, pxA.url()).QuerySync(ctx, nostr.Filter{IDs: ids})
		if err != nil || len(got) != 2 {
			t.Fatalf("query found %d of 2 events (%v)", len(got), err)
		}
	})

	t.Run("COUNT and NEG-OPEN", func(t *testing.T) {
		c := dialRaw(t, ctx, pxA.url())
		for _, f := range [][2]string{
			{`["COUNT","c",{"kinds":[1]}]`, `["CLOSED","c","unsupported: this relay does not do COUNT (NIP-45)"]`},
			{`["NEG-OPEN","n",{"kinds":[1]},"61"]`, `["NEG-ERR","n","unsupported: this relay does not do negentropy syncs (NIP-77)"]`},
		} {
			if got := c.rawText(f[0]); got != f[1] {
				t.Errorf("%s answered %s, want %s", f[0], got, f[1])
			}
		}
		if doc := getNIP11(t, ctx, pxA.url()); slices.Contains(doc.SupportedNIPs, 45) || slices.Contains(doc.SupportedNIPs, 77) {
			t.Errorf("NIP-11 through the proxy lists %v", doc.SupportedNIPs)
		}
	})

	t.Run("hostile corpus", func(t *testing.T) {
		c := dialRaw(t, ctx, pxA.url())
		for _, f := range hostileFrames(t) {
			if got := c.rawText(f.Frame); got != f.Want {
				t.Errorf("%s:\n got %s\nwant %s", f.Name, got, f.Want)
			}
		}
		// A fresh pubkey shares the slot (and budget) the quota subtest
		// filled once in 1,024 (the proxy's quota seeds its slots at
		// random): one refused by the quota is retried with another, up
		// to 3; any other refusal fails.
		r := connect(t, ctx, pxA.url())
		for try := 0; ; try++ {
			ev := signed(t, nostr.GeneratePrivateKey(), "after the corpus")
			err := r.Publish(ctx, ev)
			if err == nil {
				readBack(t, ctx, pxA.url(), ev)
				break
			}
			if try == 2 || !strings.Contains(err.Error(), "rate-limited: quota:") {
				t.Fatalf("fresh pubkey %d refused after the corpus: %v", try+1, err)
			}
		}
	})

	t.Run("auth: gate and allow.pubkeys", func(t *testing.T) {
		sk, pk := newKey(t)
		addr := freeAddr(t)
		relayURL := "ws://" + addr
		cfgB := filepath.Join(dir, "b.yaml")
		writeConfig(t, cfgB, fmt.Sprintf("auth: gate\nrelay_url: %s\nallow: {pubkeys: [%s]}\nquota: {events: 2, window: 60s}\nlimits: {message: {EVENT: [{rate: 1.5, period: 1h}]}}\n", relayURL, pk))
		pxB := startSluice(t, "proxy", "--config", cfgB, "--upstream", up, "--listen", addr)
		// The gate does NIP-42: its document says so, though the relay's
		// (it serves none) does not.
		if doc := getNIP11(t, ctx, pxB.url()); !slices.Contains(doc.SupportedNIPs, 42) {
			t.Errorf("NIP-11 of the proxy with auth: gate lists %v, want 42 among them", doc.SupportedNIPs)
		}
		member := dialRaw(t, ctx, pxB.url())
		ch := member.challenge() // the gate's: the relay sends none
		if ok, reason := member.auth(sk, relayURL, ch); !ok {
			t.Fatalf("AUTH to the gate refused: %q", reason)
		}
		var ids []string
		for i := range 3 { // past the EVENT limit's burst of one, and the quota of two
			ev := signed(t, sk, fmt.Sprintf("member %d", i))
			if ok, reason := member.publish(ev); !ok {
				t.Fatalf("allow-listed pubkey's event %d refused: %q", i, reason)
			}
			ids = append(ids, ev.ID)
		}
		// Another pubkey from the same address: the EVENT limit's burst of
		// one is still there, so the member was charged nothing.
		other := dialRaw(t, ctx, pxB.url())
		other.challenge()
		osk := nostr.GeneratePrivateKey()
		if ok, reason := other.publish(signed(t, osk, "one")); !ok {
			t.Fatalf("the address's first event refused: %q: the member's were charged to it", reason)
		}
		if ok, reason := other.publish(signed(t, osk, "two")); ok || !strings.HasPrefix(reason, "rate-limited: slow down; retry in ") {
			t.Fatalf("the address's second event: ok %v %q, want the EVENT limit's refusal", ok, reason)
		}
		// The member's events reached the relay.
		got, err := connect(t, ctx, pxA.url()).QuerySync(ctx, nostr.Filter{IDs: ids})
		if err != nil || len(got) != 3 {
			t.Fatalf("query found %d of the member's 3 events (%v)", len(got), err)
		}
	})
}
