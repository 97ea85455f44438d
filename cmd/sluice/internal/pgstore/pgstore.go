// Package pgstore keeps the events of sluice relay in PostgreSQL, so that
// several sluice relay processes serve one relay: what one stores every
// other serves, and what one accepts every other's subscribers receive
// live.
//
// The events are eventstore's postgresql backend's (its table, its
// queries), with what that backend does not hold across processes put
// right here:
//
//   - Replacement (NIP-01 replaceable and addressable events). The backend
//     serialises a replacement with a mutex of its process, so two
//     instances replacing the same address at once can both store, and
//     keep two versions for good. Store.Replace reads, deletes the older
//     and inserts in one transaction under an advisory lock on the
//     address: every instance queues on the same lock, and the newest
//     (NIP-01: the later created_at, then the lower id) is the one left.
//   - Duplicates: an insert of an id already stored stores nothing (a
//     unique index), whichever instance raced to it, and says so
//     (eventstore.ErrDupEvent), so only the instance that stored the
//     event announces it.
//   - Expiration (NIP-40) in a count: an instance knows the expirations
//     only of the events it met, so Store.CountEvents leaves the expired
//     out in its statement rather than trusting the instance to have
//     deleted them.
//   - Query bounds: the backend's default cap of 100 events per query and
//     10 kinds or tag values per filter would refuse filters the gate
//     admits; Open sets them to the gate's bounds and badger's caps.
//
// # Live events: LISTEN/NOTIFY, not Redis
//
// An instance announces each event it accepts (stored, or ephemeral) with
// NOTIFY on one channel of the same database — after the save, from a
// queue of its own, so the publisher's OK does not wait for it, and
// batched, one statement for what queued meanwhile — and every instance LISTENs
// there and hands what others announce to its own khatru subscribers
// (khatru notifies only the listeners of its own process). PostgreSQL,
// not Redis pub/sub, because the database is already the one thing every
// instance must reach to store or serve an event, and Redis is optional
// (limits may stay in memory): one more service to run, and to fail,
// would buy nothing. A NOTIFY payload holds at most 8,000 bytes, so an
// event is sent as numbered parts when it is larger, in one statement and
// so one transaction, whose notifications PostgreSQL delivers together and
// in order.
//
// What happens when the feed is down: the event store is the truth, the
// feed a courtesy. An event is announced after it is stored, and an
// instance whose LISTEN connection is lost keeps reconnecting (with a
// backoff of a second to ten); events announced meanwhile are not
// delivered live to its subscribers, and are not replayed when it is back
// — they are in the store, and any REQ on any instance returns them. So
// are announcements dropped when the queue is past its bound (16 MiB,
// logged) or lost with the process.
// Feed.Err reports the loss (sluice relay's /readyz fails on it, so a load
// balancer sends new clients elsewhere). When PostgreSQL itself is down,
// nothing is stored, so nothing is announced: a publish is refused
// ("error: …"), never acknowledged and lost.
//
// Announced events are taken as the announcing instance checked them (id
// and signature): anyone who can NOTIFY on the database can also write
// the event table.
package pgstore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	neturl "net/url"
	"strings"

	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/eventstore/postgresql"
	"github.com/lib/pq"
	"github.com/nbd-wtf/go-nostr"
)

// Limits bounds what one query may ask and return.
type Limits struct {
	// MaxLimit caps the events one query returns (NIP-11 max_limit); a
	// filter with no limit gets a quarter of it, as badger gives.
	MaxLimit int
	// MaxSyncEvents caps the events one NIP-77 sync covers.
	MaxSyncEvents int
	// MaxValues bounds the values of one field of a filter (ids, authors,
	// kinds, and all tag values together): the gate's bound, so the
	// backend refuses nothing the gate admits.
	MaxValues int
}

// Store is the event store on PostgreSQL. Safe for concurrent use.
type Store struct {
	db      *postgresql.PostgresBackend
	sync    *postgresql.PostgresBackend // the same pool, for NIP-77 syncs
	noLimit int                         // the limit of a filter that sets none
}

// Open connects to the database at url, creates the backend's table and
// indexes if they are missing, and bounds queries by lim.
func Open(url string, lim Limits) (*Store, error) {
	db := &postgresql.PostgresBackend{DatabaseURL: withConnectTimeout(url)}
	bound(db, lim.MaxLimit, lim.MaxValues)
	if err := db.Init(); err != nil {
		if db.DB != nil {
			db.DB.Close()
		}
		return nil, err
	}
	sync := &postgresql.PostgresBackend{DB: db.DB}
	bound(sync, lim.MaxSyncEvents, lim.MaxValues)
	return &Store{db: db, sync: sync, noLimit: max(1, lim.MaxLimit/4)}, nil
}

// connectTimeout bounds a connection attempt, dial and start-up, unless
// the URL sets connect_timeout: without one lib/pq waits for ever on a
// server that accepts and never answers, and the feed would never
// reconnect.
const connectTimeout = "10"

