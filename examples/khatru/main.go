// Command khatru runs a khatru relay with sluice's rate limits, in one of
// the two ways sluice offers a Go relay:
//
//	go run .          the relay behind a gate: relay.New(…).Wrap(rl)
//	go run . -hooks   the relay with sluice's functions in khatru's hook slots
//
// The gate reads every frame before khatru does, answers refused connections
// with 429 and Retry-After, and limits every message type; the hooks need no
// wrapper but see only what khatru has parsed (see hooks.Hooks). Both keep
// their budgets in process memory; share them across instances with a Redis
// store in relay.Options.Limiter / hooks.Options.Limiter.
//
// This program is its own Go module so that sluice's library does not
// depend on khatru through it.
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fiatjaf/eventstore/slicestore"
	"github.com/fiatjaf/khatru"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/hooks"
	"github.com/sluice-relay/sluice/relay/policy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7777", "address to serve the relay on")
	hooks := flag.Bool("hooks", false, "use khatru's hooks instead of a gate in front of it")
	flag.Parse()

	quota, err := ratelimit.NewQuota(600, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	handler, gate, err := build(*hooks, relay.Options{Policy: policy.Config{Quota: quota.WithClock(nil)}})
	if err != nil {
		log.Fatal(err)
	}

	srv := &http.Server{Addr: *listen, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if gate != nil {
			gate.Shutdown(shut) // closes gated WebSockets, which http.Server.Shutdown leaves open
		}
		srv.Shutdown(shut)
	}()
	log.Printf("khatru relay on ws://%s (hooks=%v)", *listen, *hooks)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// build returns a khatru relay with sluice's limits: behind a gate, or with
// hooks (then the gate is nil). Of opts, hooks use the fields hooks.Options
// shares with relay.Options.
func build(useHooks bool, opts relay.Options) (http.Handler, *relay.Gate, error) {
	rl := newKhatru()
	if useHooks {
		err := withHooks(rl, hooks.Options{
			Limiter:  opts.Limiter,
			Policy:   opts.Policy,
			Observer: opts.Observer,
		})
		return rl, nil, err
	}
	gate, err := relay.New(opts)
	if err != nil {
		return nil, nil, err
	}
	return gate.Wrap(rl), gate, nil
}

// newKhatru returns a khatru relay over an in-memory event store.
func newKhatru() *khatru.Relay {
	rl := khatru.NewRelay()
	rl.Info.Name = "sluice example"
	rl.Negentropy = true // NIP-77: NEG-OPEN is charged as its own type
	db := &slicestore.SliceStore{}
	db.Init()
	rl.StoreEvent = append(rl.StoreEvent, db.SaveEvent)
	rl.QueryEvents = append(rl.QueryEvents, db.QueryEvents)
	rl.CountEvents = append(rl.CountEvents, db.CountEvents)
	rl.DeleteEvent = append(rl.DeleteEvent, db.DeleteEvent)
	rl.ReplaceEvent = append(rl.ReplaceEvent, db.ReplaceEvent)
	return rl
}
