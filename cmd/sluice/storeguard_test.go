//go:build !race

// Left out of -race builds with the end-to-end tests: they drive khatru
// with go-nostr's Relay, which races with itself on close (see
// e2e_test.go).

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"
	"github.com/fiatjaf/eventstore/badger"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
)

// storeRelay is khatru v0.19.1 on badger with sluice relay's store hooks
// (hookStore) and no gate in front: what reaches it is whatever a client
// sends, so each guard is tested on its own, not through the gate's
// rules.
type storeRelay struct {
	url   string
	store *guardedStore
	clock *nostrtest.Clock
}

func startStoreRelay(t *testing.T) *storeRelay {
	t.Helper()
	db := &badger.BadgerBackend{Path: filepath.Join(t.TempDir(), "events"), BadgerOptionsModifier: quietBadger}
	if err := db.Init(); err != nil {
		t.Fatal(err)
	}
	clock := nostrtest.NewClock()
	store := newGuardedStore(db, newSavedIDs())
	store.now = func() nostr.Timestamp { return nostr.Timestamp(clock.Now().Unix()) }
	kr := khatru.NewRelay()
	kr.Log = log.New(io.Discard, "", 0)
	hookStore(kr, store)
	_, url := nostrtest.Serve(t, kr, func(ctx context.Context) error { return store.close(ctx, db.Close) })
	return &storeRelay{url: url, store: store, clock: clock}
}

func quietBadger(o badgerdb.Options) badgerdb.Options { return o.WithLogger(nil) }

func signedEvent(t *testing.T, sk string, evt nostr.Event) nostr.Event {
	t.Helper()
	if evt.Tags == nil {
		evt.Tags = nostr.Tags{}
	}
	if err := evt.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return evt
}

// query returns the ids the relay serves for f.
func query(t *testing.T, r *nostr.Relay, f nostr.Filter) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nostrtest.Timeout)
	defer cancel()
	evts, err := r.QuerySync(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range evts {
		ids = append(ids, e.ID)
	}
	return ids
}

// TestRelayRefusesTagsIndexedByPosition: an event with ["d"] (or any
// one-letter tag without a value, or an empty tag) gets OK false
// "invalid: …" and the relay goes on. Without the RejectEvent guard, the
// kind-0, kind-3, kind-10002 and kind-30023 events with ["d"] panic
// khatru's message goroutine (adding.go, tag[1]) and the test process
// exits.
func TestRelayRefusesTagsIndexedByPosition(t *testing.T) {
	sr := startStoreRelay(t)
	r := nostrtest.Connect(t, sr.url)
	sk := nostr.GeneratePrivateKey()
	for _, tc := range []struct {
		kind int
		tags nostr.Tags
	}{
		{0, nostr.Tags{{"d"}}},
		{3, nostr.Tags{{"p", nostrtest.PubkeyN(1)}, {"d"}}},
		{10002, nostr.Tags{{"d"}}},
		{30023, nostr.Tags{{"d"}}},
		{30023, nostr.Tags{{"d", "x"}, {"d"}}},
		{1, nostr.Tags{{"e"}}},
		{1, nostr.Tags{{"Q"}}},
		{1, nostr.Tags{{}}},
		{0, nostr.Tags{{}}},
	} {
		evt := signedEvent(t, sk, nostr.Event{Kind: tc.kind, CreatedAt: nostr.Now(), Tags: tc.tags, Content: "{}"})
		err := nostrtest.Publish(t, r, evt)
		if err == nil || !strings.HasPrefix(err.Error(), "msg: invalid: ") {
			t.Errorf("kind %d tags %v: %v, want OK false invalid: …", tc.kind, tc.tags, err)
		}
	}
	// NIP-70's ["-"] and a "d" with an empty value are fine.
	ok := signedEvent(t, sk, nostr.Event{Kind: 30023, CreatedAt: nostr.Now(), Tags: nostr.Tags{{"d", ""}}})
	if err := nostrtest.Publish(t, r, ok); err != nil {
		t.Fatalf("an addressable event with d \"\": %v", err)
	}
	if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, "still up")); err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
}

// panickyDB panics in every call.
type panickyDB struct{}

func (panickyDB) SaveEvent(context.Context, *nostr.Event) error    { panic("save") }
func (panickyDB) ReplaceEvent(context.Context, *nostr.Event) error { panic("replace") }
func (panickyDB) DeleteEvent(context.Context, *nostr.Event) error  { panic("delete") }
func (panickyDB) QueryEvents(context.Context, nostr.Filter) (chan *nostr.Event, error) {
	panic("query")
}
func (panickyDB) CountEvents(context.Context, nostr.Filter) (int64, error) { panic("count") }

