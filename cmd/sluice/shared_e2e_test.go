//go:build !race

package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy"
	"github.com/nbd-wtf/go-nostr/nip77/negentropy/storage/vector"

	"github.com/sluice-relay/sluice/internal/faultproxy"
	"github.com/sluice-relay/sluice/internal/pgtest"
	"github.com/sluice-relay/sluice/internal/redistest"
)

// sharedConfig is a config file for instances that share one store: limits
// far above what the tests send, so that only sharing is under test.
func sharedConfig(t *testing.T) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	conf := `store: {timeout: 5s}
limits:
  connection: [{rate: 100000, period: 1s}]
  max_connections: 1000
  message: {EVENT: [{rate: 100000, period: 1s}], REQ: [{rate: 100000, period: 1s}]}
`
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startShared starts n sluice relays on one PostgreSQL database and one
// Redis.
func startShared(t *testing.T, n int, database string) []*proc {
	t.Helper()
	return startSharedOn(t, n, database, redistest.Start(t), sharedConfig(t))
}

// startSharedOn starts n sluice relays with the config file cfg on one
// PostgreSQL database and the Redis rd, and waits until each is ready.
func startSharedOn(t *testing.T, n int, database string, rd *redistest.Server, cfg string) []*proc {
	t.Helper()
	var ps []*proc
	for range n {
		ps = append(ps, startSluice(t, "relay", "--config", cfg, "--redis", rd.URL(), "--database", database))
	}
	// Ready is listening on the live feed: an event announced before an
	// instance listens does not reach its subscribers live.
	ctx := testCtx(t)
	for _, p := range ps {
		waitReady(t, ctx, p, http.StatusOK)
	}
	return ps
}

// subscribe opens a subscription for filter on url, with its stored
// events read and its EOSE seen.
func subscribe(t *testing.T, ctx context.Context, url string, filter nostr.Filter) *nostr.Subscription {
	t.Helper()
	sub, err := connect(t, ctx, url).Subscribe(ctx, nostr.Filters{filter})
	if err != nil {
		t.Fatalf("subscribe on %s: %v", url, err)
	}
	for {
		select {
		case <-sub.Events: // stored: go-nostr sends EOSE only once they are read
		case <-sub.EndOfStoredEvents:
			return sub
		case <-ctx.Done():
			t.Fatalf("no EOSE on %s", url)
		}
	}
}

// nextLive waits for the next live event of sub.
func nextLive(t *testing.T, ctx context.Context, sub *nostr.Subscription, what string) *nostr.Event {
	t.Helper()
	select {
	case evt := <-sub.Events:
		return evt
	case <-ctx.Done():
		t.Fatalf("%s: no live event", what)
		return nil
	}
}

