//go:build !race

// These tests drive a real khatru relay with real go-nostr clients. They are
// left out of -race builds because khatru v0.19.1 (listener.go: a CLOSE's
// removeListenerId against a concurrent broadcast's notifyListeners) and
// go-nostr v0.52.3 (relay.go: Close reads r.Connection while the writer
// goroutine sets it to nil) race on their own, whatever is in front of
// them. The gate's own concurrency runs under -race in gate_test.go and
// quota_test.go against race-clean upstreams.

package relay

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fiatjaf/eventstore/slicestore"
	"github.com/fiatjaf/khatru"
	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// newKhatru returns a khatru relay over an in-memory event store.
func newKhatru(t testing.TB) *khatru.Relay {
	t.Helper()
	r := khatru.NewRelay()
	r.Log = log.New(io.Discard, "", 0)
	st := &slicestore.SliceStore{}
	if err := st.Init(); err != nil {
		t.Fatal(err)
	}
	r.StoreEvent = append(r.StoreEvent, st.SaveEvent)
	r.QueryEvents = append(r.QueryEvents, st.QueryEvents)
	r.CountEvents = append(r.CountEvents, st.CountEvents)
	r.DeleteEvent = append(r.DeleteEvent, st.DeleteEvent)
	r.ReplaceEvent = append(r.ReplaceEvent, st.ReplaceEvent)
	return r
}

// connect connects a go-nostr client that ignores NOTICEs.
func connect(t testing.TB, url string) *nostr.Relay {
	t.Helper()
	return nostrtest.Connect(t, url, nostr.WithNoticeHandler(func(string) {}))
}

func query(t testing.TB, r *nostr.Relay, f nostr.Filter) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := r.QuerySync(ctx, f)
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.ID
	}
	sort.Strings(ids)
	return ids
}

// scenario publishes, queries and subscribes on url and returns a
// transcript that must be the same with or without the gate.
func scenario(t *testing.T, url string) []string {
	var out []string
	sk1, sk2 := nostr.GeneratePrivateKey(), nostr.GeneratePrivateKey()
	a, b := connect(t, url), connect(t, url)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pk2, _ := nostr.GetPublicKey(sk2)
	sub, err := a.Subscribe(ctx, nostr.Filters{{Authors: []string{pk2}}})
	if err != nil {
		t.Fatal(err)
	}
	<-sub.EndOfStoredEvents

	var published []string
	for i := range 5 {
		ev := nostrtest.Note(t, sk1, fmt.Sprintf("note %d", i))
		out = append(out, fmt.Sprintf("publish %d: %v", i, nostrtest.Publish(t, a, ev)))
		published = append(published, ev.ID)
	}
	sort.Strings(published)
	pk1, _ := nostr.GetPublicKey(sk1)
	got := query(t, b, nostr.Filter{Authors: []string{pk1}})
	out = append(out, fmt.Sprintf("query finds all published: %v (%d)", strings.Join(got, ",") == strings.Join(published, ","), len(got)))

	live := nostrtest.Note(t, sk2, "live")
	out = append(out, fmt.Sprintf("publish live: %v", nostrtest.Publish(t, b, live)))
	select {
	case ev := <-sub.Events:
		out = append(out, fmt.Sprintf("live event delivered: %v", ev.ID == live.ID))
	case <-ctx.Done():
		out = append(out, "live event lost")
	}
	// An invalid event is rejected by the relay the same way.
	bad := nostrtest.Note(t, sk1, "tampered")
	bad.Content = "changed"
	// The gate refuses it before the relay sees it, in its own words.
	err = nostrtest.Publish(t, a, bad)
	out = append(out, fmt.Sprintf("publish tampered refused as invalid: %v", err != nil && strings.Contains(err.Error(), "invalid:")))
	return out
}

// (a) Under the limits the gate is invisible.
func TestE2EUnderLimitsSameAsDirect(t *testing.T) {
	direct := scenario(t, serve(t, newKhatru(t)))
	q, _ := ratelimit.NewQuota(600, time.Minute)
	g := newGate(t, Options{Policy: policy.Config{Quota: q.WithClock(nil)}})
	gated := scenario(t, serve(t, g.Wrap(newKhatru(t))))
	if strings.Join(direct, "\n") != strings.Join(gated, "\n") {
		t.Fatalf("gated transcript differs\ndirect:\n%s\ngated:\n%s", strings.Join(direct, "\n"), strings.Join(gated, "\n"))
	}
	for _, line := range direct {
		t.Log(line)
	}
	if !strings.Contains(strings.Join(gated, "\n"), "live event delivered: true") {
		t.Fatal("scenario did not exercise a live subscription")
	}
}

