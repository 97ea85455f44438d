package pgstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/lib/pq"
	"github.com/nbd-wtf/go-nostr"
)

// channel is the NOTIFY channel every instance announces on.
const channel = "sluice_events"

// partBytes is the most event bytes one notification carries, under
// PostgreSQL's 8,000-byte payload limit with room for the header.
const partBytes = 7900

// maxParts bounds the parts of one event a receiver accepts (about 8 MB,
// past any read_limit), and maxPending the events it assembles at once:
// a peer that sends parts and never the rest holds at most that much.
const (
	maxParts   = 1024
	maxPending = 64
)

// Feed announces the events this instance accepts and delivers those
// others announce. Run it once; safe for concurrent use.
type Feed struct {
	url     string
	db      *sql.DB
	deliver func(*nostr.Event)
	logger  *slog.Logger
	origin  string // this process's tag on its notifications: its own are skipped
	seq     atomic.Uint64

	mu   sync.Mutex
	down error // nil while listening

	// The announcements waiting for the sender: bounded in bytes, so that
	// a database slower than the publishers costs memory up to the bound
	// and then drops announcements (never events: they are stored).
	qmu     sync.Mutex
	queue   [][]byte
	qbytes  int
	dropped int
	wake    chan struct{}
}

// minReconnect and maxReconnect bound the wait between attempts to listen
// again after the connection is lost: it doubles from the one to the
// other, so a feed is back within about maxReconnect of its database.
const (
	minReconnect = time.Second
	maxReconnect = 10 * time.Second
)

// maxQueued bounds the bytes of announcements waiting to be sent, and
// maxBatch the events sent in one statement.
const (
	maxQueued = 16 << 20
	maxBatch  = 256
)

// errNotListening is Err before the first LISTEN succeeded.
var errNotListening = errors.New("live feed: not listening yet")

// NewFeed returns a feed that announces through db and listens with a
// connection of its own to url, handing each event another instance
// announces to deliver, one at a time, in the order they were announced.
func NewFeed(url string, db *sql.DB, deliver func(*nostr.Event), logger *slog.Logger) *Feed {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Feed{url: withConnectTimeout(url), db: db, deliver: deliver, logger: logger, origin: hex.EncodeToString(b[:]),
		down: errNotListening, wake: make(chan struct{}, 1)}
}

// Err is nil while the feed listens, and says why not otherwise.
func (f *Feed) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
}

func (f *Feed) setDown(err error) {
	f.mu.Lock()
	was := f.down
	f.down = err
	f.mu.Unlock()
	switch {
	case err == nil && was != nil:
		f.logger.Info("live feed listening: events stored by other instances reach this one's subscribers")
	case err != nil && was == nil:
		f.logger.Warn("live feed lost: events stored by other instances reach this one's subscribers only by REQ until it is back", "err", err)
	}
}

// Announce queues evt, stored or (ephemeral) accepted, for the other
// instances, without waiting: Run's sender sends what is queued in one
// statement per batch, in order. When the queue is full the announcement
// is dropped and counted in the log.
func (f *Feed) Announce(evt *nostr.Event) {
	body, err := evt.MarshalJSON()
	if err != nil {
		return
	}
	f.qmu.Lock()
	if f.qbytes+len(body) > maxQueued {
		f.dropped++
		f.qmu.Unlock()
		return
	}
	f.queue = append(f.queue, body)
	f.qbytes += len(body)
	f.qmu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// send sends what is queued until ctx is done.
func (f *Feed) send(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		}
		for {
			f.qmu.Lock()
			n := min(len(f.queue), maxBatch)
			batch := f.queue[:n:n]
			f.queue = f.queue[n:]
			for _, b := range batch {
				f.qbytes -= len(b)
			}
			dropped := f.dropped
			f.dropped = 0
			f.qmu.Unlock()
			if dropped > 0 {
				f.logger.Warn("events not announced to the other instances (the queue was full): their subscribers get them by REQ", "events", dropped)
			}
			if n == 0 {
				break
			}
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := f.publish(sctx, batch)
			cancel()
			if err != nil {
				f.logger.Warn("events not announced to the other instances: their subscribers get them by REQ", "events", n, "err", err)
			}
		}
	}
}