// TestE2ESharedEvents: three sluice relays on one PostgreSQL and one
// Redis are one relay. An event published on A is delivered live to
// subscribers on B and C, and stored for a REQ on any; so are an ephemeral
// event and one too large for one NOTIFY. The same event published on two
// instances at once is stored once and delivered live once. A deletion
// sent to B holds on C (NIP-09), and COUNT (NIP-45) and a sync (NIP-77)
// on C cover what A stored.
func TestE2ESharedEvents(t *testing.T) {
	pg := pgtest.Start(t)
	ps := startShared(t, 3, pg.NewDatabase("shared"))
	a, b, c := ps[0].url(), ps[1].url(), ps[2].url()
	ctx := testCtx(t)
	sk, pk := newKey(t)
	mine := nostr.Filter{Authors: []string{pk}}
	subB, subC := subscribe(t, ctx, b, mine), subscribe(t, ctx, c, mine)

	ev := signed(t, sk, "published on A")
	if err := connect(t, ctx, a).Publish(ctx, ev); err != nil {
		t.Fatal(err)
	}
	for name, sub := range map[string]*nostr.Subscription{"B": subB, "C": subC} {
		if got := nextLive(t, ctx, sub, name); got.ID != ev.ID {
			t.Fatalf("live on %s: %s, want %s", name, got.ID, ev.ID)
		}
	}
	for _, u := range []string{a, b, c} {
		readBack(t, ctx, u, ev)
	}

	// Ephemeral: not stored, delivered live across instances.
	eph := nostr.Event{CreatedAt: nostr.Now(), Kind: 20001, Content: "ephemeral", Tags: nostr.Tags{}}
	if err := eph.Sign(sk); err != nil {
		t.Fatal(err)
	}
	if err := connect(t, ctx, a).Publish(ctx, eph); err != nil {
		t.Fatal(err)
	}
	if got := nextLive(t, ctx, subB, "B, ephemeral"); got.ID != eph.ID {
		t.Fatalf("ephemeral live on B: %s, want %s", got.ID, eph.ID)
	}
	nextLive(t, ctx, subC, "C, ephemeral")

	// Larger than one NOTIFY payload, with multi-byte characters across
	// the cuts.
	big := signed(t, sk, strings.Repeat("ß€𝄞x", 3000))
	if err := connect(t, ctx, a).Publish(ctx, big); err != nil {
		t.Fatal(err)
	}
	if got := nextLive(t, ctx, subB, "B, large"); got.ID != big.ID || got.Content != big.Content {
		t.Fatalf("large event live on B: %s (%d bytes), want %s", got.ID, len(got.Content), big.ID)
	}
	nextLive(t, ctx, subC, "C, large")

	// The same event through B and C at once: stored once, announced by
	// the one that stored it, so A's subscriber sees it once.
	subA := subscribe(t, ctx, a, mine)
	dup := signed(t, sk, "sent twice")
	rb, rc := connect(t, ctx, b), connect(t, ctx, c)
	var wg sync.WaitGroup
	for _, r := range []*nostr.Relay{rb, rc} {
		wg.Go(func() {
			if err := r.Publish(ctx, dup); err != nil {
				t.Errorf("duplicate publish: %v", err)
			}
		})
	}
	wg.Wait()
	if got := nextLive(t, ctx, subA, "A, duplicate"); got.ID != dup.ID {
		t.Fatalf("live on A: %s, want %s", got.ID, dup.ID)
	}
	// A marker published after it: had the duplicate been announced twice,
	// its second copy would come before the marker.
	marker := signed(t, sk, "marker")
	if err := rb.Publish(ctx, marker); err != nil {
		t.Fatal(err)
	}
	if got := nextLive(t, ctx, subA, "A, marker"); got.ID != marker.ID {
		t.Fatalf("A got %s after the duplicate, want the marker %s: the duplicate was announced twice", got.ID, marker.ID)
	}
	db, err := sql.Open("postgres", pg.URL("shared"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM event WHERE id = $1", dup.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("duplicate stored %d times (%v), want once", n, err)
	}

	// NIP-45 on C counts what A stored.
	cnt, _, err := connect(t, ctx, c).Count(ctx, nostr.Filters{{Authors: []string{pk}, Kinds: []int{1}}})
	if err != nil || cnt != 4 {
		t.Fatalf("COUNT on C: %d (%v), want 4", cnt, err)
	}

	// NIP-77 on C covers what A stored: a client holding nothing learns
	// from C's answer that it lacks the event published on A.
	raw := dialRaw(t, ctx, c)
	raw.challenge()
	v := vector.New()
	v.Seal()
	neg := negentropy.New(v, 1024*1024)
	open := fmt.Sprintf(`["NEG-OPEN","sync",{"authors":[%q],"kinds":[1]},%q]`, pk, neg.Start())
	if err := raw.c.WriteMessage(websocket.TextMessage, []byte(open)); err != nil {
		t.Fatal(err)
	}
	msg := raw.read()
	var label, hexMsg string
	if len(msg) != 3 || json.Unmarshal(msg[0], &label) != nil || label != "NEG-MSG" || json.Unmarshal(msg[2], &hexMsg) != nil {
		t.Fatalf("NEG-OPEN on C answered %s", msg)
	}
	if _, err := neg.Reconcile(hexMsg); err != nil {
		t.Fatal(err)
	}
	lacks := map[string]bool{}
	for len(neg.HaveNots) > 0 {
		lacks[<-neg.HaveNots] = true
	}
	if !lacks[ev.ID] || !lacks[big.ID] {
		t.Fatalf("NEG-MSG from C names %d events, not the ones published on A", len(lacks))
	}

	// NIP-09: deleted through B, gone on C, refused again on A.
	del := nostr.Event{CreatedAt: nostr.Now(), Kind: nostr.KindDeletion, Tags: nostr.Tags{{"e", ev.ID}}}
	if err := del.Sign(sk); err != nil {
		t.Fatal(err)
	}
	if err := rb.Publish(ctx, del); err != nil {
		t.Fatal(err)
	}
	if got := query(t, connect(t, ctx, c), nostr.Filter{IDs: []string{ev.ID}}); len(got) != 0 {
		t.Fatalf("deleted on B, still served by C: %v", got)
	}
	if err := connect(t, ctx, a).Publish(ctx, ev); err == nil || !strings.Contains(err.Error(), "deleted") {
		t.Fatalf("a deleted event sent again to A: %v, want refused as deleted", err)
	}
}

// TestE2ESharedReplaceable: publishes of one replaceable event (and of one
// addressable event) with different created_at, sent at once through
// three instances, leave exactly the newest stored.
func TestE2ESharedReplaceable(t *testing.T) {
	pg := pgtest.Start(t)
	ps := startShared(t, 3, pg.NewDatabase("repl"))
	ctx := testCtx(t)
	sk, pk := newKey(t)
	const rounds, perInstance = 5, 4
	var relays []*nostr.Relay
	for _, p := range ps {
		for range perInstance {
			relays = append(relays, connect(t, ctx, p.url()))
		}
	}
	db, err := sql.Open("postgres", pg.URL("repl"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	base := nostr.Now() - 1000
	for _, kind := range []int{0, 30000} {
		for round := range rounds {
			var wg sync.WaitGroup
			var newest nostr.Event
			for i, r := range relays {
				ev := nostr.Event{CreatedAt: base + nostr.Timestamp(round*100+i), Kind: kind,
					Content: fmt.Sprintf("round %d version %d", round, i), Tags: nostr.Tags{}}
				if kind == 30000 {
					ev.Tags = nostr.Tags{{"d", "list"}}
				}
				if err := ev.Sign(sk); err != nil {
					t.Fatal(err)
				}
				if i == len(relays)-1 {
					newest = ev
				}
				wg.Go(func() {
					if err := r.Publish(ctx, ev); err != nil {
						t.Errorf("publish: %v", err)
					}
				})
			}
			wg.Wait()
			var ids []string
			rows, err := db.Query("SELECT id FROM event WHERE pubkey = $1 AND kind = $2", pk, kind)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id string
				_ = rows.Scan(&id)
				ids = append(ids, id)
			}
			rows.Close()
			if len(ids) != 1 || ids[0] != newest.ID {
				t.Fatalf("kind %d round %d: stored %v, want only the newest %s", kind, round, ids, newest.ID)
			}
			// Each instance serves the newest alone. An older version
			// announced by another instance's live feed (Postgres NOTIFY,
			// after that instance's OK) may still reach a new
			// subscription before its EOSE, as khatru delivers every
			// accepted event live: asked again, an instance that stored
			// more than the newest serves it again, a late announcement
			// does not come twice.
			for _, p := range ps {
				for try := 0; ; try++ {
					got := query(t, connect(t, ctx, p.url()), nostr.Filter{Authors: []string{pk}, Kinds: []int{kind}})
					if len(got) == 1 && got[0] == newest.ID {
						break
					}
					if try == 20 {
						t.Fatalf("kind %d round %d: %s serves %d events, want the newest", kind, round, p.url(), len(got))
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
	}
}

// readyz returns the status of p's /readyz and its body.
func readyz(t *testing.T, p *proc) (int, string) {
	t.Helper()
	resp := p.get(t, "/readyz")
	defer resp.Body.Close()
	var body json.RawMessage
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, string(body)
}

// waitReady waits until p's /readyz answers want.
func waitReady(t *testing.T, ctx context.Context, p *proc, want int) string {
	t.Helper()
	for {
		code, body := readyz(t, p)
		if code == want {
			return body
		}
		select {
		case <-ctx.Done():
			t.Fatalf("/readyz still %d, want %d: %s", code, want, body)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestE2ESharedFeedDown: when B loses PostgreSQL (its path to it goes
// dark), events published on A meanwhile are stored, B's subscribers do
// not get them live and B's /readyz says why; once B reaches PostgreSQL
// again its feed comes back by itself, the next event reaches B live, and
// the one it missed is served by a REQ on B — no event lost from the
// store.
func TestE2ESharedFeedDown(t *testing.T) {
	pg := pgtest.Start(t)
	url := pg.NewDatabase("feed")
	fp := faultproxy.Start(t, pg.Addr())
	viaProxy := strings.Replace(url, pg.Addr(), fp.Addr(), 1)
	// A short connect timeout, so B's attempts in the dark end quickly.
	viaProxy = strings.Replace(viaProxy, "?", "?connect_timeout=2&", 1)
	rd := redistest.Start(t)
	cfg := sharedConfig(t)
	a := startSluice(t, "relay", "--config", cfg, "--redis", rd.URL(), "--database", url)
	b := startSluice(t, "relay", "--config", cfg, "--redis", rd.URL(), "--database", viaProxy)
	ctx := testCtx(t)
	waitReady(t, ctx, a, http.StatusOK)
	waitReady(t, ctx, b, http.StatusOK)
	sk, pk := newKey(t)
	subB := subscribe(t, ctx, b.url(), nostr.Filter{Authors: []string{pk}})

	fp.Blackhole(true)
	fp.Reset()
	body := waitReady(t, ctx, b, http.StatusServiceUnavailable)
	if !strings.Contains(body, "live feed") {
		t.Errorf("/readyz while the feed is down names no live feed: %s", body)
	}
	missed := signed(t, sk, "published while B is cut off")
	if err := connect(t, ctx, a.url()).Publish(ctx, missed); err != nil {
		t.Fatalf("publish on A with B cut off: %v", err)
	}
	readBack(t, ctx, a.url(), missed)

	fp.Blackhole(false)
	waitReady(t, ctx, b, http.StatusOK)
	after := signed(t, sk, "published once B is back")
	if err := connect(t, ctx, a.url()).Publish(ctx, after); err != nil {
		t.Fatal(err)
	}
	if got := nextLive(t, ctx, subB, "B after the outage"); got.ID != after.ID {
		t.Fatalf("first live event on B after the outage: %s (%q), want %s", got.ID, got.Content, after.ID)
	}
	readBack(t, ctx, b.url(), missed)
	if !strings.Contains(b.logs(), "live feed lost") {
		t.Errorf("B logged no loss of its live feed:\n%s", b.logs())
	}
}