// tightLimits: 3 EVENTs in a burst, the rest free.
func tightLimits() *policy.Limits {
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(3, time.Second)}
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Second)}
	return &l
}

// (b) and (c): an EVENT flood is refused with each event's id and a true
// wait, REQs still pass, and a client that waits as told is admitted.
func TestE2EFloodRefusedThenAdmittedAfterWait(t *testing.T) {
	clk := nostrtest.NewClock()
	g := newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: tightLimits()}})
	url := serve(t, g.Wrap(newKhatru(t)))
	r := connect(t, url)
	sk := nostr.GeneratePrivateKey()

	var accepted []string
	var lastErr error
	for i := range 10 {
		ev := nostrtest.Note(t, sk, fmt.Sprintf("flood %d", i))
		err := nostrtest.Publish(t, r, ev)
		if i < 3 {
			if err != nil {
				t.Fatalf("event %d within the burst refused: %v", i, err)
			}
			accepted = append(accepted, ev.ID)
			continue
		}
		// go-nostr matches the OK by event id: a reply without this
		// event's id would time out instead.
		if err == nil || !strings.Contains(err.Error(), "rate-limited: slow down; retry in 1s") {
			t.Fatalf("event %d: err = %v, want rate-limited with retry in 1s", i, err)
		}
		lastErr = err
	}
	t.Logf("refusal: %v", lastErr)
	sort.Strings(accepted)
	pk, _ := nostr.GetPublicKey(sk)
	if got := query(t, r, nostr.Filter{Authors: []string{pk}}); strings.Join(got, ",") != strings.Join(accepted, ",") {
		t.Fatalf("relay holds %v, want exactly the admitted %v", got, accepted)
	}

	// Obey the wait: 1s (the rounded-up 585ms) later one more is admitted.
	clk.Advance(time.Second)
	if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, "after the wait")); err != nil {
		t.Fatalf("event after the advertised wait refused: %v", err)
	}
}

// A store outage mid-connection refuses frames honestly and heals.
func TestE2EStoreOutageFailsClosed(t *testing.T) {
	clk := nostrtest.NewClock()
	store := &nostrtest.OutageStore{Store: ratelimit.NewMemoryStore(0)}
	g := newGate(t, Options{
		Limiter: ratelimit.NewLimiter(store, clk.Now),
		Policy:  policy.Config{Limits: tightLimits()},
	})
	r := connect(t, serve(t, g.Wrap(newKhatru(t))))
	sk := nostr.GeneratePrivateKey()
	store.Down.Store(true)
	err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, "during outage"))
	if err == nil || !strings.Contains(err.Error(), scan.ReasonUnavailable) || strings.Contains(err.Error(), "rate-limited") {
		t.Fatalf("publish during outage: %v, want %q", err, scan.ReasonUnavailable)
	}
	store.Down.Store(false)
	if err := nostrtest.Publish(t, r, nostrtest.Note(t, sk, "after outage")); err != nil {
		t.Fatalf("publish after outage: %v", err)
	}
}

// redisLimiter returns a limiter on a fresh client of url.
func redisLimiter(t testing.TB, url string, clk *nostrtest.Clock) *ratelimit.Limiter {
	t.Helper()
	return redisLimiterBatch(t, url, clk, 0)
}

// redisLimiterBatch is redisLimiter with the store's Options.Batch (and 2
// workers), as the binary runs it.
func redisLimiterBatch(t testing.TB, url string, clk *nostrtest.Clock, batch int) *ratelimit.Limiter {
	t.Helper()
	client, err := redisstore.NewClient(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	// A generous deadline: these tests assert outcomes, not speed, and CI
	// runs them on a loaded machine.
	st, err := redisstore.New(client, redisstore.Options{Timeout: 2 * time.Second, Batch: batch})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var clock ratelimit.Clock
	if clk != nil {
		clock = clk.Now
	}
	return ratelimit.NewLimiter(st, clock)
}

// (d) Redis stopped: "error: rate limiter unavailable", never
// "rate-limited"; the relay healthy throughout; restarted: admitted again.
func TestE2ERedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Second)}
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(100, time.Second)}
	g := newGate(t, Options{Limiter: redisLimiter(t, srv.URL(), nil), Policy: policy.Config{Limits: &l}})
	k := newKhatru(t)
	gated := connect(t, serve(t, g.Wrap(k)))
	direct := connect(t, serve(t, k))
	sk := nostr.GeneratePrivateKey()

	if err := nostrtest.Publish(t, gated, nostrtest.Note(t, sk, "before")); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	srv.Kill()
	// Three refusals: fewer failed round trips than open the store's breaker
	// (five), so the first decision after the restart reaches Redis.
	for i := range 3 {
		err := nostrtest.Publish(t, gated, nostrtest.Note(t, sk, "during"))
		if err == nil || err.Error() != "msg: "+scan.ReasonUnavailable {
			t.Fatalf("during the outage (%d): %v, want %q", i, err, scan.ReasonUnavailable)
		}
	}
	if err := nostrtest.Publish(t, direct, nostrtest.Note(t, sk, "direct")); err != nil {
		t.Fatalf("relay unhealthy during the outage: %v", err)
	}
	srv.Restart()
	if err := nostrtest.Publish(t, gated, nostrtest.Note(t, sk, "after")); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	pk, _ := nostr.GetPublicKey(sk)
	if n := len(query(t, gated, nostr.Filter{Authors: []string{pk}})); n != 3 {
		t.Fatalf("relay holds %d events, want before, direct and after", n)
	}
}

