//go:build !race

// Left out of -race builds, like the other examples' tests: khatru v0.19.1
// and go-nostr v0.52.3 race on their own.

package main

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fiatjaf/eventstore/slicestore"
	"github.com/fiatjaf/khatru"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// The program against khatru behind a gate that admits 2 EVENTs at once
// and then one a second, with shaping off: 4 notes are all published and
// read back, two of them after a refusal each and no more (the program
// waits as told instead of knocking).
func TestRun(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(2.5, 700*time.Millisecond)}
	var refused atomic.Int64
	g, err := relay.New(relay.Options{
		Policy: policy.Config{Limits: &l},
		Logger: slog.New(slog.DiscardHandler),
		Observer: &policy.Observer{Frame: func(_ string, t wire.Type, o policy.Outcome) {
			if t == wire.TypeEVENT && o == policy.RateLimited {
				refused.Add(1)
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	kr := khatru.NewRelay()
	kr.Log = log.New(io.Discard, "", 0)
	st := &slicestore.SliceStore{}
	if err := st.Init(); err != nil {
		t.Fatal(err)
	}
	kr.StoreEvent = append(kr.StoreEvent, st.SaveEvent)
	kr.QueryEvents = append(kr.QueryEvents, st.QueryEvents)
	srv := httptest.NewServer(g.Wrap(kr))
	defer srv.Close()
	defer g.Shutdown(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := nostr.RelayConnect(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := run(ctx, r, nostr.GeneratePrivateKey(), 4)
	if err != nil {
		t.Fatal(err)
	}
	if got != 4 {
		t.Errorf("read %d notes back, want 4", got)
	}
	if n := refused.Load(); n != 2 {
		t.Errorf("%d EVENTs refused, want 2: one for each note past the burst", n)
	}
}
