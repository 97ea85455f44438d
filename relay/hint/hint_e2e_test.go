//go:build !race

// These tests drive a real khatru relay behind a real gate with go-nostr
// clients; they are left out of -race builds for the reasons
// relay/e2e_test.go gives (khatru and go-nostr race on their own).

package hint_test

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fiatjaf/eventstore/slicestore"
	"github.com/fiatjaf/khatru"
	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/hint"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// seen is what the gate's observer saw: every client frame, in order,
// with its outcome and when.
type seen struct {
	mu     sync.Mutex
	frames []seenFrame
}

type seenFrame struct {
	t   wire.Type
	out policy.Outcome
	at  time.Time
}

func (s *seen) of(t wire.Type) []seenFrame {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []seenFrame
	for _, f := range s.frames {
		if f.t == t {
			out = append(out, f)
		}
	}
	return out
}

// gated serves khatru behind a gate whose EVENT and REQ budgets are
// (1.5, 2 s): one of each at once, the next after exactly 2 s, told
// "retry in 2s". Shaping is off, so the gate refuses rather than holds.
func gated(t *testing.T) (string, *seen) {
	t.Helper()
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, 2*time.Second)}
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, 2*time.Second)}
	s := &seen{}
	g, err := relay.New(relay.Options{
		Policy: policy.Config{Limits: &l},
		Logger: slog.New(slog.DiscardHandler),
		Observer: &policy.Observer{Frame: func(_ string, t wire.Type, o policy.Outcome) {
			s.mu.Lock()
			s.frames = append(s.frames, seenFrame{t, o, time.Now()})
			s.mu.Unlock()
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
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
		srv.Close()
	})
	return "ws" + strings.TrimPrefix(srv.URL, "http"), s
}

// resumedOnce checks that the gate saw frames of type typ admitted, refused
// once and admitted again, and no frame of any type between the refusal
// and the frame sent again: nothing during the wait.
func (s *seen) resumedOnce(t *testing.T, typ wire.Type) {
	t.Helper()
	fs := s.of(typ)
	if got := strings.Join(outcomes(fs), " "); got != "admitted rate_limited admitted" {
		t.Fatalf("the gate saw %vs %s, want admitted rate_limited admitted", typ, got)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.frames {
		if f == fs[1] && (i+1 == len(s.frames) || s.frames[i+1] != fs[2]) {
			t.Errorf("the gate saw a %v between the refusal and the retry", s.frames[i+1].t)
		}
	}
	t.Logf("resumed %v after the refusal (hinted wait 2s)", fs[2].at.Sub(fs[1].at).Round(time.Millisecond))
}

// outcomes lists the outcomes of frames.
func outcomes(fs []seenFrame) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.out.String()
	}
	return out
}

// Refused as rate-limited with "retry in 2s", Publish sends the event
// again once, after the wait, and it is accepted: the gate sees the
// refused EVENT and then the admitted one, nothing in between. A plain
// Publish of the same refusal returns it.
func TestPublishWaitsOutTheHint(t *testing.T) {
	url, s := gated(t)
	r := nostrtest.Connect(t, url)
	sk := nostr.GeneratePrivateKey()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Publish(ctx, nostrtest.Note(t, sk, "first")); err != nil {
		t.Fatal(err)
	}
	if err := hint.Publish(ctx, r, nostrtest.Note(t, sk, "second")); err != nil {
		t.Fatalf("hint.Publish: %v", err)
	}
	s.resumedOnce(t, wire.TypeEVENT)
}

// Query reopens a subscription closed as rate-limited once the wait is
// over, and returns what the relay then has.
func TestQueryWaitsOutTheHint(t *testing.T) {
	url, s := gated(t)
	r := nostrtest.Connect(t, url)
	sk := nostr.GeneratePrivateKey()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev := nostrtest.Note(t, sk, "stored")
	if err := r.Publish(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if _, err := hint.Query(ctx, r, nostr.Filter{Kinds: []int{1}}); err != nil {
		t.Fatal(err)
	}
	evs, err := hint.Query(ctx, r, nostr.Filter{Authors: []string{ev.PubKey}})
	if err != nil {
		t.Fatalf("hint.Query: %v", err)
	}
	if len(evs) != 1 || evs[0].ID != ev.ID {
		t.Fatalf("got %d events, want the one stored", len(evs))
	}
	s.resumedOnce(t, wire.TypeREQ)
}

// A context that ends during the wait gives up at once, with the refusal
// and the context's error, having sent nothing more.
func TestPublishGivesUp(t *testing.T) {
	url, s := gated(t)
	r := nostrtest.Connect(t, url)
	sk := nostr.GeneratePrivateKey()
	if err := r.Publish(context.Background(), nostrtest.Note(t, sk, "first")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hint.Publish(ctx, r, nostrtest.Note(t, sk, "second")) }()
	// Once the gate has refused it, its reply is on the way and the client
	// is soon waiting out the 2 s it was told: end the context halfway
	// (ending it at once could beat the reply to the client, and Publish
	// would then rightly return the context's error alone).
	deadline := time.Now().Add(5 * time.Second)
	for len(s.of(wire.TypeEVENT)) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.AfterFunc(time.Second, cancel)
	err := <-done
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "retry in 2s") {
		t.Fatalf("hint.Publish = %v, want the refusal and context.Canceled", err)
	}
	if got := strings.Join(outcomes(s.of(wire.TypeEVENT)), " "); got != "admitted rate_limited" {
		t.Errorf("the gate saw EVENTs %s, want nothing after the refusal", got)
	}
}

// A relay that refuses as rate-limited without a hint (not sluice) is
// retried after the backoff, and a refusal of another kind is returned at
// once.
func TestPublishBacksOffWithoutHint(t *testing.T) {
	var mu sync.Mutex
	var tries []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			_, data, err := c.ReadMessage()
			if err != nil {
				return
			}
			env, ok := nostr.ParseMessage(string(data)).(*nostr.EventEnvelope)
			if !ok {
				continue
			}
			mu.Lock()
			tries = append(tries, time.Now())
			n := len(tries)
			mu.Unlock()
			reply := `["OK","` + env.Event.ID + `",true,""]`
			switch {
			case env.Event.Content == "blocked":
				reply = `["OK","` + env.Event.ID + `",false,"blocked: no"]`
			case n == 1:
				reply = `["OK","` + env.Event.ID + `",false,"rate-limited: slow down"]`
			}
			_ = c.WriteMessage(websocket.TextMessage, []byte(reply))
		}
	}))
	defer srv.Close()
	r := nostrtest.Connect(t, "ws"+strings.TrimPrefix(srv.URL, "http"))
	sk := nostr.GeneratePrivateKey()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hint.Publish(ctx, r, nostrtest.Note(t, sk, "x")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(tries) != 2 || tries[1].Sub(tries[0]) < time.Second {
		t.Errorf("%d tries, want 2, the second after the first backoff (1s)", len(tries))
	}
	mu.Unlock()
	if err := hint.Publish(ctx, r, nostrtest.Note(t, sk, "blocked")); err == nil || !strings.Contains(err.Error(), "blocked: no") {
		t.Errorf("a blocked refusal: %v", err)
	}
	if len(tries) != 3 {
		t.Errorf("%d tries after a blocked refusal, want it sent once", len(tries))
	}
}
