//go:build !race

package relay

import (
	"context"
	"io"
	"log"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fiatjaf/eventstore/badger"
	"github.com/fiatjaf/khatru"
	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/relay/policy"
)

// badgerKhatru is khatru on eventstore's badger, as sluice relay runs
// it, counting every filter and event its hooks see.
func badgerKhatru(t testing.TB, filters, events *atomic.Int64) *khatru.Relay {
	t.Helper()
	db := &badger.BadgerBackend{Path: t.TempDir()}
	if err := db.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	kr := khatru.NewRelay()
	kr.Log = log.New(io.Discard, "", 0)
	kr.StoreEvent = append(kr.StoreEvent, db.SaveEvent)
	kr.QueryEvents = append(kr.QueryEvents, db.QueryEvents)
	kr.CountEvents = append(kr.CountEvents, db.CountEvents)
	kr.DeleteEvent = append(kr.DeleteEvent, db.DeleteEvent)
	kr.ReplaceEvent = append(kr.ReplaceEvent, db.ReplaceEvent)
	seen := func() { filters.Add(1) }
	kr.RejectFilter = append(kr.RejectFilter, func(_ context.Context, _ nostr.Filter) (bool, string) { seen(); return false, "" })
	kr.RejectCountFilter = append(kr.RejectCountFilter, func(_ context.Context, _ nostr.Filter) (bool, string) { seen(); return false, "" })
	kr.RejectEvent = append(kr.RejectEvent, func(_ context.Context, _ *nostr.Event) (bool, string) { events.Add(1); return false, "" })
	return kr
}

// signedFrame signs an event with tags and returns its EVENT frame.
func signedFrame(t *testing.T, kind int, tags nostr.Tags) (string, string) {
	t.Helper()
	ev := nostr.Event{Kind: kind, CreatedAt: nostr.Now(), Tags: tags, Content: "x"}
	if err := ev.Sign(nostr.GeneratePrivateKey()); err != nil {
		t.Fatal(err)
	}
	b, err := nostr.EventEnvelope{Event: ev}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return string(b), ev.ID
}

// TestE2EFrameBounds sends what killed or pinned khatru on badger behind
// the gate, signed and canonical, in relay and proxy mode: a kind-0 event
// with the tag ["d"] (khatru panics reading its value, in a goroutine
// nothing recovers), an event of 38,000 t tags (badger indexes tags in
// O(n²)), and a REQ, a COUNT and a NEG-OPEN of 480 authors × 16,000 kinds
// (7.68 M iterators). Each is refused "invalid: …" by the gate, khatru's
// hooks never see them, and khatru serves an honest client afterwards.
func TestE2EFrameBounds(t *testing.T) {
	dFrame, dID := signedFrame(t, 0, nostr.Tags{{"d"}})
	many := make(nostr.Tags, 38000)
	for i := range many {
		many[i] = nostr.Tag{"t", strconv.FormatInt(int64(i), 36)} // distinct, and the frame within the read limit
	}
	manyFrame, manyID := signedFrame(t, 1, many)
	pk, _ := nostr.GetPublicKey(nostr.GeneratePrivateKey())
	filter := `{"authors":[` + strings.TrimSuffix(strings.Repeat(`"`+pk+`",`, 480), ",") + `],"kinds":[` + strings.TrimSuffix(strings.Repeat("1,", 16000), ",") + `]}`
	cases := []struct{ frame, want string }{
		{dFrame, `["OK","` + dID + `",false,"` + "invalid: a tag named by one letter must have a value" + `"]`},
		{manyFrame, `["OK","` + manyID + `",false,"` + "invalid: too many tags (max_event_tags)" + `"]`},
		{`["REQ","s",` + filter + `]`, `["CLOSED","s","` + "invalid: filter asks too much: too many values in one field (max_filter_values)" + `"]`},
		{`["COUNT","c",` + filter + `]`, `["CLOSED","c","` + "invalid: filter asks too much: too many values in one field (max_filter_values)" + `"]`},
		{`["NEG-OPEN","n",` + filter + `,"6100000200"]`, `["NEG-ERR","n","` + "invalid: filter asks too much: too many values in one field (max_filter_values)" + `"]`},
	}
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			var filters, events atomic.Int64
			kr := badgerKhatru(t, &filters, &events)
			kr.Negentropy = true
			url := hostileTarget(t, mode, kr, Options{Policy: policy.Config{Limits: generous()}})
			c := dialRaw(t, url)
			for _, tc := range cases {
				if err := c.WriteMessage(websocket.TextMessage, []byte(tc.frame)); err != nil {
					t.Fatal(err)
				}
				if got := readText(t, c); got != tc.want {
					t.Errorf("%.60s…: got %.300s, want %s", tc.frame, got, tc.want)
				}
			}
			if n, e := filters.Load(), events.Load(); n != 0 || e != 0 {
				t.Errorf("khatru's hooks saw %d filters and %d events the gate refused", n, e)
			}
			honest(t, url)
		})
	}
}
