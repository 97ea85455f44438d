package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"os"
	"path/filepath"

	badgerdb "github.com/dgraph-io/badger/v4"
	"github.com/fiatjaf/eventstore/badger"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
	"github.com/sluice-relay/sluice/cmd/sluice/internal/pgstore"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
)

const sluiceURL = "https://github.com/sluice-relay/sluice"

// relayPage is what sluice relay answers a plain GET with.
const relayPage = "This is a Nostr relay (" + sluiceURL + ").\nConnect to it with a Nostr client over WebSocket at this address.\n"

// runRelay runs khatru on the event store cfg names (openEventStore) with
// the gate in front, until ctx is done.
//
// load re-reads the configuration at SIGHUP (nil: no reload).
func runRelay(ctx context.Context, cfg *config, logger *slog.Logger, load func() (*config, error)) error {
	saved := newSavedIDs()
	gate, parts, m, err := newGate(ctx, cfg, logger, saved.take, nil)
	if err != nil {
		return err
	}

	db, err := openEventStore(cfg, logger)
	if err != nil {
		parts.close()
		return err
	}

	kr := khatru.NewRelay()
	kr.Log = slog.NewLogLogger(logger.With("component", "khatru").Handler(), slog.LevelWarn)
	kr.MaxMessageSize = cfg.ReadLimit // the gate reads no more; khatru need not either
	// khatru's message goroutines outlive the gate's drain; the guard
	// lets shutdown wait for their store calls before closing badger,
	// and keeps khatru up and NIP-09/NIP-40 true (see guardedStore).
	store := newGuardedStore(db.store, saved)
	store.logger = logger.With("component", "eventstore")
	hookStore(kr, store)
	checks := []readyCheck{parts.ready}
	if db.pg != nil {
		checks = append(checks, shareEvents(ctx, cfg, db.pg, kr, store, logger)...)
	}
	kr.Negentropy = true
	// NIP-42: khatru sends its challenge only when a hook asks for auth,
	// which none of sluice's does; without one no client could prove a
	// pubkey, and allow.pubkeys would exempt nobody. The gate records the
	// challenge on its way out and verifies the AUTH that answers it.
	kr.OnConnect = append(kr.OnConnect, khatru.RequestAuth)
	if cfg.RelayURL != "" {
		// khatru checks the AUTH relay tag as well, against ServiceURL
		// (an http(s) URL) rather than its guess from the request, so it
		// agrees with the gate about which URL names this relay.
		if kr.ServiceURL, err = nip11.URL(cfg.RelayURL); err != nil {
			db.close()
			parts.close()
			return fmt.Errorf("%w: relay_url: %v", errConfig, err)
		}
	}
	kr.Info.Name = cfg.Info.Name
	kr.Info.Description = cfg.Info.Description
	kr.Info.Contact = cfg.Info.Contact
	kr.Info.PubKey = cfg.Info.Pubkey
	kr.Info.Icon = cfg.Info.Icon
	kr.Info.Software = sluiceURL
	kr.Info.Version = buildVersion()
	kr.Info.SupportedNIPs = relaySupportedNIPs
	lim := nip11Limitation(cfg, parts.policy)
	base, err := relayNIP11(cfg, lim, db.maxLimit)
	if err != nil {
		db.close()
		parts.close()
		return err
	}
	info := &nip11.Handler{Fallback: base, Limitation: lim}
	if load != nil {
		rl := &reloader{load: load, start: cfg, gate: gate, parts: parts, m: m, logger: logger,
			nip11: publishNIP11(info, func(c *config, lim nip11.Limitation) ([]byte, error) {
				return relayNIP11(c, lim, db.maxLimit)
			})}
		go rl.run(ctx)
	}

	handler := front(info, gate.Wrap(kr), relayPage)
	logger.Info("sluice relay", "version", buildVersion(), "store", parts.store, "events", db.where)
	return serve(ctx, cfg, logger, handler, m, gate, checks,
		func(ctx context.Context) error { return store.close(ctx, db.close) },
		func(context.Context) error { return parts.close() },
	)
}

// maxQueryLimit is the most events one query returns on PostgreSQL
// (NIP-11 max_limit): badger's default, so that the document does not
// depend on the store.
const maxQueryLimit = 1000