// publish sends the events in bodies (their JSON) in one statement: one
// transaction, whose notifications arrive together and in order.
func (f *Feed) publish(ctx context.Context, bodies [][]byte) error {
	var payloads []string
	for _, body := range bodies {
		parts := split(string(body), partBytes)
		if len(parts) > maxParts {
			continue // past any read_limit: not announced
		}
		head := f.origin + "." + strconv.FormatUint(f.seq.Add(1), 10) + "."
		for i, p := range parts {
			payloads = append(payloads, head+strconv.Itoa(i)+"."+strconv.Itoa(len(parts))+":"+p)
		}
	}
	_, err := f.db.ExecContext(ctx, "SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p", channel, pq.Array(payloads))
	return err
}

// split cuts s into pieces of at most n bytes, never inside a UTF-8
// sequence (a payload must be valid text).
func split(s string, n int) []string {
	var out []string
	for len(s) > n {
		i := n
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return append(out, s)
}

// Run sends what is announced and listens, until ctx is done,
// reconnecting whenever the connection is lost.
func (f *Feed) Run(ctx context.Context) {
	go f.send(ctx)
	l := pq.NewListener(f.url, minReconnect, maxReconnect, func(ev pq.ListenerEventType, err error) {
		switch ev {
		case pq.ListenerEventConnected, pq.ListenerEventReconnected:
			f.setDown(nil)
		case pq.ListenerEventDisconnected, pq.ListenerEventConnectionAttemptFailed:
			if err == nil {
				err = errors.New("disconnected")
			}
			f.setDown(fmt.Errorf("live feed: %w", err))
		}
	})
	defer l.Close()
	if err := l.Listen(channel); err != nil {
		// The listener keeps the channel and listens on it once connected.
		f.setDown(fmt.Errorf("live feed: %w", err))
	}
	pending := newAssembly()
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-l.Notify:
			if n == nil { // reconnected: parts sent meanwhile are lost
				pending = newAssembly()
				continue
			}
			if evt := pending.add(n.Extra, f.origin); evt != nil {
				f.deliver(evt)
			}
		case <-time.After(90 * time.Second):
			// A connection that died without a word (no FIN) is found by a
			// ping; the listener reconnects it.
			go func() { _ = l.Ping() }()
		}
	}
}

// assembly puts events sent in parts back together.
type assembly struct {
	parts map[string][]string // by origin.seq
	order []string            // oldest first, to drop past maxPending
}

func newAssembly() *assembly { return &assembly{parts: map[string][]string{}} }

// add takes one notification and returns the event it completes, nil when
// it completes none or is this process's own (self) or malformed.
func (a *assembly) add(payload, self string) *nostr.Event {
	head, body, ok := strings.Cut(payload, ":")
	if !ok {
		return nil
	}
	fields := strings.Split(head, ".")
	if len(fields) != 4 || fields[0] == self {
		return nil
	}
	i, err1 := strconv.Atoi(fields[2])
	n, err2 := strconv.Atoi(fields[3])
	if err1 != nil || err2 != nil || n < 1 || n > maxParts || i < 0 || i >= n {
		return nil
	}
	if n == 1 {
		return decode(body)
	}
	key := fields[0] + "." + fields[1]
	parts, ok := a.parts[key]
	if !ok {
		if len(a.order) >= maxPending {
			delete(a.parts, a.order[0])
			a.order = a.order[1:]
		}
		parts = make([]string, n)
		a.order = append(a.order, key)
	}
	if len(parts) != n {
		return nil
	}
	parts[i] = body
	a.parts[key] = parts
	for _, p := range parts {
		if p == "" {
			return nil
		}
	}
	delete(a.parts, key)
	for j, k := range a.order {
		if k == key {
			a.order = append(a.order[:j], a.order[j+1:]...)
			break
		}
	}
	return decode(strings.Join(parts, ""))
}

func decode(s string) *nostr.Event {
	evt := &nostr.Event{}
	if err := evt.UnmarshalJSON([]byte(s)); err != nil {
		return nil
	}
	return evt
}
