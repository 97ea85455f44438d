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
	"github.com/nbd-wtf/go-nostr/nip11"

	"github.com/sluice-relay/sluice/relay"
)

const sluiceURL = "https://github.com/sluice-relay/sluice"

// runRelay runs khatru on a badger event store under cfg.DataDir with the
// gate in front, until ctx is done.
//
// Badger, not LMDB: measured on the development machine it saved events
// about 15 times faster at equal query latency (README, "Storage"), and it
// is pure Go, so "go build" needs no C compiler. The price is that an
// acknowledged event sits in the OS page cache until badger syncs: it
// survives a crash of sluice, not a crash of the machine.
func runRelay(ctx context.Context, cfg *config, logger *slog.Logger) error {
	gate, parts, m, err := newGate(ctx, cfg, logger)
	if err != nil {
		return err
	}

	dir := filepath.Join(cfg.DataDir, "events")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		parts.close()
		return fmt.Errorf("data dir: %w", err)
	}
	db := &badger.BadgerBackend{
		Path: dir,
		BadgerOptionsModifier: func(o badgerdb.Options) badgerdb.Options {
			return o.WithLogger(badgerLogger{logger.With("component", "badger")})
		},
	}
	if err := db.Init(); err != nil {
		parts.close()
		return fmt.Errorf("opening the event store in %s: %w", dir, err)
	}

	kr := khatru.NewRelay()
	kr.Log = slog.NewLogLogger(logger.With("component", "khatru").Handler(), slog.LevelWarn)
	kr.MaxMessageSize = cfg.ReadLimit // the gate reads no more; khatru need not either
	// khatru's message goroutines outlive the gate's drain; the guard
	// lets shutdown wait for their store calls before closing badger.
	store := newGuardedStore(db)
	kr.StoreEvent = append(kr.StoreEvent, store.SaveEvent)
	kr.QueryEvents = append(kr.QueryEvents, store.QueryEvents)
	kr.CountEvents = append(kr.CountEvents, store.CountEvents)
	kr.DeleteEvent = append(kr.DeleteEvent, store.DeleteEvent)
	kr.ReplaceEvent = append(kr.ReplaceEvent, store.ReplaceEvent)
	kr.Negentropy = true
	kr.Info.Name = cfg.Info.Name
	kr.Info.Description = cfg.Info.Description
	kr.Info.Contact = cfg.Info.Contact
	kr.Info.PubKey = cfg.Info.Pubkey
	kr.Info.Icon = cfg.Info.Icon
	kr.Info.Software = sluiceURL
	kr.Info.Version = buildVersion()
	kr.Info.AddSupportedNIPs([]int{9, 45, 77})
	kr.Info.Limitation = &nip11.RelayLimitationDocument{
		MaxMessageLength: int(cfg.ReadLimit),
		MaxLimit:         db.MaxLimit, // badger caps a query's limit here
	}
	base, err := json.Marshal(kr.Info)
	if err != nil {
		db.Close()
		parts.close()
		return err
	}
	info := &relay.NIP11Handler{Fallback: base, Limitation: nip11Limitation(cfg, parts)}

	handler := front(info, gate.Wrap(kr), "This is a Nostr relay ("+sluiceURL+").\nConnect to it with a Nostr client over WebSocket at this address.\n")
	logger.Info("sluice relay", "version", buildVersion(), "store", parts.store, "data", dir)
	return serve(ctx, cfg, logger, handler, m, gate,
		func(ctx context.Context) error { return store.close(ctx, db.Close) },
		func(context.Context) error { return parts.close() },
	)
}

// badgerLogger sends badger's chatter to slog: its Info is routine (table
// compactions), so it goes to Debug.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.l.Error(fmt.Sprintf(f, a...)) }
func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warn(fmt.Sprintf(f, a...)) }
func (b badgerLogger) Infof(f string, a ...any)    { b.l.Debug(fmt.Sprintf(f, a...)) }
func (b badgerLogger) Debugf(f string, a ...any)   { b.l.Debug(fmt.Sprintf(f, a...)) }
