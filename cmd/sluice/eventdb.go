package main

import (
	"container/heap"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip40"
)

// errEventStoreClosed answers a call to the event store after shutdown
// began closing it.
var errEventStoreClosed = errors.New("event store: closed")

// errEventStorePanic answers a store call that panicked. The prefix is
// NIP-01's, as khatru passes the text on to the client.
var errEventStorePanic = errors.New("error: the event store failed on this request")

// errEmptyTagName refuses a filter with a tag named "": badger reads the
// first byte of a filter's tag name on a goroutine of its own, where a
// panic cannot be recovered. go-nostr's parser and the gate admit none;
// this holds whatever khatru itself asks.
var errEmptyTagName = errors.New("invalid: a filter tag name is empty")

// eventStore is what khatru is given of badger.
type eventStore interface {
	SaveEvent(ctx context.Context, evt *nostr.Event) error
	ReplaceEvent(ctx context.Context, evt *nostr.Event) error
	DeleteEvent(ctx context.Context, evt *nostr.Event) error
	QueryEvents(ctx context.Context, filter nostr.Filter) (chan *nostr.Event, error)
	CountEvents(ctx context.Context, filter nostr.Filter) (int64, error)
}

// guardedStore is the event store as khatru sees it in sluice relay, and
// the hooks that keep khatru v0.19.1 on badger up and truthful whatever a
// client sends (hookStore in relay.go wires them). Safe for concurrent
// use.
//
// Shutdown: close waits for the calls in flight. khatru runs each message
// in a goroutine of its own that nothing joins: the gate's drain ends the
// connections, not a save khatru has begun, and closing badger under it
// would lose or break that save.
//
// Panics: every store call it makes recovers a panic into an error for
// that call and a log line, so a panic in badger under a save, a count,
// a deletion or the start of a query ends at most that request.
//
// Goroutines: QueryEvents hands khatru a channel already filled and
// closed. khatru reads only the first event of some queries (NIP-09
// deletion by address, its deleted-checks) and drops the channel; a
// producer blocked on it would keep its goroutine and badger's read
// transaction for as long as the process runs.
//
// NIP-09 and NIP-40 (khatru's own checks miss, see RejectEvent): an event
// its author deleted is refused when anyone sends it again, a deletion
// by address deletes every event it names, and an expired event is
// refused on publish and never served or counted.
//
// What no guard here can reach: a panic in khatru's own code on its
// per-message goroutine outside these hooks, or in badger's query
// goroutine, ends the process, since Go recovers a panic only on the
// goroutine that raised it and those goroutines are khatru's and
// badger's. RejectEvent and the filter check in QueryEvents refuse, before
// khatru or badger reads them, the inputs known to cause such panics.
type guardedStore struct {
	db     eventStore
	saved  *savedIDs              // the events it stored lately (relay.Options.Stored)
	logger *slog.Logger           // nil: slog.Default()
	now    func() nostr.Timestamp // nil: nostr.Now; the one clock of NIP-40

	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup

	expiring expiryQueue
}

