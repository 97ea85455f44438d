//go:build !race

// Left out of -race builds with the other end-to-end tests (see e2e_test.go).

package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
)

// TestE2EReplayDoesNotSpendQuota: in sluice relay, sending a pubkey's
// public events again — a note it published, an older profile (kind 0)
// than the one the relay keeps — is answered OK true by khatru but costs
// that pubkey's actor quota nothing (relay.Options.Stored from the event
// store); the pubkey's own new events are charged as before. Without it,
// the five replays below spent a quota of 3 and the victim's next note was
// refused.
func TestE2EReplayDoesNotSpendQuota(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	writeConfig(t, cfg, "quota: {events: 3, window: 1h}\n")
	p := startSluice(t, "relay", "--config", cfg, "--data-dir", filepath.Join(dir, "data"))
	victimSK, _ := newKey(t)
	sign := func(ev nostr.Event) nostr.Event {
		t.Helper()
		if err := ev.Sign(victimSK); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	now := nostr.Now()
	oldProfile := sign(nostr.Event{Kind: 0, CreatedAt: now - 100, Tags: nostr.Tags{}, Content: `{"name":"old"}`})
	newProfile := sign(nostr.Event{Kind: 0, CreatedAt: now, Tags: nostr.Tags{}, Content: `{"name":"new"}`})
	note := nostrtest.Note(t, victimSK, "hello")

	victim := dialRaw(t, ctx, p.url())
	victim.challenge()
	for i, ev := range []nostr.Event{newProfile, note} { // 2 of 3
		if ok, reason := victim.publish(ev); !ok {
			t.Fatalf("victim's event %d refused: %s", i, reason)
		}
	}
	// The replays, each from a fresh connection (a connection charges an
	// event once in any case).
	for i, ev := range []nostr.Event{note, note, note, oldProfile, oldProfile} {
		a := dialRaw(t, ctx, p.url())
		a.challenge()
		if ok, reason := a.publish(ev); !ok {
			t.Fatalf("replay %d refused: %s (khatru answers these OK true)", i, reason)
		}
	}
	if ok, reason := victim.publish(nostrtest.Note(t, victimSK, "still here")); !ok { // 3 of 3
		t.Fatalf("the victim's own note after the replays was refused: %s", reason)
	}
	if ok, reason := victim.publish(nostrtest.Note(t, victimSK, "one too many")); ok || !strings.HasPrefix(reason, "rate-limited: ") {
		t.Fatalf("the victim's 4th stored event: %v %q, want the quota's refusal", ok, reason)
	}
}