// withConnectTimeout is url with connect_timeout set when it sets none.
func withConnectTimeout(url string) string {
	u, err := neturl.Parse(url)
	if err != nil {
		return url // lib/pq says what is wrong with it
	}
	q := u.Query()
	if q.Has("connect_timeout") {
		return url
	}
	q.Set("connect_timeout", connectTimeout)
	u.RawQuery = q.Encode()
	return u.String()
}

func bound(b *postgresql.PostgresBackend, limit, values int) {
	b.QueryLimit = limit
	b.QueryIDsLimit, b.QueryAuthorsLimit, b.QueryKindsLimit, b.QueryTagsLimit = values, values, values, values
}

// DB is the connection pool (for the feed's NOTIFY).
func (s *Store) DB() *sql.DB { return s.db.DB.DB }

// Close closes the pool.
func (s *Store) Close() { s.db.Close() }

// errCreatedAt refuses an event whose created_at the table's integer
// column cannot hold; NIP-01's prefix, as khatru passes it on.
var errCreatedAt = errors.New("invalid: created_at is out of the range this relay stores")

func storable(evt *nostr.Event) error {
	if evt.CreatedAt > math.MaxInt32 {
		return errCreatedAt
	}
	return nil
}

// SaveEvent stores evt; eventstore.ErrDupEvent when its id is stored
// already, by this instance or another.
func (s *Store) SaveEvent(ctx context.Context, evt *nostr.Event) error {
	if err := storable(evt); err != nil {
		return err
	}
	return s.db.SaveEvent(ctx, evt)
}

// DeleteEvent deletes evt by its id.
func (s *Store) DeleteEvent(ctx context.Context, evt *nostr.Event) error {
	return s.db.DeleteEvent(ctx, evt)
}

// ReplaceEvent is Replace without its report.
func (s *Store) ReplaceEvent(ctx context.Context, evt *nostr.Event) error {
	_, err := s.Replace(ctx, evt)
	return err
}

// Replace stores evt, a replaceable or addressable event, in place of the
// older events of its address, unless one at least as new is stored; it
// reports whether it stored evt. The address is locked for the
// transaction, so concurrent replacements by any number of instances
// leave exactly the newest.
func (s *Store) Replace(ctx context.Context, evt *nostr.Event) (stored bool, err error) {
	if err := storable(evt); err != nil {
		return false, err
	}
	addressable := nostr.IsAddressableKind(evt.Kind)
	d := evt.Tags.GetD()
	tx, err := s.db.DB.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey(evt.Kind, evt.PubKey, d)); err != nil {
		return false, err
	}
	q := "SELECT id, created_at, tags FROM event WHERE pubkey = $1 AND kind = $2"
	args := []any{evt.PubKey, evt.Kind}
	if addressable {
		q += " AND tagvalues && ARRAY[$3]" // any one-letter tag: narrowed to "d" below
		args = append(args, d)
	}
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return false, err
	}
	var older []string
	newer := false
	for rows.Next() {
		var id string
		var createdAt int64
		var tagsJSON []byte
		if err := rows.Scan(&id, &createdAt, &tagsJSON); err != nil {
			rows.Close()
			return false, err
		}
		if addressable {
			var tags nostr.Tags
			if err := json.Unmarshal(tagsJSON, &tags); err != nil || tags.GetD() != d {
				continue
			}
		}
		if nostr.Timestamp(createdAt) < evt.CreatedAt || (nostr.Timestamp(createdAt) == evt.CreatedAt && id > evt.ID) {
			older = append(older, id)
		} else {
			newer = true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	if newer {
		return false, tx.Commit() // the older ones stay: the newer one replaced them already
	}
	if len(older) > 0 {
		if _, err := tx.ExecContext(ctx, "DELETE FROM event WHERE id = ANY($1)", pq.Array(older)); err != nil {
			return false, err
		}
	}
	tags, _ := json.Marshal(evt.Tags)
	res, err := tx.ExecContext(ctx, `INSERT INTO event (id, pubkey, created_at, kind, tags, content, sig)
	VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING`,
		evt.ID, evt.PubKey, evt.CreatedAt, evt.Kind, tags, evt.Content, evt.Sig)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == 1, tx.Commit()
}

// lockKey is the advisory lock of an address: the first 8 bytes of its
// SHA-256. Two addresses may share a key; they then queue on each other,
// which costs time, never correctness.
func lockKey(kind int, pubkey, d string) int64 {
	h := sha256.Sum256(fmt.Appendf(nil, "%d:%s:%s", kind, pubkey, d))
	return int64(binary.BigEndian.Uint64(h[:8]))
}

// QueryEvents returns the stored events that match filter, newest first.
// The backend matches a tag value under any one-letter tag name and counts
// its limit before that; the events it returns under another name are
// left out here, so such a query may return fewer than its limit.
func (s *Store) QueryEvents(ctx context.Context, filter nostr.Filter) (chan *nostr.Event, error) {
	clamp(&filter)
	db := s.db
	if eventstore.IsNegentropySession(ctx) {
		db = s.sync
	} else if filter.Limit == 0 {
		filter.Limit = s.noLimit
	}
	in, err := db.QueryEvents(ctx, filter)
	if err != nil || len(filter.Tags) == 0 {
		return in, err
	}
	out := make(chan *nostr.Event)
	go func() {
		defer close(out)
		for evt := range in {
			if !filter.Matches(evt) {
				continue
			}
			select {
			case out <- evt:
			case <-ctx.Done():
				for range in { // the backend's reader stops on ctx too; let it finish
				}
				return
			}
		}
	}()
	return out, nil
}

// CountEvents counts the stored events that match filter and have not
// expired (NIP-40), in one statement. The expiry is checked in the
// database: an instance knows the expirations only of the events it met
// (saved, announced to it, or queried), so an expired event stored by
// another instance, by an earlier process, or while this one's feed was
// down would otherwise be counted until something deleted it. Unlike
// QueryEvents it counts a tag value under any one-letter tag name, as the
// backend's own count does.
func (s *Store) CountEvents(ctx context.Context, filter nostr.Filter) (int64, error) {
	clamp(&filter)
	q, args, err := s.countSQL(filter, nostr.Now())
	if err != nil {
		return 0, err
	}
	var n int64
	if err := s.DB().QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting events: %w", err)
	}
	return n, nil
}

