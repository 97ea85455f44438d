package pgstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip40"

	"github.com/sluice-relay/sluice/internal/pgtest"
)

func event(t *testing.T, sk string, kind int, created nostr.Timestamp, tags nostr.Tags, content string) *nostr.Event {
	t.Helper()
	evt := &nostr.Event{Kind: kind, CreatedAt: created, Tags: tags, Content: content}
	if err := evt.Sign(sk); err != nil {
		t.Fatal(err)
	}
	return evt
}

// TestSplitKeepsRunes: no part is longer than asked, every part is valid
// UTF-8, and the parts put together are the whole.
func TestSplitKeepsRunes(t *testing.T) {
	s := strings.Repeat("aß€𝄞", 5000)
	parts := split(s, partBytes)
	if len(parts) < 2 {
		t.Fatalf("%d parts", len(parts))
	}
	for i, p := range parts {
		if len(p) > partBytes || !utf8.ValidString(p) {
			t.Fatalf("part %d: %d bytes, valid %v", i, len(p), utf8.ValidString(p))
		}
	}
	if strings.Join(parts, "") != s {
		t.Fatal("parts do not make the whole")
	}
}

// TestAssembly: parts in any order make the event once; this process's
// own notifications, malformed ones and parts beyond the bounds give
// nothing; the events assembled at once are bounded.
func TestAssembly(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	evt := event(t, sk, 1, 1000, nostr.Tags{}, strings.Repeat("x€", 6000))
	body, _ := evt.MarshalJSON()
	parts := split(string(body), partBytes)
	payload := func(origin string, seq, i int) string {
		return origin + "." + strconv.Itoa(seq) + "." + strconv.Itoa(i) + "." + strconv.Itoa(len(parts)) + ":" + parts[i]
	}
	a := newAssembly()
	for i := len(parts) - 1; i > 0; i-- { // backwards: order does not matter
		if got := a.add(payload("peer", 1, i), "self"); got != nil {
			t.Fatalf("event before its last part")
		}
	}
	got := a.add(payload("peer", 1, 0), "self")
	if got == nil || got.ID != evt.ID || got.Content != evt.Content {
		t.Fatalf("assembled %v", got)
	}
	if len(a.parts) != 0 || len(a.order) != 0 {
		t.Fatalf("assembled event still pending: %d %d", len(a.parts), len(a.order))
	}
	small, _ := event(t, sk, 1, 1000, nostr.Tags{}, "hi").MarshalJSON()
	for _, p := range []string{
		"self.1.0.1:" + string(small), // our own
		"peer.1.0.1",                  // no body
		"peer.1.1.1:" + string(small), // part past the count
		"peer.1.0." + strconv.Itoa(maxParts+1) + ":x",
		"peer.1.0.1:{not json",
	} {
		if got := a.add(p, "self"); got != nil {
			t.Errorf("%.30q gave an event", p)
		}
	}
	if got := a.add("peer.2.0.1:"+string(small), "self"); got == nil {
		t.Error("a one-part event from a peer gave nothing")
	}
	for seq := range 10 * maxPending { // first parts only, never completed
		a.add(payload("peer", 100+seq, 0), "self")
	}
	if len(a.parts) > maxPending || len(a.order) > maxPending {
		t.Fatalf("%d events pending, bound %d", len(a.parts), maxPending)
	}
}