// eventDB is the event store sluice relay runs on, badger or PostgreSQL.
type eventDB struct {
	store    eventStore     // what the guard wraps: the backend itself, so that its own methods (pgstore's Replace) show
	pg       *pgstore.Store // nil: badger
	maxLimit int
	where    string // for the log: the directory, or the database without its password
	close    func()
}

// openEventStore opens the event store cfg names: PostgreSQL at
// cfg.Database, shared by every instance on it, or else badger under
// cfg.DataDir.
//
// Badger, not LMDB, for one machine: LMDB commits and fsyncs every event,
// badger does not, so badger saves events far faster at query latencies
// of the same order (docs/BENCHMARKS.md, "The event store of `sluice
// relay` (badger or lmdb)"; docs/operations.md, "Storage: badger, not
// LMDB"), and it is pure Go, so "go build" needs no C compiler. The price
// is that an acknowledged event sits in the OS page cache until badger
// syncs: it survives a crash of sluice, not a crash of the machine.
func openEventStore(cfg *config, logger *slog.Logger) (*eventDB, error) {
	if cfg.Database != "" {
		pg, err := pgstore.Open(cfg.Database, pgstore.Limits{
			MaxLimit: maxQueryLimit, MaxSyncEvents: cfg.MaxSyncEvents, MaxValues: cfg.Bounds.MaxFilterValues,
		})
		where := redisstore.RedactURL(cfg.Database)
		if err != nil {
			return nil, fmt.Errorf("opening the event store at %s: %w", where, err)
		}
		return &eventDB{store: pg, pg: pg, maxLimit: maxQueryLimit, where: where, close: pg.Close}, nil
	}
	dir := filepath.Join(cfg.DataDir, "events")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	db := &badger.BadgerBackend{
		Path: dir,
		// Without it a NEG-OPEN may cover 16,777,216 events, and badger
		// allocates for that many on every one (see defaultMaxSyncEvents).
		MaxLimitNegentropy: cfg.MaxSyncEvents,
		BadgerOptionsModifier: func(o badgerdb.Options) badgerdb.Options {
			return o.WithLogger(badgerLogger{logger.With("component", "badger")})
		},
	}
	if err := db.Init(); err != nil {
		return nil, fmt.Errorf("opening the event store in %s: %w", dir, err)
	}
	return &eventDB{store: db, maxLimit: db.MaxLimit, where: dir, close: db.Close}, nil
}

// shareEvents makes kr one of several instances on the PostgreSQL store
// pg: what kr accepts is announced on the live feed, what others announce
// reaches kr's subscribers (and the expiration queue of store). It
// returns the readiness checks of the store and the feed.
func shareEvents(ctx context.Context, cfg *config, pg *pgstore.Store, kr *khatru.Relay, store *guardedStore, logger *slog.Logger) []readyCheck {
	log := logger.With("component", "feed")
	feed := pgstore.NewFeed(cfg.Database, pg.DB(), func(evt *nostr.Event) {
		store.expiring.track(evt)
		kr.BroadcastEvent(evt)
	}, log)
	// The client may be gone by the time it is sent; the event is stored
	// (or was accepted) and is announced all the same.
	announce := func(_ context.Context, evt *nostr.Event) { feed.Announce(evt) }
	// OnEventSaved runs where khatru notifies its own listeners: after a
	// save, not for a duplicate or a refusal.
	kr.OnEventSaved = append(kr.OnEventSaved, announce)
	kr.OnEphemeralEvent = append(kr.OnEphemeralEvent, announce)
	go feed.Run(ctx)
	return []readyCheck{
		{name: "event store", check: func(ctx context.Context) error { return pg.DB().PingContext(ctx) }},
		{name: "live feed", check: func(context.Context) error { return feed.Err() }},
	}
}

