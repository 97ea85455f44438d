package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nbd-wtf/go-nostr"
)

// errEventStoreClosed answers a call to the event store after shutdown
// began closing it.
var errEventStoreClosed = errors.New("event store: closed")

// eventStore is what khatru is given of badger.
type eventStore interface {
	SaveEvent(ctx context.Context, evt *nostr.Event) error
	ReplaceEvent(ctx context.Context, evt *nostr.Event) error
	DeleteEvent(ctx context.Context, evt *nostr.Event) error
	QueryEvents(ctx context.Context, filter nostr.Filter) (chan *nostr.Event, error)
	CountEvents(ctx context.Context, filter nostr.Filter) (int64, error)
}

// guardedStore lets close wait for the event store calls in flight.
// khatru runs each message in a goroutine of its own that nothing joins:
// the gate's drain ends the connections, not a save khatru has begun, and
// closing badger under it would lose or break that save. Safe for
// concurrent use.
type guardedStore struct {
	db eventStore

	mu       sync.Mutex
	closed   bool
	calls    sync.WaitGroup
	stopping chan struct{} // closed when close begins
}

// newGuardedStore guards db.
func newGuardedStore(db eventStore) *guardedStore {
	return &guardedStore{db: db, stopping: make(chan struct{})}
}

// enter registers a call; false once close has begun.
func (g *guardedStore) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.calls.Add(1)
	return true
}

func (g *guardedStore) SaveEvent(ctx context.Context, evt *nostr.Event) error {
	if !g.enter() {
		return errEventStoreClosed
	}
	defer g.calls.Done()
	return g.db.SaveEvent(ctx, evt)
}

func (g *guardedStore) ReplaceEvent(ctx context.Context, evt *nostr.Event) error {
	if !g.enter() {
		return errEventStoreClosed
	}
	defer g.calls.Done()
	return g.db.ReplaceEvent(ctx, evt)
}

func (g *guardedStore) DeleteEvent(ctx context.Context, evt *nostr.Event) error {
	if !g.enter() {
		return errEventStoreClosed
	}
	defer g.calls.Done()
	return g.db.DeleteEvent(ctx, evt)
}

func (g *guardedStore) CountEvents(ctx context.Context, filter nostr.Filter) (int64, error) {
	if !g.enter() {
		return 0, errEventStoreClosed
	}
	defer g.calls.Done()
	return g.db.CountEvents(ctx, filter)
}

// QueryEvents holds the call open until the store has sent its last event
// (badger reads in a goroutine of its own after returning the channel).
// khatru sometimes takes only the first event and drops the channel,
// which would leave badger's reader (and this call) blocked for good: once
// close begins, what nobody reads is drained and dropped, so the reader
// ends before badger is closed.
func (g *guardedStore) QueryEvents(ctx context.Context, filter nostr.Filter) (chan *nostr.Event, error) {
	if !g.enter() {
		return nil, errEventStoreClosed
	}
	in, err := g.db.QueryEvents(ctx, filter)
	if err != nil || in == nil {
		g.calls.Done()
		return in, err
	}
	out := make(chan *nostr.Event)
	go func() {
		defer g.calls.Done()
		defer close(out)
		for evt := range in {
			select {
			case out <- evt:
			case <-g.stopping:
				for range in {
				}
				return
			}
		}
	}()
	return out, nil
}

// close refuses new calls, waits for those in flight, then runs closeDB.
// If ctx ends first, the store is left open (badger recovers from its log
// at the next start; closing it under a running call could not be undone)
// and the error says so.
func (g *guardedStore) close(ctx context.Context, closeDB func()) error {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.stopping)
	}
	g.mu.Unlock()
	done := make(chan struct{})
	go func() {
		g.calls.Wait()
		close(done)
	}()
	select {
	case <-done:
		closeDB()
		return nil
	case <-ctx.Done():
		return fmt.Errorf("event store: calls still running, left unclosed: %w", ctx.Err())
	}
}