// liveSQL is true of an event without a NIP-40 expiration at or before the
// instant in parameter %d, read as the relay reads one
// (nip40.GetExpiration): the first "expiration" tag with a value counts,
// and a value that is not a 64-bit integer, or is -1, means none. The
// containment test comes first: an event with no expiration tag costs no
// more. CASE, not AND, orders the checks before the cast.
const liveSQL = `NOT (tags @> '[["expiration"]]' AND COALESCE((
  SELECT CASE
    WHEN t->>1 !~ '^[+-]?[0-9]+$' THEN false
    WHEN (t->>1)::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN false
    ELSE (t->>1)::numeric <> -1 AND (t->>1)::numeric <= $%d
  END
  FROM jsonb_array_elements(tags) WITH ORDINALITY AS e(t, i)
  WHERE t->>0 = 'expiration' AND t->>1 IS NOT NULL
  ORDER BY i LIMIT 1), false))`

// countSQL is the statement counting the events that match f and live at
// now: the backend's conditions (and its bounds on a filter's values),
// and liveSQL.
func (s *Store) countSQL(f nostr.Filter, now nostr.Timestamp) (string, []any, error) {
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	switch {
	case len(f.IDs) > s.db.QueryIDsLimit:
		return "", nil, postgresql.TooManyIDs
	case len(f.Authors) > s.db.QueryAuthorsLimit:
		return "", nil, postgresql.TooManyAuthors
	case len(f.Kinds) > s.db.QueryKindsLimit:
		return "", nil, postgresql.TooManyKinds
	}
	if len(f.IDs) > 0 {
		conds = append(conds, "id = ANY("+arg(pq.Array(f.IDs))+")")
	}
	if len(f.Authors) > 0 {
		conds = append(conds, "pubkey = ANY("+arg(pq.Array(f.Authors))+")")
	}
	if len(f.Kinds) > 0 {
		kinds := make([]int64, len(f.Kinds))
		for i, k := range f.Kinds {
			kinds[i] = int64(k)
		}
		conds = append(conds, "kind = ANY("+arg(pq.Array(kinds))+")")
	}
	values := 0
	for _, vs := range f.Tags {
		if len(vs) == 0 {
			return "", nil, postgresql.EmptyTagSet
		}
		if values += len(vs); values > s.db.QueryTagsLimit {
			return "", nil, postgresql.TooManyTagValues
		}
		conds = append(conds, "tagvalues && "+arg(pq.Array(vs))+"::text[]")
	}
	if f.Since != nil {
		conds = append(conds, "created_at >= "+arg(int64(*f.Since)))
	}
	if f.Until != nil {
		conds = append(conds, "created_at <= "+arg(int64(*f.Until)))
	}
	if f.Search != "" {
		conds = append(conds, "content LIKE "+arg("%"+strings.ReplaceAll(f.Search, "%", `\%`)+"%"))
	}
	args = append(args, int64(now))
	conds = append(conds, fmt.Sprintf(liveSQL, len(args)))
	return "SELECT COUNT(*) FROM event WHERE " + strings.Join(conds, " AND "), args, nil
}

// clamp brings since and until into the table's integer range, which
// PostgreSQL would refuse a comparison with: no event lies outside it.
func clamp(f *nostr.Filter) {
	for _, t := range []**nostr.Timestamp{&f.Since, &f.Until} {
		if *t == nil {
			continue
		}
		v := min(max(**t, 0), math.MaxInt32)
		*t = &v
	}
}
