// Command rely runs a rely relay with sluice's rate limits, in one of the
// two ways sluice offers a Go relay:
//
//	go run .          the relay behind a gate: relay.New(…).Wrap(r)
//	go run . -hooks   the relay with sluice's functions in rely's Reject hooks
//
// The gate reads every frame before rely does, answers refused connections
// with 429 and Retry-After, and limits every message type; the hooks need no
// wrapper but see only what rely has parsed (see hooks.Hooks). Both keep
// their budgets in process memory; share them across instances with a Redis
// store in relay.Options.Limiter / hooks.Options.Limiter.
//
// This program is its own Go module so that sluice's library does not
// depend on rely through it. rely v1.2.2 asks for go-nostr v0.51.8; here it
// builds against v0.52.3, the version the rest of sluice uses.
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
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"
	"github.com/pippellia-btc/rely"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/hooks"
	"github.com/sluice-relay/sluice/relay/policy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7778", "address to serve the relay on")
	hooks := flag.Bool("hooks", false, "use rely's hooks instead of a gate in front of it")
	flag.Parse()

	quota, err := ratelimit.NewQuota(600, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	handler, r, gate, err := build(*hooks, relay.Options{Policy: policy.Config{Quota: quota.WithClock(nil)}})
	if err != nil {
		log.Fatal(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r.Start(ctx)
	srv := &http.Server{Addr: *listen, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if gate != nil {
			gate.Shutdown(shut) // closes gated WebSockets, which http.Server.Shutdown leaves open
		}
		srv.Shutdown(shut)
	}()
	log.Printf("rely relay on ws://%s (hooks=%v)", *listen, *hooks)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
	r.Wait()
}

// build returns a rely relay with sluice's limits, behind a gate or with
// hooks (then the gate is nil), and the relay itself, which the caller must
// Start. Of opts, hooks use the fields hooks.Options shares with
// relay.Options.
func build(useHooks bool, opts relay.Options) (http.Handler, *rely.Relay, *relay.Gate, error) {
	r := newRely()
	if useHooks {
		h, err := withHooks(r, hooks.Options{
			Limiter:  opts.Limiter,
			Policy:   opts.Policy,
			Observer: opts.Observer,
		})
		return h, r, nil, err
	}
	gate, err := relay.New(opts)
	if err != nil {
		return nil, nil, nil, err
	}
	// The gate sets X-Forwarded-For and X-Real-IP to the client's address
	// and removes every other client-address header (True-Client-IP, which
	// rely believes first, included), so rely needs no filter of its own.
	return gate.Wrap(r), r, gate, nil
}

// newRely returns a rely relay over an in-memory event store.
func newRely() *rely.Relay {
	db := &slicestore.SliceStore{}
	db.Init()
	r := rely.NewRelay(
		rely.WithInfo(nip11.RelayInformationDocument{Name: "sluice example", SupportedNIPs: []any{1, 11, 45}}),
	)
	r.On.Event = func(_ rely.Client, evt *nostr.Event) error {
		return db.SaveEvent(context.Background(), evt)
	}
	r.On.Req = func(ctx context.Context, _ rely.Client, filters nostr.Filters) ([]nostr.Event, error) {
		var out []nostr.Event
		for _, f := range filters {
			ch, err := db.QueryEvents(ctx, f)
			if err != nil {
				return nil, err
			}
			for evt := range ch {
				out = append(out, *evt)
			}
		}
		return out, nil
	}
	r.On.Count = func(_ rely.Client, filters nostr.Filters) (int64, bool, error) {
		var n int64
		for _, f := range filters {
			c, err := db.CountEvents(context.Background(), f)
			if err != nil {
				return 0, false, err
			}
			n += c
		}
		return n, false, nil
	}
	return r
}

// withoutHeaders serves h with the named request headers removed.
func withoutHeaders(h http.Handler, names ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, n := range names {
			r.Header.Del(n)
		}
		h.ServeHTTP(w, r)
	})
}