// TestGuardedStoreContainsPanics: a panic in any store call is that
// call's error, the hooks answer instead of crashing, and close still
// completes (no call is left registered).
func TestGuardedStoreContainsPanics(t *testing.T) {
	g := newGuardedStore(panickyDB{}, newSavedIDs())
	ctx := context.Background()
	evt := &nostr.Event{Kind: 30000, PubKey: nostrtest.PubkeyN(1), Tags: nostr.Tags{{"d", "x"}}}
	if err := g.SaveEvent(ctx, evt); !errors.Is(err, errEventStorePanic) {
		t.Errorf("save: %v", err)
	}
	if err := g.ReplaceEvent(ctx, evt); !errors.Is(err, errEventStorePanic) {
		t.Errorf("replace: %v", err)
	}
	if err := g.DeleteEvent(ctx, evt); !errors.Is(err, errEventStorePanic) {
		t.Errorf("delete: %v", err)
	}
	if ch, err := g.QueryEvents(ctx, nostr.Filter{}); !errors.Is(err, errEventStorePanic) || ch != nil {
		t.Errorf("query: %v %v", ch, err)
	}
	if _, err := g.CountEvents(ctx, nostr.Filter{}); !errors.Is(err, errEventStorePanic) {
		t.Errorf("count: %v", err)
	}
	if reject, msg := g.RejectEvent(ctx, evt); !reject || !strings.HasPrefix(msg, "error: ") {
		t.Errorf("reject: %v %q", reject, msg)
	}
	g.completeDeletion(ctx, &nostr.Event{Kind: 5, PubKey: evt.PubKey, Tags: nostr.Tags{{"a", "30000:" + evt.PubKey + ":x"}}})
	closed := false
	if err := g.close(ctx, func() { closed = true }); err != nil || !closed {
		t.Fatalf("close: %v, closed %v", err, closed)
	}
}

// TestGuardedStoreEmptyTagName: a filter tag named "" is refused before
// badger reads it (on its own goroutine, it panics the process).
func TestGuardedStoreEmptyTagName(t *testing.T) {
	db := &badger.BadgerBackend{Path: filepath.Join(t.TempDir(), "events"), BadgerOptionsModifier: quietBadger}
	if err := db.Init(); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	g := newGuardedStore(db, newSavedIDs())
	f := nostr.Filter{Tags: nostr.TagMap{"": []string{"x"}}}
	if _, err := g.QueryEvents(context.Background(), f); !errors.Is(err, errEmptyTagName) {
		t.Errorf("query: %v", err)
	}
	if _, err := g.CountEvents(context.Background(), f); !errors.Is(err, errEmptyTagName) {
		t.Errorf("count: %v", err)
	}
}

// TestRelayDeletedStaysDeleted: an event its author deleted (by id; by
// address for an addressable and a replaceable kind) is refused when sent
// again, from another connection, and not served; a deletion by someone
// else deletes nothing and blocks nothing. Without RejectEvent's check
// the re-sent events are stored and served again; without
// completeDeletion the kind-0 event deleted by address stays served.
func TestRelayDeletedStaysDeleted(t *testing.T) {
	sr := startStoreRelay(t)
	deletionScenario(t, sr.url)
}

func deletionScenario(t *testing.T, url string) {
	t.Helper()
	author := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(author)
	other := nostr.GeneratePrivateKey()
	now := nostr.Now()
	r := nostrtest.Connect(t, url)

	note := signedEvent(t, author, nostr.Event{Kind: 1, CreatedAt: now - 10, Content: "to delete"})
	article := signedEvent(t, author, nostr.Event{Kind: 30023, CreatedAt: now - 10, Tags: nostr.Tags{{"d", "art"}}, Content: "to delete"})
	profile := signedEvent(t, author, nostr.Event{Kind: 0, CreatedAt: now - 10, Content: `{"name":"to delete"}`})
	kept := signedEvent(t, author, nostr.Event{Kind: 1, CreatedAt: now - 10, Content: "kept"})
	for _, e := range []nostr.Event{note, article, profile, kept} {
		if err := nostrtest.Publish(t, r, e); err != nil {
			t.Fatalf("publish kind %d: %v", e.Kind, err)
		}
	}
	// Someone else's deletion of kept: refused by khatru, or stored; it
	// must neither delete kept nor block it.
	_ = nostrtest.Publish(t, r, signedEvent(t, other, nostr.Event{Kind: 5, CreatedAt: now, Tags: nostr.Tags{{"e", kept.ID}}}))
	del := signedEvent(t, author, nostr.Event{Kind: 5, CreatedAt: now, Tags: nostr.Tags{
		{"e", note.ID}, {"a", "30023:" + pk + ":art"}, {"a", "0:" + pk + ":"},
	}})
	if err := nostrtest.Publish(t, r, del); err != nil {
		t.Fatalf("deletion: %v", err)
	}
	ids := []string{note.ID, article.ID, profile.ID, kept.ID}
	if got := query(t, r, nostr.Filter{IDs: ids}); len(got) != 1 || got[0] != kept.ID {
		t.Fatalf("after the deletion the relay serves %v, want only kept %s", got, kept.ID)
	}
	// Anyone sends them again, on another connection.
	r2 := nostrtest.Connect(t, url)
	for _, e := range []nostr.Event{note, article, profile} {
		nostrtest.WantReason(t, fmt.Sprintf("kind %d sent again", e.Kind), nostrtest.Publish(t, r2, e), "blocked: this event has been deleted")
	}
	if err := nostrtest.Publish(t, r2, kept); err != nil {
		t.Fatalf("kept sent again: %v", err)
	}
	if got := query(t, r2, nostr.Filter{IDs: ids}); len(got) != 1 || got[0] != kept.ID {
		t.Fatalf("after the events were sent again the relay serves %v, want only kept %s", got, kept.ID)
	}
	// A newer version at the deleted address is the author's to publish.
	newer := signedEvent(t, author, nostr.Event{Kind: 30023, CreatedAt: now + 1, Tags: nostr.Tags{{"d", "art"}}, Content: "again"})
	if err := nostrtest.Publish(t, r2, newer); err != nil {
		t.Fatalf("a newer event at the deleted address: %v", err)
	}
}