// (e) Two gates on one Redis share one budget.
func TestE2ERedisSharedBudget(t *testing.T) {
	srv := redistest.Start(t)
	clk := nostrtest.NewClock()
	g1 := newGate(t, Options{Limiter: redisLimiter(t, srv.URL(), clk), Policy: policy.Config{Limits: tightLimits()}})
	g2 := newGate(t, Options{Limiter: redisLimiter(t, srv.URL(), clk), Policy: policy.Config{Limits: tightLimits()}})
	k := newKhatru(t)
	r1 := connect(t, serve(t, g1.Wrap(k)))
	r2 := connect(t, serve(t, g2.Wrap(k)))
	sk := nostr.GeneratePrivateKey()
	for i := range 2 {
		if err := nostrtest.Publish(t, r1, nostrtest.Note(t, sk, "via 1")); err != nil {
			t.Fatalf("gate 1 event %d: %v", i, err)
		}
	}
	if err := nostrtest.Publish(t, r2, nostrtest.Note(t, sk, "via 2")); err != nil {
		t.Fatalf("gate 2, third of the burst of 3: %v", err)
	}
	err := nostrtest.Publish(t, r2, nostrtest.Note(t, sk, "via 2 again"))
	if err == nil || !strings.HasPrefix(err.Error(), "msg: rate-limited: ") {
		t.Fatalf("fourth event through the other gate: %v, want rate-limited", err)
	}
	err = nostrtest.Publish(t, r1, nostrtest.Note(t, sk, "via 1 again"))
	if err == nil || !strings.HasPrefix(err.Error(), "msg: rate-limited: ") {
		t.Fatalf("fifth event back through gate 1: %v, want rate-limited", err)
	}
}

// (h) Proxy mode in front of khatru on its own port: go-nostr works
// through it, frames pass byte for byte, NIP-11 is proxied.
func TestE2EProxyKhatru(t *testing.T) {
	g := newGate(t, Options{})
	h, err := g.Proxy(serve(t, newKhatru(t)))
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, h)
	r := connect(t, url)
	sk := nostr.GeneratePrivateKey()
	ev := nostrtest.Note(t, sk, "proxied")
	if err := nostrtest.Publish(t, r, ev); err != nil {
		t.Fatal(err)
	}
	if got := query(t, r, nostr.Filter{IDs: []string{ev.ID}}); len(got) != 1 {
		t.Fatalf("query through the proxy: %v", got)
	}
	// An escaped sub id is not canonical: answered by the gate. A spaced
	// frame is, and its answer comes back as khatru writes it (trailing
	// newline included).
	c := dialRaw(t, url)
	_ = c.WriteMessage(websocket.TextMessage, []byte(`["REQ","s\u0031",{"ids":["`+ev.ID+`"]}]`))
	if got := readText(t, c); got != `["CLOSED","s\u0031","`+"invalid: subscription id must be 1 to 64 characters, without escapes or control characters"+`"]` {
		t.Fatalf("escaped sub id answered %s", got)
	}
	_ = c.WriteMessage(websocket.TextMessage, []byte(`["REQ", "s1" , { "ids" : ["`+ev.ID+`"] } ] `))
	var lines []string
	for range 2 {
		lines = append(lines, readText(t, c))
	}
	if !strings.HasPrefix(lines[0], `["EVENT","s1",{`) || lines[1] != "[\"EOSE\",\"s1\"]\n" {
		t.Fatalf("REQ through the proxy answered %q", lines)
	}

	req, _ := http.NewRequest("GET", "http"+strings.TrimPrefix(url, "ws"), nil)
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"software"`) {
		t.Fatalf("NIP-11 through the proxy: %s", body)
	}
}
