package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"
	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/eventstore/badger"
	"github.com/fiatjaf/eventstore/postgresql"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Settings of sluice relay that its khatru is given (cmd/sluice/relay.go,
// cmd/sluice/serve.go, relay.Options.Resolved and wire.MaxSubIDBytes),
// copied rather than imported so that this peer depends on none of the
// gate's code.
const (
	peerReadLimit         = 512 << 10 // relay.Options.Resolved
	peerMaxSubidLength    = 64        // wire.MaxSubIDBytes
	peerReadHeaderTimeout = 10 * time.Second
	peerIdleTimeout       = 2 * time.Minute
	peerMaxHeaderBytes    = 64 << 10
)

// newPlainKhatru opens a badger event store under dataDir/events, or
// eventstore's PostgreSQL backend at database when it is not "", and
// returns khatru on it, set up as sluice relay sets up its khatru, without
// the gate: the peer sluice relay is measured against.
//
// It must mirror runRelay in cmd/sluice/relay.go; change both together.
// Left out, on purpose: the gate (relay.Gate.Wrap) and sluice's front
// handler and NIP-11 document (khatru serves its own NIP-11 here), and
// sluice's guardedStore, which only makes shutdown wait for store calls
// in flight (a mutex and a counter per call) and changes no result.
func newPlainKhatru(dataDir, database string, logger *slog.Logger) (*khatru.Relay, func(), error) {
	db, maxLimit, closeDB, err := openPeerStore(dataDir, database, logger)
	if err != nil {
		return nil, nil, err
	}

	kr := khatru.NewRelay()
	kr.Log = slog.NewLogLogger(logger.With("component", "khatru").Handler(), slog.LevelWarn)
	kr.MaxMessageSize = peerReadLimit
	kr.StoreEvent = append(kr.StoreEvent, db.SaveEvent)
	kr.QueryEvents = append(kr.QueryEvents, db.QueryEvents)
	kr.CountEvents = append(kr.CountEvents, db.CountEvents)
	kr.DeleteEvent = append(kr.DeleteEvent, db.DeleteEvent)
	kr.ReplaceEvent = append(kr.ReplaceEvent, db.ReplaceEvent)
	kr.Negentropy = true
	// sluice relay sends every connection a NIP-42 challenge; so does this.
	kr.OnConnect = append(kr.OnConnect, khatru.RequestAuth)
	kr.Info.Name = "plain khatru (sluice-load)"
	kr.Info.Description = "khatru as sluice relay runs it, without the gate."
	kr.Info.AddSupportedNIPs([]int{9, 42, 45, 77})
	kr.Info.Limitation = &nip11.RelayLimitationDocument{
		MaxMessageLength: peerReadLimit,
		MaxLimit:         maxLimit,
		MaxSubidLength:   peerMaxSubidLength,
	}
	return kr, closeDB, nil
}

// peerStore is what khatru is given of either backend.
type peerStore interface {
	eventstore.Store
	CountEvents(ctx context.Context, filter nostr.Filter) (int64, error)
}

// openPeerStore opens eventstore's PostgreSQL backend at database, as it
// comes (the peer of sluice relay --database), or else badger under
// dataDir/events.
func openPeerStore(dataDir, database string, logger *slog.Logger) (peerStore, int, func(), error) {
	if database != "" {
		db := &postgresql.PostgresBackend{DatabaseURL: database, QueryLimit: 1000}
		if err := db.Init(); err != nil {
			return nil, 0, nil, fmt.Errorf("opening the event store in PostgreSQL: %w", err)
		}
		return db, db.QueryLimit, db.Close, nil
	}
	dir := filepath.Join(dataDir, "events")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, 0, nil, fmt.Errorf("data dir: %w", err)
	}
	db := &badger.BadgerBackend{
		Path: dir,
		BadgerOptionsModifier: func(o badgerdb.Options) badgerdb.Options {
			return o.WithLogger(badgerLogger{logger.With("component", "badger")})
		},
	}
	if err := db.Init(); err != nil {
		return nil, 0, nil, fmt.Errorf("opening the event store in %s: %w", dir, err)
	}
	return db, db.MaxLimit, db.Close, nil
}

// runKhatru serves plain khatru on listen until ctx is done, and the
// process's Go and process metrics on metrics (when not ""), as sluice's
// metrics listener serves them: the unguarded peer's goroutines and RSS.
func runKhatru(ctx context.Context, listen, dataDir, database, metrics string, logger *slog.Logger) error {
	kr, closeDB, err := newPlainKhatru(dataDir, database, logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		closeDB()
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           kr,
		ReadHeaderTimeout: peerReadHeaderTimeout,
		IdleTimeout:       peerIdleTimeout,
		MaxHeaderBytes:    peerMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if metrics != "" {
		mln, err := net.Listen("tcp", metrics)
		if err != nil {
			ln.Close()
			closeDB()
			return fmt.Errorf("metrics listen: %w", err)
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		msrv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: peerReadHeaderTimeout}
		go func() {
			if err := msrv.Serve(mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
		defer msrv.Close()
		logger.Info("plain khatru metrics", "addr", mln.Addr().String())
	}
	logger.Info("plain khatru", "addr", ln.Addr().String(), "data", dataDir, "postgres", database != "")

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	// Shutdown does not wait for hijacked (WebSocket) connections, nor
	// does khatru for its message goroutines: give those a moment before
	// badger closes under them.
	_ = srv.Shutdown(sctx)
	time.Sleep(200 * time.Millisecond)
	closeDB()
	if runErr != nil && !errors.Is(runErr, http.ErrServerClosed) {
		return runErr
	}
	return nil
}

// badgerLogger sends badger's chatter to slog, as cmd/sluice does.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.l.Error(fmt.Sprintf(f, a...)) }
func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warn(fmt.Sprintf(f, a...)) }
func (b badgerLogger) Infof(f string, a ...any)    { b.l.Debug(fmt.Sprintf(f, a...)) }
func (b badgerLogger) Debugf(f string, a ...any)   { b.l.Debug(fmt.Sprintf(f, a...)) }
