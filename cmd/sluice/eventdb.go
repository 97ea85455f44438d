package main

import (
	"context"
	"encoding/hex"
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
	db    eventStore
	saved *savedIDs // the events it stored lately (relay.Options.Stored)

	mu       sync.Mutex
	closed   bool
	calls    sync.WaitGroup
	stopping chan struct{} // closed when close begins
}

// newGuardedStore guards db, recording what it saves in saved.
func newGuardedStore(db eventStore, saved *savedIDs) *guardedStore {
	return &guardedStore{db: db, saved: saved, stopping: make(chan struct{})}
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
	err := g.db.SaveEvent(ctx, evt)
	if err == nil {
		g.saved.add(evt.ID) // not for a duplicate (eventstore.ErrDupEvent)
	}
	return err
}

func (g *guardedStore) ReplaceEvent(ctx context.Context, evt *nostr.Event) error {
	if !g.enter() {
		return errEventStoreClosed
	}
	defer g.calls.Done()
	// badger's ReplaceEvent answers nil whether it stored evt or kept the
	// newer event it has (or evt itself, sent again): whether it will
	// store is asked first, as it decides it.
	will := g.replaces(ctx, evt)
	err := g.db.ReplaceEvent(ctx, evt)
	if err == nil && will {
		g.saved.add(evt.ID)
	}
	return err
}

// replaces reports whether the store holds no event that evt would not
// replace: none of its kind, author and, for an addressable kind, "d" tag,
// or only older ones (NIP-01: an older created_at, or the same with a
// larger id), as badger's ReplaceEvent judges them.
func (g *guardedStore) replaces(ctx context.Context, evt *nostr.Event) bool {
	f := nostr.Filter{Limit: 10, Kinds: []int{evt.Kind}, Authors: []string{evt.PubKey}}
	if nostr.IsAddressableKind(evt.Kind) {
		f.Tags = nostr.TagMap{"d": []string{evt.Tags.GetD()}}
	}
	ch, err := g.db.QueryEvents(ctx, f)
	if err != nil || ch == nil {
		return false // not known: not charged
	}
	will := true
	for prev := range ch {
		if !(prev.CreatedAt < evt.CreatedAt || (prev.CreatedAt == evt.CreatedAt && prev.ID > evt.ID)) {
			will = false
		}
	}
	return will
}

// savedIDs remembers the ids of the last events the store saved, for the
// gate, which charges an actor's quota on the relay's OK only for an event
// the relay stored (relay.Options.Stored): khatru answers a duplicate, or
// an older replaceable event it does not keep, with OK true as well. Two
// generations of savedIDsGen ids each; the gate asks right after khatru's
// OK, which follows the save, or, for an event whose OK it has not seen,
// one to two seconds after forwarding it and when its connection ends.
// Safe for concurrent use.
type savedIDs struct {
	mu        sync.Mutex
	cur, prev map[[32]byte]struct{}
}

// savedIDsGen is the ids per generation: 2 × 8,192 × 32 bytes (and the
// maps' overhead) at most, far more saves than happen between one save and
// its OK.
const savedIDsGen = 8192

func newSavedIDs() *savedIDs {
	return &savedIDs{cur: make(map[[32]byte]struct{}, savedIDsGen)}
}

func (s *savedIDs) add(id string) {
	var k [32]byte
	if len(id) != 64 {
		return
	}
	if _, err := hex.Decode(k[:], []byte(id)); err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cur) >= savedIDsGen {
		s.prev, s.cur = s.cur, make(map[[32]byte]struct{}, savedIDsGen)
	}
	s.cur[k] = struct{}{}
}

// take reports whether the event with id was saved lately, and forgets
// it: the OK that answers the save is charged, a later OK for the same id
// (the event sent again, which the store refuses as a duplicate) is not.
func (s *savedIDs) take(id [32]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.cur[id]; ok {
		delete(s.cur, id)
		return true
	}
	if _, ok := s.prev[id]; ok {
		delete(s.prev, id)
		return true
	}
	return false
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
