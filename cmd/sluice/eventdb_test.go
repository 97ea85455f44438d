package main

import (
	"context"
	"encoding/hex"
	"errors"
	"runtime"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// blockingDB's SaveEvent waits for release; QueryEvents sends n events
// from a goroutine, as badger does.
type blockingDB struct {
	entered, release chan struct{}
	n                int
	readerDone       chan struct{}
}

func (b *blockingDB) SaveEvent(context.Context, *nostr.Event) error {
	b.entered <- struct{}{}
	<-b.release
	return nil
}
func (b *blockingDB) ReplaceEvent(context.Context, *nostr.Event) error { return nil }
func (b *blockingDB) DeleteEvent(context.Context, *nostr.Event) error  { return nil }
func (b *blockingDB) CountEvents(context.Context, nostr.Filter) (int64, error) {
	return 0, nil
}
func (b *blockingDB) QueryEvents(context.Context, nostr.Filter) (chan *nostr.Event, error) {
	ch := make(chan *nostr.Event)
	go func() {
		defer close(b.readerDone)
		defer close(ch)
		for range b.n {
			ch <- &nostr.Event{}
		}
	}()
	return ch, nil
}

// TestGuardedStoreWaitsForSave: the event store is closed only after a
// save khatru began has returned, and calls after close began are refused.
func TestGuardedStoreWaitsForSave(t *testing.T) {
	db := &blockingDB{entered: make(chan struct{}), release: make(chan struct{}), readerDone: make(chan struct{})}
	g := newGuardedStore(db, newSavedIDs())

	saved := make(chan error, 1)
	go func() { saved <- g.SaveEvent(context.Background(), &nostr.Event{}) }()
	<-db.entered

	closed := make(chan struct{})
	closeErr := make(chan error, 1)
	go func() {
		closeErr <- g.close(context.Background(), func() { close(closed) })
	}()
	// Wait until close has begun: new calls are refused.
	for g.enter() {
		g.calls.Done()
		runtime.Gosched()
	}
	if err := g.SaveEvent(context.Background(), &nostr.Event{}); !errors.Is(err, errEventStoreClosed) {
		t.Fatalf("save after close began: %v, want errEventStoreClosed", err)
	}
	select {
	case <-closed:
		t.Fatal("event store closed while a save was running")
	default:
	}
	close(db.release)
	if err := <-saved; err != nil {
		t.Fatal(err)
	}
	if err := <-closeErr; err != nil {
		t.Fatal(err)
	}
	<-closed
}

// TestGuardedStoreAbandonedQuery: khatru may read one event and drop the
// channel; close still completes, and the store's reader is drained first.
func TestGuardedStoreAbandonedQuery(t *testing.T) {
	db := &blockingDB{n: 5, readerDone: make(chan struct{})}
	g := newGuardedStore(db, newSavedIDs())
	ch, err := g.QueryEvents(context.Background(), nostr.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if evt := <-ch; evt == nil {
		t.Fatal("no first event")
	}
	closed := false
	if err := g.close(context.Background(), func() { closed = true }); err != nil {
		t.Fatal(err)
	}
	if !closed {
		t.Fatal("closeDB not called")
	}
	<-db.readerDone // the reader was drained, not left blocked
}

// TestGuardedStoreCloseTimeout: a call that never returns leaves the store
// open and close reports it, instead of hanging or closing under it.
func TestGuardedStoreCloseTimeout(t *testing.T) {
	db := &blockingDB{entered: make(chan struct{}), release: make(chan struct{})}
	g := newGuardedStore(db, newSavedIDs())
	go func() { _ = g.SaveEvent(context.Background(), &nostr.Event{}) }()
	<-db.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	if err := g.close(ctx, func() { called = true }); !errors.Is(err, context.Canceled) {
		t.Fatalf("close: %v, want context.Canceled", err)
	}
	if called {
		t.Fatal("closed under a running save")
	}
	close(db.release)
}

// TestGuardedStoreCloseThatHangs: a store whose close never returns (badger
// retrying a flush to a data directory that is gone) does not hold the
// shutdown past its timeout: close reports it and returns.
func TestGuardedStoreCloseThatHangs(t *testing.T) {
	g := newGuardedStore(&blockingDB{}, newSavedIDs())
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	defer close(release)
	err := g.close(ctx, func() {
		cancel() // the shutdown's timeout passes while the store closes
		<-release
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("close: %v, want the shutdown's context error", err)
	}
}

// TestGuardedStoreClosesLate: a shutdown whose time is already spent (on
// draining connections) still lets a store with no call running close.
func TestGuardedStoreClosesLate(t *testing.T) {
	g := newGuardedStore(&blockingDB{}, newSavedIDs())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	closed := false
	if err := g.close(ctx, func() { closed = true }); err != nil || !closed {
		t.Fatalf("close after the shutdown's time: %v, closed %v; want closed", err, closed)
	}
}

// TestSavedIDs: an id saved is taken once; one of two generations back is
// forgotten; a malformed id is ignored.
func TestSavedIDs(t *testing.T) {
	s := newSavedIDs()
	id := func(i int) (string, [32]byte) {
		var k [32]byte
		k[0], k[1] = byte(i>>8), byte(i)
		return hex.EncodeToString(k[:]), k
	}
	h0, k0 := id(0)
	s.add(h0)
	if !s.take(k0) || s.take(k0) {
		t.Fatal("a saved id is not taken exactly once")
	}
	s.add(h0)
	for i := 1; i <= savedIDsGen; i++ { // k0 goes to the previous generation
		h, _ := id(i)
		s.add(h)
	}
	if !s.take(k0) {
		t.Fatal("forgotten one generation back")
	}
	s.add(h0)
	for i := 1; i <= 2*savedIDsGen; i++ {
		h, _ := id(i % 60000)
		s.add(h)
	}
	if s.take(k0) {
		t.Fatal("remembered two generations back")
	}
	s.add("zz" + h0[2:])
	s.add(h0[:63])
	if len(s.cur)+len(s.prev) > 2*savedIDsGen {
		t.Fatal("grew past two generations")
	}
}

// replacingDB is a store whose replacement says whether it stored, as
// pgstore's does; its queries find nothing.
type replacingDB struct {
	blockingDB
	stored bool
}

func (r *replacingDB) Replace(context.Context, *nostr.Event) (bool, error) { return r.stored, nil }
func (r *replacingDB) QueryEvents(context.Context, nostr.Filter) (chan *nostr.Event, error) {
	ch := make(chan *nostr.Event)
	close(ch)
	return ch, nil
}

// TestGuardedStoreTakesReplacersWord: with a store that reports whether a
// replacement stored, the event is recorded as saved (and so charged to
// its author's quota) exactly when the store says it stored it, not by
// asking the store first, which another instance could make stale.
func TestGuardedStoreTakesReplacersWord(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	for _, stored := range []bool{false, true} {
		saved := newSavedIDs()
		g := newGuardedStore(&replacingDB{stored: stored}, saved)
		evt := &nostr.Event{Kind: 0, CreatedAt: 1000, Tags: nostr.Tags{}}
		if err := evt.Sign(sk); err != nil {
			t.Fatal(err)
		}
		if err := g.ReplaceEvent(context.Background(), evt); err != nil {
			t.Fatal(err)
		}
		var id [32]byte
		hex.Decode(id[:], []byte(evt.ID))
		if got := saved.take(id); got != stored {
			t.Errorf("store said stored=%v; recorded as saved: %v", stored, got)
		}
	}
}