// hookStore gives khatru the guarded store and its hooks. RejectEvent
// comes first, before any hook that reads the event's tags.
func hookStore(kr *khatru.Relay, store *guardedStore) {
	kr.RejectEvent = append([]func(context.Context, *nostr.Event) (bool, string){store.RejectEvent}, kr.RejectEvent...)
	kr.StoreEvent = append(kr.StoreEvent, store.SaveEvent)
	kr.QueryEvents = append(kr.QueryEvents, store.QueryEvents)
	kr.CountEvents = append(kr.CountEvents, store.CountEvents)
	kr.DeleteEvent = append(kr.DeleteEvent, store.DeleteEvent)
	kr.ReplaceEvent = append(kr.ReplaceEvent, store.ReplaceEvent)
	kr.OnEventSaved = append(kr.OnEventSaved, store.completeDeletion)
}

// relaySupportedNIPs are the NIPs sluice relay serves end to end: khatru
// with the gate in front and the hooks sluice sets. Not NIP-86 (khatru
// lists it by default): sluice relay configures no management API and its
// front answers a POST 405.
var relaySupportedNIPs = []any{
	1,  // the protocol
	9,  // deletion: khatru deletes, guardedStore refuses what was deleted and completes deletions by address
	11, // this document
	40, // expiration: guardedStore refuses an expired event, and never serves or counts one
	42, // AUTH: the challenge on connect, verified by the gate and khatru
	45, // COUNT: CountEvents set
	70, // protected events: khatru refuses them from anyone but their authenticated author
	77, // negentropy: khatru's, the gate checks every message
}

// nip11Document is sluice relay's NIP-11 document. Unlike go-nostr's type
// it leaves out what is empty (a "" pubkey or icon says nothing true) and
// created_at_lower_limit/upper_limit, which neither khatru as sluice runs
// it nor the gate enforce: go-nostr writes them as 0, a zero-second window.
type nip11Document struct {
	Name          string          `json:"name,omitempty"`
	Description   string          `json:"description,omitempty"`
	Pubkey        string          `json:"pubkey,omitempty"`
	Contact       string          `json:"contact,omitempty"`
	Icon          string          `json:"icon,omitempty"`
	SupportedNIPs []any           `json:"supported_nips"`
	Software      string          `json:"software"`
	Version       string          `json:"version"`
	Limitation    relayLimitation `json:"limitation"`
}

// relayLimitation holds the limitation fields that come from the running
// policy. auth_required, payment_required and restricted_writes are
// false and said so: sluice relay takes events from anyone within the
// limits (limits are not conditions on who may write).
type relayLimitation struct {
	MaxMessageLength int64 `json:"max_message_length"`
	MaxSubscriptions int   `json:"max_subscriptions"`
	MaxLimit         int   `json:"max_limit"`
	MaxSubidLength   int   `json:"max_subid_length"`
	AuthRequired     bool  `json:"auth_required"`
	PaymentRequired  bool  `json:"payment_required"`
	RestrictedWrites bool  `json:"restricted_writes"`
}

// relayNIP11 builds sluice relay's document: the info section, and the
// bounds the gate and the event store enforce (lim's, as
// nip11Limitation has them from the running policy, and maxLimit, the
// event store's cap on a query).
func relayNIP11(cfg *config, lim nip11.Limitation, maxLimit int) ([]byte, error) {
	return json.Marshal(nip11Document{
		Name:          cfg.Info.Name,
		Description:   cfg.Info.Description,
		Pubkey:        cfg.Info.Pubkey,
		Contact:       cfg.Info.Contact,
		Icon:          cfg.Info.Icon,
		SupportedNIPs: relaySupportedNIPs,
		Software:      sluiceURL,
		Version:       buildVersion(),
		Limitation: relayLimitation{
			MaxMessageLength: lim.MaxMessageLength,
			MaxSubscriptions: int(lim.MaxSubscriptions),
			MaxLimit:         maxLimit,
			MaxSubidLength:   int(lim.MaxSubidLength),
		},
	})
}

// badgerLogger sends badger's chatter to slog: its Info is routine (table
// compactions), so it goes to Debug.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.l.Error(fmt.Sprintf(f, a...)) }
func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warn(fmt.Sprintf(f, a...)) }
func (b badgerLogger) Infof(f string, a ...any)    { b.l.Debug(fmt.Sprintf(f, a...)) }
func (b badgerLogger) Debugf(f string, a ...any)   { b.l.Debug(fmt.Sprintf(f, a...)) }