// newGuardedStore guards db, recording what it saves in saved.
func newGuardedStore(db eventStore, saved *savedIDs) *guardedStore {
	return &guardedStore{db: db, saved: saved}
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

func (g *guardedStore) clock() nostr.Timestamp {
	if g.now != nil {
		return g.now()
	}
	return nostr.Now()
}

func (g *guardedStore) log() *slog.Logger {
	if g.logger != nil {
		return g.logger
	}
	return slog.Default()
}

// contain, deferred first thing in a store call, turns a panic in it into
// errEventStorePanic for that call and logs it with its stack.
func (g *guardedStore) contain(op string, err *error) {
	if r := recover(); r != nil {
		g.log().Error("event store panicked: the request fails, the relay goes on",
			"op", op, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		*err = errEventStorePanic
	}
}

func (g *guardedStore) SaveEvent(ctx context.Context, evt *nostr.Event) (err error) {
	if !g.enter() {
		return errEventStoreClosed
	}
	defer g.calls.Done()
	defer g.contain("save", &err)
	err = g.db.SaveEvent(ctx, evt)
	if err == nil {
		g.saved.add(evt.ID) // not for a duplicate (eventstore.ErrDupEvent)
		g.expiring.track(evt)
	}
	return err
}

func (g *guardedStore) ReplaceEvent(ctx context.Context, evt *nostr.Event) (err error) {
	if !g.enter() {
		return errEventStoreClosed
	}
	defer g.calls.Done()
	defer g.contain("replace", &err)
	if r, ok := g.db.(replacer); ok {
		var stored bool
		if stored, err = r.Replace(ctx, evt); err == nil && stored {
			g.saved.add(evt.ID)
			g.expiring.track(evt)
		}
		return err
	}
	// badger's ReplaceEvent answers nil whether it stored evt or kept the
	// newer event it has (or evt itself, sent again): whether it will
	// store is asked first, as it decides it.
	will := g.replaces(ctx, evt)
	err = g.db.ReplaceEvent(ctx, evt)
	if err == nil && will {
		g.saved.add(evt.ID)
		g.expiring.track(evt)
	}
	return err
}

// replacer is an event store whose replacement reports whether it stored
// (pgstore): asking first, as for badger, could be made stale by another
// instance between the question and the replacement.
type replacer interface {
	Replace(ctx context.Context, evt *nostr.Event) (stored bool, err error)
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
	prevs, err := g.collect(ctx, f)
	if err != nil {
		return false // not known: not charged
	}
	will := true
	for _, prev := range prevs {
		if !(prev.CreatedAt < evt.CreatedAt || (prev.CreatedAt == evt.CreatedAt && prev.ID > evt.ID)) {
			will = false
		}
	}
	return will
}

func (g *guardedStore) DeleteEvent(ctx context.Context, evt *nostr.Event) (err error) {
	if !g.enter() {
		return errEventStoreClosed
	}
	defer g.calls.Done()
	defer g.contain("delete", &err)
	return g.db.DeleteEvent(ctx, evt)
}

// CountEvents first deletes the events it knows to have expired, so that
// the count leaves them out as queries do.
func (g *guardedStore) CountEvents(ctx context.Context, filter nostr.Filter) (n int64, err error) {
	if !tagNamesValid(filter) {
		return 0, errEmptyTagName
	}
	if !g.enter() {
		return 0, errEventStoreClosed
	}
	defer g.calls.Done()
	defer g.contain("count", &err)
	g.sweep(ctx)
	return g.db.CountEvents(ctx, filter)
}

// QueryEvents reads every event the store sends for filter before it
// returns them, in a channel holding them all, closed: nothing waits on
// whoever reads it, so khatru may drop it after one event. It costs no
// more memory than badger already takes, which gathers all its results
// before sending the first. Expired events are left out.
func (g *guardedStore) QueryEvents(ctx context.Context, filter nostr.Filter) (ch chan *nostr.Event, err error) {
	if !tagNamesValid(filter) {
		return nil, errEmptyTagName
	}
	if namesNoTag(filter) {
		out := make(chan *nostr.Event)
		close(out)
		return out, nil
	}
	if !g.enter() {
		return nil, errEventStoreClosed
	}
	defer g.calls.Done()
	defer g.contain("query", &err)
	evts, err := g.collect(ctx, filter)
	if err != nil {
		return nil, err
	}
	now := g.clock()
	out := make(chan *nostr.Event, len(evts))
	for _, evt := range evts {
		if expired(evt, now) {
			g.expiring.track(evt) // stored before this process began: deleted at the next count
			continue
		}
		out <- evt
	}
	close(out)
	return out, nil
}

// collect reads all the store sends for filter. It reads on when ctx is
// done: badger's reader does not look at ctx, and would be left blocked.
func (g *guardedStore) collect(ctx context.Context, filter nostr.Filter) ([]*nostr.Event, error) {
	in, err := g.db.QueryEvents(ctx, filter)
	if err != nil || in == nil {
		return nil, err
	}
	var evts []*nostr.Event
	for evt := range in {
		evts = append(evts, evt)
	}
	return evts, nil
}

// tagNamesValid reports whether every tag name in filter has a first byte.
func tagNamesValid(filter nostr.Filter) bool {
	for name := range filter.Tags {
		if name == "" {
			return false
		}
	}
	return true
}

// namesNoTag reports whether filter asks for a tag name that begins with
// "#". khatru's own deleted-checks ask for "#e" and "#a" on every publish
// (see RejectEvent), which no client's filter can (a filter's "#e" is the
// tag "e"), and which find nothing on badger; PostgreSQL's backend matches a
// value under any tag name, so such a query would cost a round trip and
// then be discarded. They are answered empty without a store call.
func namesNoTag(filter nostr.Filter) bool {
	for name := range filter.Tags {
		if strings.HasPrefix(name, "#") {
			return true
		}
	}
	return false
}

// expired reports whether evt has a NIP-40 expiration at or before now,
// read as khatru's expiration manager reads it (the first tag counts; a
// value that is not an integer means none).
func expired(evt *nostr.Event, now nostr.Timestamp) bool {
	exp := nip40.GetExpiration(evt.Tags)
	return exp != -1 && exp <= now
}

// RejectEvent, first of khatru's RejectEvent hooks, refuses an event
// khatru or badger would mishandle, an expired one, and one its author
// deleted.
//
// khatru's own deleted-checks ask the store for the tags "#e" and "#a",
// names no event has, so they never find a deletion; this asks for "e"
// and "a", and checks what the store returns, since badger's tag index
// matches a 32-byte value by its first 8 bytes and an address under any
// one-letter tag name.
func (g *guardedStore) RejectEvent(ctx context.Context, evt *nostr.Event) (bool, string) {
	if msg := tagProblem(evt.Tags); msg != "" {
		return true, msg
	}
	if expired(evt, g.clock()) {
		return true, "invalid: this event has expired"
	}
	if nostr.IsEphemeralKind(evt.Kind) {
		return false, "" // never stored, never deleted
	}
	gone, err := g.deleted(ctx, evt)
	if err != nil {
		return true, "error: could not check whether this event was deleted"
	}
	if gone {
		return true, "blocked: this event has been deleted"
	}
	return false, ""
}

// tagProblem says why khatru or badger cannot take tags as they are ("" when
// they can): an empty tag, or a tag named by one letter without a value.
// NIP-01 makes every one-letter tag indexable, and both read its value by
// position: khatru v0.19.1 reads a "d" tag's value unchecked for a
// replaceable or addressable kind, and panics on a goroutine nothing
// recovers, which ends the process. NIP-70's ["-"] is not a letter, and
// passes.
func tagProblem(tags nostr.Tags) string {
	for _, tag := range tags {
		switch {
		case len(tag) == 0:
			return "invalid: empty tag"
		case len(tag) == 1 && len(tag[0]) == 1 && isLetter(tag[0][0]):
			return "invalid: tag \"" + tag[0] + "\" has no value"
		}
	}
	return ""
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// deletionsChecked bounds the deletion requests read per check: those by
// evt's author that name evt's id (or its address) under the index's
// 8-byte prefix, of which there is one unless the author made more.
const deletionsChecked = 100

// deleted reports whether evt's author deleted it (NIP-09): a kind 5 of
// theirs with ["e", evt.id], or, for a replaceable or addressable evt,
// with ["a", its address] and a created_at not before evt's.
func (g *guardedStore) deleted(ctx context.Context, evt *nostr.Event) (gone bool, err error) {
	if !g.enter() {
		return false, errEventStoreClosed
	}
	defer g.calls.Done()
	defer g.contain("deleted", &err)
	dels, err := g.collect(ctx, nostr.Filter{
		Kinds: []int{nostr.KindDeletion}, Authors: []string{evt.PubKey},
		Tags: nostr.TagMap{"e": []string{evt.ID}}, Limit: deletionsChecked,
	})
	if err != nil {
		return false, err
	}
	for _, del := range dels {
		if del.PubKey == evt.PubKey && del.Kind == nostr.KindDeletion && del.Tags.FindWithValue("e", evt.ID) != nil {
			return true, nil
		}
	}
	addr, ok := address(evt)
	if !ok {
		return false, nil
	}
	since := evt.CreatedAt
	dels, err = g.collect(ctx, nostr.Filter{
		Kinds: []int{nostr.KindDeletion}, Authors: []string{evt.PubKey},
		Tags: nostr.TagMap{"a": []string{addr}}, Since: &since, Limit: deletionsChecked,
	})
	if err != nil {
		return false, err
	}
	for _, del := range dels {
		if del.PubKey == evt.PubKey && del.Kind == nostr.KindDeletion && del.CreatedAt >= evt.CreatedAt &&
			del.Tags.FindWithValue("a", addr) != nil {
			return true, nil
		}
	}
	return false, nil
}

// address is evt's NIP-01 address, "kind:pubkey:d", with an empty d for a
// replaceable kind; false for a kind that has none.
func address(evt *nostr.Event) (string, bool) {
	switch {
	case nostr.IsReplaceableKind(evt.Kind):
		return strconv.Itoa(evt.Kind) + ":" + evt.PubKey + ":", true
	case nostr.IsAddressableKind(evt.Kind):
		return strconv.Itoa(evt.Kind) + ":" + evt.PubKey + ":" + evt.Tags.GetD(), true
	}
	return "", false
}

// completeDeletion, an OnEventSaved hook, deletes every event a stored
// deletion request names by address, as NIP-09 asks: khatru deletes only
// the first event its query returns, and none of a replaceable kind (it
// asks for a "d" tag those events do not have). Only the request's
// author's events, and only those not newer than the request.
func (g *guardedStore) completeDeletion(ctx context.Context, del *nostr.Event) {
	if del.Kind != nostr.KindDeletion || !g.enter() {
		return
	}
	defer g.calls.Done()
	var err error
	defer func() {
		if err != nil {
			g.log().Warn("deletion by address left undone", "id", del.ID, "err", err)
		}
	}()
	defer g.contain("deletion by address", &err)
	for _, tag := range del.Tags {
		if len(tag) < 2 || tag[0] != "a" {
			continue
		}
		kind, pubkey, d, ok := parseAddress(tag[1])
		if !ok || pubkey != del.PubKey {
			continue
		}
		until := del.CreatedAt
		f := nostr.Filter{Kinds: []int{kind}, Authors: []string{pubkey}, Until: &until, Limit: deletionsChecked}
		if nostr.IsAddressableKind(kind) && d != "" {
			f.Tags = nostr.TagMap{"d": []string{d}} // badger indexes no empty value
		}
		var evts []*nostr.Event
		if evts, err = g.collect(ctx, f); err != nil {
			return
		}
		for _, evt := range evts {
			if a, ok := address(evt); !ok || a != tag[1] || evt.CreatedAt > del.CreatedAt {
				continue
			}
			if err = g.db.DeleteEvent(ctx, evt); err != nil {
				return
			}
		}
	}
}

// parseAddress reads "kind:pubkey:d" for a replaceable or addressable kind
// and a 64-hex-digit pubkey (a replaceable kind's d is empty).
func parseAddress(a string) (kind int, pubkey, d string, ok bool) {
	k, rest, ok1 := strings.Cut(a, ":")
	pubkey, d, ok2 := strings.Cut(rest, ":")
	kind, err := strconv.Atoi(k)
	if !ok1 || !ok2 || err != nil || len(pubkey) != 64 {
		return 0, "", "", false
	}
	if _, err := hex.DecodeString(pubkey); err != nil {
		return 0, "", "", false
	}
	if nostr.IsReplaceableKind(kind) && d == "" || nostr.IsAddressableKind(kind) {
		return kind, pubkey, d, true
	}
	return 0, "", "", false
}

// sweep deletes the events queued as expired by now (the COUNT path's way
// to leave them out).
func (g *guardedStore) sweep(ctx context.Context) {
	for _, id := range g.expiring.due(g.clock()) {
		evts, err := g.collect(ctx, nostr.Filter{IDs: []string{id}})
		if err != nil {
			continue
		}
		for _, evt := range evts {
			if evt.ID == id {
				if err := g.db.DeleteEvent(ctx, evt); err != nil {
					g.log().Warn("expired event not deleted", "id", id, "err", err)
				}
			}
		}
	}
}

// maxExpiring bounds the expiring events queued for deletion: past it an
// event is not queued, and a COUNT may include it once expired, until a
// query meets it or khatru's expiration manager deletes it. A query never
// returns it. The bound holds the queue to a few MiB.
const maxExpiring = 1 << 16

// expiryQueue holds the stored events that carry an expiration, soonest
// first. Safe for concurrent use.
type expiryQueue struct {
	mu  sync.Mutex
	h   expiryHeap
	ids map[string]struct{}
}

type expiring struct {
	at nostr.Timestamp
	id string
}

type expiryHeap []expiring

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiring)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// track queues evt if it has an expiration.
func (q *expiryQueue) track(evt *nostr.Event) {
	at := nip40.GetExpiration(evt.Tags)
	if at == -1 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ids == nil {
		q.ids = make(map[string]struct{})
	}
	if _, ok := q.ids[evt.ID]; ok || len(q.h) >= maxExpiring {
		return
	}
	q.ids[evt.ID] = struct{}{}
	heap.Push(&q.h, expiring{at: at, id: evt.ID})
}

// due takes out and returns the ids expired by now.
func (q *expiryQueue) due(now nostr.Timestamp) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var ids []string
	for len(q.h) > 0 && q.h[0].at <= now {
		e := heap.Pop(&q.h).(expiring)
		delete(q.ids, e.id)
		ids = append(ids, e.id)
	}
	return ids
}

// close refuses new calls, waits for those in flight, then runs closeDB.
// Each step has until ctx ends, and at least closeFloor: a shutdown whose
// time went to draining connections still lets a healthy store finish.
// If the calls have not ended by then, the store is left open (badger
// recovers from its log at the next start; closing it under a running
// call could not be undone); if closeDB has not returned (a store whose
// disk fails may never return), close returns while it runs on, and the
// process exits without it. Either way the error says so.
func (g *guardedStore) close(ctx context.Context, closeDB func()) error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	done := make(chan struct{})
	go func() {
		g.calls.Wait()
		close(done)
	}()
	if !closesWithin(ctx, done) {
		return fmt.Errorf("event store: calls still running, left unclosed: %w", ctx.Err())
	}
	closed := make(chan struct{})
	go func() {
		closeDB()
		close(closed)
	}()
	if !closesWithin(ctx, closed) {
		return fmt.Errorf("event store: not closed within the shutdown timeout (is its disk failing? see its errors above); what it had not yet written to disk may be lost: %w", ctx.Err())
	}
	return nil
}

// closesWithin reports whether ch closes before ctx ends or, past that, within
// closeFloor more.
func closesWithin(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-ctx.Done():
	}
	t := time.NewTimer(closeFloor)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// closeFloor is the least time each step of the event store's close is
// given, however much of the shutdown's time is left.
const closeFloor = time.Second

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