// TestRelayExpiration (NIP-40, one injected clock): an event expired on
// arrival is refused; one that expires later is served until then, and
// afterwards neither served nor counted. Without the guards khatru stores
// the expired event and serves and counts the other until its expiration
// manager's hourly pass.
func TestRelayExpiration(t *testing.T) {
	sr := startStoreRelay(t)
	t0 := nostr.Timestamp(sr.clock.Now().Unix())
	r := nostrtest.Connect(t, sr.url)
	sk := nostr.GeneratePrivateKey()
	exp := func(at nostr.Timestamp, content string) nostr.Event {
		return signedEvent(t, sk, nostr.Event{Kind: 1, CreatedAt: t0 - 20, Content: content,
			Tags: nostr.Tags{{"expiration", fmt.Sprint(at)}}})
	}
	stale := exp(t0-1, "stale")
	nostrtest.WantReason(t, "expired on arrival", nostrtest.Publish(t, r, stale), "invalid: this event has expired")
	soon := exp(t0+10, "soon")
	if err := nostrtest.Publish(t, r, soon); err != nil {
		t.Fatal(err)
	}
	f := nostr.Filter{Kinds: []int{1}, Authors: []string{soon.PubKey}}
	if got := query(t, r, f); len(got) != 1 || got[0] != soon.ID {
		t.Fatalf("before expiry: %v, want %s", got, soon.ID)
	}
	if n := count(t, r, f); n != 1 {
		t.Fatalf("count before expiry: %d, want 1", n)
	}
	sr.clock.Advance(10 * time.Second)
	if got := query(t, r, f); len(got) != 0 {
		t.Fatalf("expired event served: %v", got)
	}
	if n := count(t, r, f); n != 0 {
		t.Fatalf("expired event counted: %d", n)
	}
	nostrtest.WantReason(t, "sent again once expired", nostrtest.Publish(t, r, soon), "invalid: this event has expired")
}

func count(t *testing.T, r *nostr.Relay, f nostr.Filter) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), nostrtest.Timeout)
	defer cancel()
	n, _, err := r.Count(ctx, nostr.Filters{f})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRelayAddressDeletionLeavesNoGoroutine: a deletion by address whose
// address matches two stored events (khatru reads the first and drops the
// channel) leaves no goroutine behind. Without the filled channel each
// leaves about two (the store's reader and the forwarder, holding a badger
// read transaction) for as long as the connection lasts.
func TestRelayAddressDeletionLeavesNoGoroutine(t *testing.T) {
	sr := startStoreRelay(t)
	r := nostrtest.Connect(t, sr.url)
	const n = 50
	before := settledGoroutines()
	addressDeletions(t, r, n)
	after := settledGoroutines()
	t.Logf("%d address deletions: goroutines %d → %d", n, before, after)
	if after-before > n/5 {
		t.Fatalf("%d address deletions left %d goroutines (%d → %d)", n, after-before, before, after)
	}
}

// addressDeletions stores, n times, two kind-1 events with one "d" tag
// and deletes them by "address" ("1:<pubkey>:<d>"). khatru takes the
// address of any kind: its query (kind 1, the author, the "d" tag) is
// not one go-nostr bounds to one result, so the store sends both.
func addressDeletions(t *testing.T, r *nostr.Relay, n int) {
	t.Helper()
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	now := nostr.Now()
	for i := range n {
		d := fmt.Sprintf("addr-%d", i)
		a := signedEvent(t, sk, nostr.Event{Kind: 1, CreatedAt: now - 20, Tags: nostr.Tags{{"d", d}}, Content: "a"})
		b := signedEvent(t, sk, nostr.Event{Kind: 1, CreatedAt: now - 10, Tags: nostr.Tags{{"d", d}}, Content: "b"})
		del := signedEvent(t, sk, nostr.Event{Kind: 5, CreatedAt: now, Tags: nostr.Tags{{"a", "1:" + pk + ":" + d}}})
		for _, e := range []nostr.Event{a, b, del} {
			if err := nostrtest.Publish(t, r, e); err != nil {
				t.Fatalf("%d kind %d: %v", i, e.Kind, err)
			}
		}
	}
}

// settledGoroutines is the goroutine count once the scheduler has run
// what is ready: a reply's goroutine may still be ending after the client
// read it, a handful at most, far below the bound the tests allow.
func settledGoroutines() int {
	for range 100 {
		runtime.Gosched()
	}
	return runtime.NumGoroutine()
}
