//go:build !race

// Left out of -race builds with the other end-to-end tests (see e2e_test.go).

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fiatjaf/eventstore/badger"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
)

// TestE2ERelayTagWithoutValue: sluice relay answers a signed kind-0 event
// with the tag ["d"] with OK false "invalid: …" and goes on serving.
// Without a guard (the gate's or the store's), khatru panics on its
// message goroutine and the process exits.
func TestE2ERelayTagWithoutValue(t *testing.T) {
	ctx := testCtx(t)
	p := startSluice(t, "relay", "--data-dir", t.TempDir())
	c := dialRaw(t, ctx, p.url())
	c.challenge()
	sk := nostr.GeneratePrivateKey()
	for _, kind := range []int{0, 30023} {
		evt := signedEvent(t, sk, nostr.Event{Kind: kind, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"d"}}, Content: "{}"})
		if ok, reason := c.publish(evt); ok || !strings.HasPrefix(reason, "invalid: ") {
			t.Fatalf("kind %d with [\"d\"]: %v %q, want OK false invalid: …", kind, ok, reason)
		}
	}
	publishAndRead(t, ctx, p.url(), signed(t, sk, "still serving"))
	select {
	case <-p.done:
		t.Fatalf("sluice exited: %v\n%s", p.waitErr, p.logs())
	default:
	}
}

// TestE2ERelayDeletedStaysDeleted: NIP-09 in sluice relay, as
// TestRelayDeletedStaysDeleted, through the gate and the binary.
func TestE2ERelayDeletedStaysDeleted(t *testing.T) {
	p := startSluice(t, "relay", "--config", generousConfig(t), "--data-dir", t.TempDir())
	deletionScenario(t, p.url())
}

// TestE2ERelayExpired: NIP-40 in sluice relay. An expired event is refused
// on publish; one already in the store when sluice starts, expired since,
// is neither served nor counted. Without the guards khatru stores the
// first and serves the second until its expiration manager's first pass,
// an hour after the start (and then only among the newest events).
func TestE2ERelayExpired(t *testing.T) {
	ctx := testCtx(t)
	data := t.TempDir()
	sk := nostr.GeneratePrivateKey()
	now := nostr.Now()
	old := signedEvent(t, sk, nostr.Event{Kind: 1, CreatedAt: now - 100, Content: "expired in the store",
		Tags: nostr.Tags{{"expiration", fmt.Sprint(now - 50)}}})
	db := &badger.BadgerBackend{Path: filepath.Join(data, "events"), BadgerOptionsModifier: quietBadger}
	if err := db.Init(); err != nil {
		t.Fatal(err)
	}
	if err := db.SaveEvent(context.Background(), &old); err != nil {
		t.Fatal(err)
	}
	db.Close()

	p := startSluice(t, "relay", "--data-dir", data)
	c := dialRaw(t, ctx, p.url())
	c.challenge()
	stale := signedEvent(t, sk, nostr.Event{Kind: 1, CreatedAt: now - 10, Content: "expired on arrival",
		Tags: nostr.Tags{{"expiration", fmt.Sprint(now - 1)}}})
	if ok, reason := c.publish(stale); ok || reason != "invalid: this event has expired" {
		t.Fatalf("expired on arrival: %v %q", ok, reason)
	}
	r := connect(t, ctx, p.url())
	for _, f := range []nostr.Filter{{IDs: []string{old.ID, stale.ID}}, {Authors: []string{old.PubKey}}} {
		if got := query(t, r, f); len(got) != 0 {
			t.Fatalf("%v: served %v", f, got)
		}
		if n := count(t, r, f); n != 0 {
			t.Fatalf("%v: counted %d", f, n)
		}
	}
}

// TestE2ERelayAddressDeletionGoroutines: 100 deletions by an address that
// two stored events match leave sluice relay's goroutine count (its
// go_goroutines metric) where it was. Before, each left one or two for as
// long as the connection lasted.
func TestE2ERelayAddressDeletionGoroutines(t *testing.T) {
	p := startSluice(t, "relay", "--config", generousConfig(t), "--data-dir", t.TempDir())
	r := nostrtest.Connect(t, p.url())
	addressDeletions(t, r, 1) // the connection's own goroutines, and badger's warm-up
	const n = 100
	before := p.metric(t, "go_goroutines")
	addressDeletions(t, r, n)
	after := p.metric(t, "go_goroutines")
	t.Logf("%d address deletions: go_goroutines %v → %v", n, before, after)
	if after-before > n/10 {
		t.Fatalf("%d address deletions left %v goroutines (%v → %v)", n, after-before, before, after)
	}
}

// generousConfig is a config file whose limits let one connection publish
// a few hundred events at once.
func generousConfig(t *testing.T) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	writeConfig(t, cfg, "quota: {unlimited: true}\nlimits: {message: {EVENT: [{rate: 1000, period: 1s}]}}\n")
	return cfg
}