// TestQueryMatchesTagNames: the backend matches a tag value under any
// one-letter name; QueryEvents returns only the events with it under the
// name asked. Since and until past the table's integer range are
// answered, not refused.
func TestQueryMatchesTagNames(t *testing.T) {
	pg := pgtest.Start(t)
	s, err := Open(pg.NewDatabase("q"), Limits{MaxLimit: 1000, MaxSyncEvents: 1000, MaxValues: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	sk := nostr.GeneratePrivateKey()
	v := strings.Repeat("ab", 32)
	asE := event(t, sk, 1, 1000, nostr.Tags{{"e", v}}, "e")
	asP := event(t, sk, 1, 1001, nostr.Tags{{"p", v}}, "p")
	for _, evt := range []*nostr.Event{asE, asP} {
		if err := s.SaveEvent(ctx, evt); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := s.QueryEvents(ctx, nostr.Filter{Tags: nostr.TagMap{"e": {v}}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for evt := range ch {
		ids = append(ids, evt.ID)
	}
	if len(ids) != 1 || ids[0] != asE.ID {
		t.Fatalf("#e query returned %v, want only %s", ids, asE.ID)
	}
	far := nostr.Timestamp(1 << 40)
	ch, err = s.QueryEvents(ctx, nostr.Filter{Until: &far, Kinds: []int{1}})
	if err != nil {
		t.Fatalf("until past int32: %v", err)
	}
	n := 0
	for range ch {
		n++
	}
	if n != 2 {
		t.Fatalf("until past int32: %d events, want 2", n)
	}
	if err := s.SaveEvent(ctx, event(t, sk, 1, far, nostr.Tags{}, "far")); err != errCreatedAt {
		t.Fatalf("created_at past int32: %v, want errCreatedAt", err)
	}
	// Eleven kinds: the backend's own bound is ten.
	if _, err := s.CountEvents(ctx, nostr.Filter{Kinds: []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}}); err != nil {
		t.Fatalf("eleven kinds: %v", err)
	}
}

// TestCountLeavesExpiredOut: CountEvents leaves out the events that have
// expired, as the relay reads an expiration (nip40.GetExpiration: the
// first "expiration" tag with a value; not an integer, or -1, is none),
// though this process never saw them; and with no expired event it counts
// what the backend's own count does, filter by filter.
func TestCountLeavesExpiredOut(t *testing.T) {
	pg := pgtest.Start(t)
	s, err := Open(pg.NewDatabase("count"), Limits{MaxLimit: 1000, MaxSyncEvents: 1000, MaxValues: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	sk := nostr.GeneratePrivateKey()
	now := nostr.Now()
	past, future := strconv.FormatInt(int64(now)-10, 10), strconv.FormatInt(int64(now)+1000, 10)
	for i, tags := range []nostr.Tags{
		{},
		{{"expiration", past}},
		{{"expiration", future}},
		{{"expiration", "+" + past}},
		{{"expiration", "0"}},
		{{"expiration", "-1"}},
		{{"expiration", "-5"}},
		{{"expiration", "soon"}, {"expiration", past}},
		{{"expiration"}, {"expiration", past}},
		{{"expiration", future}, {"expiration", past}},
		{{"expiration", "99999999999999999999"}},
		{{"expiration", "1.5"}},
		{{"e", strings.Repeat("ab", 32)}, {"expiration", past}},
	} {
		evt := event(t, sk, 1, now-100, tags, strconv.Itoa(i))
		if err := s.SaveEvent(ctx, evt); err != nil {
			t.Fatal(err)
		}
		want := int64(1)
		if exp := nip40.GetExpiration(tags); exp != -1 && exp <= now {
			want = 0
		}
		if n, err := s.CountEvents(ctx, nostr.Filter{IDs: []string{evt.ID}}); err != nil || n != want {
			t.Errorf("tags %v: counted %d (%v), want %d", tags, n, err, want)
		}
	}

	// Without expired events, the same counts as the backend's.
	s2, err := Open(pg.NewDatabase("count2"), Limits{MaxLimit: 1000, MaxSyncEvents: 1000, MaxValues: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	other := nostr.GeneratePrivateKey()
	v := strings.Repeat("cd", 32)
	var ids []string
	for i, e := range []struct {
		sk   string
		kind int
		tags nostr.Tags
		text string
	}{
		{sk, 1, nostr.Tags{{"e", v}}, "100% sure"},
		{sk, 7, nostr.Tags{{"p", v}}, "plus"},
		{other, 1, nostr.Tags{{"t", "nostr"}}, "hello"},
		{other, 30023, nostr.Tags{{"d", "x"}, {"t", "nostr"}}, "article"},
		{sk, 1, nostr.Tags{{"expiration", future}}, "later"},
	} {
		evt := event(t, e.sk, e.kind, 1000+nostr.Timestamp(i), e.tags, e.text)
		ids = append(ids, evt.ID)
		if err := s2.SaveEvent(ctx, evt); err != nil {
			t.Fatal(err)
		}
	}
	pk, _ := nostr.GetPublicKey(sk)
	since, until := nostr.Timestamp(1001), nostr.Timestamp(1003)
	for _, f := range []nostr.Filter{
		{},
		{IDs: ids[1:3]},
		{Authors: []string{pk}},
		{Kinds: []int{1, 30023}},
		{Tags: nostr.TagMap{"e": {v}}},
		{Tags: nostr.TagMap{"t": {"nostr"}, "d": {"x"}}},
		{Since: &since, Until: &until},
		{Search: "%"},
		{Search: "ll"},
		{Authors: []string{pk}, Kinds: []int{1}, Since: &since},
	} {
		want, err := s2.db.CountEvents(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s2.CountEvents(ctx, f); err != nil || got != want {
			t.Errorf("%v: counted %d (%v), the backend %d", f, got, err, want)
		}
	}
	if _, err := s2.CountEvents(ctx, nostr.Filter{Tags: nostr.TagMap{"e": {}}}); err == nil {
		t.Error("an empty tag set counted, want the backend's refusal")
	}
}
