package nip11

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

func TestIsNIP11Request(t *testing.T) {
	tests := []struct {
		name   string
		method string
		hdr    map[string]string
		want   bool
	}{
		{"plain", "GET", map[string]string{"Accept": "application/nostr+json"}, true},
		{"listed", "GET", map[string]string{"Accept": "text/html, application/nostr+json;q=0.9"}, true},
		{"head", "HEAD", map[string]string{"Accept": "application/nostr+json"}, true},
		{"browser", "GET", map[string]string{"Accept": "text/html"}, false},
		{"none", "GET", nil, false},
		{"post", "POST", map[string]string{"Accept": "application/nostr+json"}, false},
		{"upgrade", "GET", map[string]string{"Accept": "application/nostr+json", "Connection": "Upgrade", "Upgrade": "websocket"}, false},
		// Not an upgrade (no Connection: upgrade), as the gate's upgrader
		// reads it too: the document is what it gets.
		{"half an upgrade", "GET", map[string]string{"Accept": "application/nostr+json", "Upgrade": "websocket"}, true},
		{"prefix only", "GET", map[string]string{"Accept": "application/nostr+jsonx"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, "/", nil)
			for k, v := range tt.hdr {
				r.Header.Set(k, v)
			}
			if got := IsRequest(r); got != tt.want {
				t.Errorf("IsRequest = %v, want %v", got, tt.want)
			}
		})
	}
}

func testLimitation(t *testing.T) Limitation {
	t.Helper()
	l := policy.DefaultLimits()
	q, err := ratelimit.NewQuota(600, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return Limitation{MaxMessageLength: 524288, Limits: &l, Quota: q.WithClock(nil)}
}

func TestMergeNIP11KeepsUnknownFields(t *testing.T) {
	doc := `{"name":"strfry default","software":"git+https://github.com/hoytech/strfry.git","supported_nips":[1,2,4,9,11],` +
		`"x_custom":{"deep":[1,2,3]},"limitation":{"max_subscriptions":20,"auth_required":false}}`
	out, err := Merge([]byte(doc), testLimitation(t))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"name":           `"strfry default"`,
		"supported_nips": `[1,2,4,9,11]`,
		"x_custom":       `{"deep":[1,2,3]}`,
	} {
		if string(got[k]) != want {
			t.Errorf("%s = %s, want %s unchanged", k, got[k], want)
		}
	}
	var lim map[string]any
	if err := json.Unmarshal(got["limitation"], &lim); err != nil {
		t.Fatal(err)
	}
	if _, ok := lim["max_message_length"]; ok || lim["max_subscriptions"] != float64(20) || lim["auth_required"] != false {
		t.Errorf("limitation = %v, want the relay's fields kept and none of sluice's added", lim)
	}
	var rl struct {
		Connection []nip11Window
		Message    map[string][]nip11Window
		Quota      *nip11Quota
		Bounds     map[string]int64
	}
	if err := json.Unmarshal(got["rate_limits"], &rl); err != nil {
		t.Fatal(err)
	}
	ev := rl.Message["EVENT"]
	if len(ev) != 2 || ev[0].Rate != 10 || ev[0].PeriodSeconds != 1 || ev[0].Burst != 10 || ev[1].PeriodSeconds != 60 {
		t.Errorf("rate_limits.message.EVENT = %+v, want the default two windows", ev)
	}
	if ev[0].Sustained < 6.5 || ev[0].Sustained > 6.7 {
		t.Errorf("EVENT sustained = %v, want about 6.58/s for 10/1s", ev[0].Sustained)
	}
	if c := rl.Message["CLOSE"]; c == nil || len(c) != 0 {
		t.Errorf("CLOSE = %v, want [] (free, and said so)", c)
	}
	if rl.Bounds["max_message_length"] != 524288 {
		t.Errorf("rate_limits.bounds = %v, want sluice's own bounds there", rl.Bounds)
	}
	if rl.Quota == nil || rl.Quota.Events != 600 || rl.Quota.WindowSeconds != 60 {
		t.Errorf("quota = %+v, want 600 per 60s", rl.Quota)
	}
}

func TestMergeNIP11MaxMessageLength(t *testing.T) {
	tests := []struct {
		doc  string
		ours int64
		want float64
	}{
		{`{}`, 1000, -1}, // the relay sets none: sluice's is not the relay's
		{`{"limitation":null}`, 1000, -1},
		{`{"limitation":{"max_message_length":500}}`, 1000, 500}, // the relay's is smaller: it wins
		{`{"limitation":{"max_message_length":5000}}`, 1000, 1000},
		{`{"limitation":{"max_message_length":"big"}}`, 1000, -2}, // left as the relay wrote it
		{`{"limitation":{"max_message_length":0}}`, 1000, 0},
	}
	for _, tt := range tests {
		out, err := Merge([]byte(tt.doc), Limitation{MaxMessageLength: tt.ours})
		if err != nil {
			t.Fatalf("%s: %v", tt.doc, err)
		}
		var got struct {
			Limitation map[string]any `json:"limitation"`
			RateLimits any            `json:"rate_limits"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		v, ok := got.Limitation["max_message_length"]
		if tt.want == -1 && !ok || tt.want == -2 && v == "big" {
			continue
		}
		if v != tt.want {
			t.Errorf("%s: max_message_length = %v, want %v", tt.doc, got.Limitation["max_message_length"], tt.want)
		}
		if got.RateLimits != nil {
			t.Errorf("%s: rate_limits present without Limits", tt.doc)
		}
	}
}

// The gate's REQ bounds are merged like max_message_length: the smaller
// wins, and a field the gate does not set is left as the relay wrote it.
func TestMergeNIP11REQBounds(t *testing.T) {
	doc := `{"limitation":{"max_filters":5,"max_subid_length":100,"max_limit":500}}`
	out, err := Merge([]byte(doc), Limitation{MaxFilters: 10, MaxSubidLength: 64})
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Limitation map[string]float64 }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"max_subid_length": 64, "max_limit": 500}
	if _, ok := got.Limitation["max_filters"]; ok {
		t.Errorf("max_filters published (NIP-11 dropped it): %s", out)
	}
	for k, v := range want {
		if got.Limitation[k] != v {
			t.Errorf("%s = %v, want %v (document %s)", k, got.Limitation[k], v, out)
		}
	}
	if _, ok := got.Limitation["max_message_length"]; ok {
		t.Errorf("max_message_length written though not set: %s", out)
	}
	if _, ok := got.Limitation["max_event_tags"]; ok {
		t.Errorf("max_event_tags written though no Bounds: %s", out)
	}
}

// TestMergeNIP11Bounds: the gate's bounds on a frame are published, the
// smaller of the document's and the gate's.
func TestMergeNIP11Bounds(t *testing.T) {
	doc := `{"limitation":{"max_event_tags":100}}`
	b := &wire.Bounds{MaxTags: 2000, MaxTagValueBytes: 1024, MaxFilterValues: 5000, MaxFanout: 50000}
	out, err := Merge([]byte(doc), Limitation{Bounds: b})
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Limitation map[string]float64 }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"max_event_tags": 100}
	for _, k := range []string{"max_tag_value_bytes", "max_filter_values", "max_filter_fanout"} {
		if _, ok := got.Limitation[k]; ok {
			t.Errorf("%s published as the relay's though it set none: %s", k, out)
		}
	}
	for k, v := range want {
		if got.Limitation[k] != v {
			t.Errorf("%s = %v, want %v (document %s)", k, got.Limitation[k], v, out)
		}
	}
}

// A khatru document's empty fields and zero created_at limits say nothing
// true: they are dropped; everything else stays.
func TestMergeNIP11DropsEmpty(t *testing.T) {
	doc := `{"name":"r","pubkey":"","contact":"","icon":"","banner":"","software":"x","limitation":{"created_at_lower_limit":0,"created_at_upper_limit":0,"max_limit":500,"auth_required":false}}`
	out, err := Merge([]byte(doc), Limitation{})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"pubkey", "contact", "icon", "banner"} {
		if _, ok := got[k]; ok {
			t.Errorf("empty %s kept: %s", k, out)
		}
	}
	lim, _ := got["limitation"].(map[string]any)
	if _, ok := lim["created_at_lower_limit"]; ok {
		t.Errorf("zero created_at_lower_limit kept: %s", out)
	}
	if got["name"] != "r" || got["software"] != "x" || lim["max_limit"] != float64(500) || lim["auth_required"] != false {
		t.Errorf("other fields changed: %s", out)
	}
}

func TestMergeNIP11RefusesNonObjects(t *testing.T) {
	for _, doc := range []string{``, `null`, `[]`, `"x"`, `{"a":`, `{"limitation":[1]}`, `{"limitation":3}`} {
		_, err := Merge([]byte(doc), Limitation{MaxMessageLength: 1})
		if !errors.Is(err, ErrDocument) {
			t.Errorf("Merge(%q) err = %v, want ErrDocument", doc, err)
		}
	}
}

func TestNIP11URL(t *testing.T) {
	for in, want := range map[string]string{
		"ws://127.0.0.1:7000":        "http://127.0.0.1:7000",
		"wss://relay.example/nostr":  "https://relay.example/nostr",
		"ws://h:1/p?x=1#frag":        "http://h:1/p?x=1",
		"http://already.example:80/": "http://already.example:80/",
	} {
		got, err := URL(in)
		if err != nil || got != want {
			t.Errorf("URL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"ftp://h/", "127.0.0.1:7000", "ws://", "::"} {
		if _, err := URL(in); !errors.Is(err, ErrURL) {
			t.Errorf("URL(%q) err = %v, want ErrURL", in, err)
		}
	}
}

func TestFetchNIP11(t *testing.T) {
	var accept atomic.Value
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		accept.Store(r.Header.Get("Accept"))
		w.Write([]byte(`{"name":"up"}`))
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"name":"` + strings.Repeat("x", MaxSize) + `"}`))
	})
	mux.HandleFunc("/array", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`[1]`)) })
	mux.HandleFunc("/500", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", 500) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ws := "ws" + strings.TrimPrefix(srv.URL, "http")

	body, err := Fetch(context.Background(), srv.Client(), ws+"/ok")
	if err != nil || string(body) != `{"name":"up"}` {
		t.Fatalf("Fetch = %q, %v", body, err)
	}
	if got := accept.Load(); got != ContentType {
		t.Errorf("Accept = %v, want %s", got, ContentType)
	}
	for _, p := range []string{"/big", "/array", "/500"} {
		if _, err := Fetch(context.Background(), srv.Client(), ws+p); !errors.Is(err, ErrDocument) {
			t.Errorf("Fetch(%s) err = %v, want ErrDocument", p, err)
		}
	}
}

func TestNIP11HandlerCachesAndFallsBack(t *testing.T) {
	var calls atomic.Int32
	var fail atomic.Bool
	var errs atomic.Int32
	h := &Handler{
		Fetch: func(ctx context.Context) ([]byte, error) {
			calls.Add(1)
			if fail.Load() {
				return nil, ErrDocument
			}
			return []byte(`{"name":"upstream"}`), nil
		},
		Limitation: Limitation{MaxMessageLength: 4096},
		Fallback:   []byte(`{"name":"fallback"}`),
		OnError:    func(error) { errs.Add(1) },
	}
	get := func() map[string]any {
		t.Helper()
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("Accept", ContentType)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if ct := w.Header().Get("Content-Type"); ct != ContentType {
			t.Errorf("Content-Type = %q", ct)
		}
		if w.Header().Get("Access-Control-Allow-Origin") != "*" {
			t.Errorf("no CORS header")
		}
		var doc map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
			t.Fatalf("body %q: %v", w.Body.String(), err)
		}
		return doc
	}
	for range 5 {
		if doc := get(); doc["name"] != "upstream" {
			t.Fatalf("name = %v, want upstream", doc["name"])
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("fetched %d times for 5 requests within the TTL, want 1", n)
	}

	// Expire the cache; a failing upstream then leaves the last good copy.
	h.mu.Lock()
	h.fresh = time.Time{}
	h.mu.Unlock()
	fail.Store(true)
	for range 5 {
		if doc := get(); doc["name"] != "upstream" {
			t.Fatalf("name = %v, want the stale upstream copy", doc["name"])
		}
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("fetched %d times, want 2: a failure must not be retried on every request", n)
	}
	if errs.Load() != 1 {
		t.Errorf("OnError called %d times, want 1", errs.Load())
	}

	// A handler that never fetched serves the fallback, merged.
	h2 := &Handler{
		Fetch:      func(ctx context.Context) ([]byte, error) { return nil, ErrDocument },
		Limitation: Limitation{MaxMessageLength: 4096},
		Fallback:   []byte(`{"name":"fallback"}`),
	}
	h = h2
	doc := get()
	if doc["name"] != "fallback" {
		t.Errorf("name = %v, want fallback", doc["name"])
	}
	if _, ok := doc["limitation"]; ok {
		t.Errorf("fallback limitation = %v, want none: the fallback sets none", doc["limitation"])
	}
}

// TestNIP11HandlerServesStaleWhileRefreshing: a slow upstream holds up the
// one request that refreshes, not every NIP-11 request.
func TestNIP11HandlerServesStaleWhileRefreshing(t *testing.T) {
	var version atomic.Int32
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var block atomic.Bool
	h := &Handler{Fetch: func(ctx context.Context) ([]byte, error) {
		if block.Load() {
			entered <- struct{}{}
			<-release
		}
		return []byte(`{"name":"v` + string(rune('0'+version.Add(1))) + `"}`), nil
	}}
	name := func() string {
		var doc struct{ Name string }
		if err := json.Unmarshal(h.document(context.Background()), &doc); err != nil {
			t.Fatal(err)
		}
		return doc.Name
	}
	if got := name(); got != "v1" {
		t.Fatalf("first document %q", got)
	}
	h.mu.Lock()
	h.fresh = time.Time{} // stale
	h.mu.Unlock()
	block.Store(true)
	done := make(chan string)
	go func() { done <- name() }()
	<-entered // the refresh is in flight and blocked on the upstream
	if got := name(); got != "v1" {
		t.Errorf("during the refresh got %q, want the stale v1 at once", got)
	}
	close(release)
	if got := <-done; got != "v2" {
		t.Errorf("the refreshing request got %q, want v2", got)
	}
	if got := name(); got != "v2" {
		t.Errorf("after the refresh got %q, want v2", got)
	}
}

// TestMergePolicy: rate_limits publishes the mode, the kind classes (kinds
// as numbers and "from-to" ranges) and marks the windows in shadow; in
// mode shadow every window.
func TestMergePolicy(t *testing.T) {
	lim := testLimitation(t)
	lim.Limits.Message[0] = []ratelimit.Limit{ratelimit.PerPeriod(10, time.Second), {Rate: 240, Period: time.Minute, Shadow: true}}
	lim.Kinds = []policy.Class{{Name: "reactions", Kinds: [][2]int{{7, 7}, {20000, 29999}},
		Limits: []ratelimit.Limit{ratelimit.PerPeriod(5, time.Second)}}}
	type window struct {
		Rate   float64 `json:"rate"`
		Shadow *bool   `json:"shadow"`
	}
	read := func(lim Limitation) (mode string, msg []window, kinds map[string]struct {
		Kinds  []any    `json:"kinds"`
		Limits []window `json:"limits"`
	}) {
		t.Helper()
		out, err := Merge([]byte(`{}`), lim)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			RateLimits struct {
				Mode    string              `json:"mode"`
				Message map[string][]window `json:"message"`
				Kinds   map[string]struct {
					Kinds  []any    `json:"kinds"`
					Limits []window `json:"limits"`
				} `json:"kinds"`
			} `json:"rate_limits"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatal(err)
		}
		return doc.RateLimits.Mode, doc.RateLimits.Message["OTHER"], doc.RateLimits.Kinds
	}
	mode, msg, kinds := read(lim)
	if mode != "enforce" {
		t.Errorf("mode %q, want enforce", mode)
	}
	// An enforcing window says nothing of shadow; a shadow one says so.
	if len(msg) != 2 || msg[0].Shadow != nil || msg[1].Shadow == nil || !*msg[1].Shadow {
		t.Errorf("windows %+v: want only the second \"shadow\": true", msg)
	}
	r := kinds["reactions"]
	if len(r.Kinds) != 2 || r.Kinds[0] != 7.0 || r.Kinds[1] != "20000-29999" || len(r.Limits) != 1 || r.Limits[0].Rate != 5 || r.Limits[0].Shadow != nil {
		t.Errorf("kinds.reactions = %+v", r)
	}
	lim.Shadow = true
	mode, msg, kinds = read(lim)
	if mode != "shadow" || msg[0].Shadow == nil || kinds["reactions"].Limits[0].Shadow == nil {
		t.Errorf("mode shadow: mode %q, windows %+v, kinds %+v: want every window in shadow", mode, msg, kinds)
	}
	lim.Kinds = nil
	if _, _, kinds = read(lim); kinds != nil {
		t.Errorf("kinds %v without classes, want none", kinds)
	}
}

// TestHandlerSetLimitation: after SetLimitation the document served
// carries the new limitation at once, re-merged from the document fetched
// before (no new fetch) or from the new fallback.
func TestHandlerSetLimitation(t *testing.T) {
	var fetches atomic.Int32
	h := &Handler{
		Fetch: func(context.Context) ([]byte, error) {
			fetches.Add(1)
			return []byte(`{"name":"up","limitation":{"max_subscriptions":50}}`), nil
		},
		Limitation: Limitation{MaxSubscriptions: 10},
	}
	get := func(h *Handler) map[string]any {
		t.Helper()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		var doc map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		return doc
	}
	maxFilters := func(doc map[string]any) any { return doc["limitation"].(map[string]any)["max_subscriptions"] }
	if doc := get(h); maxFilters(doc) != 10.0 || doc["name"] != "up" {
		t.Fatalf("first document %v", doc)
	}
	h.SetLimitation(Limitation{MaxSubscriptions: 4}, nil)
	if doc := get(h); maxFilters(doc) != 4.0 || doc["name"] != "up" {
		t.Errorf("after SetLimitation: %v, want max_subscriptions 4 on the upstream's document", doc)
	}
	if n := fetches.Load(); n != 1 {
		t.Errorf("%d fetches, want the one document re-merged", n)
	}

	fb := &Handler{Fallback: []byte(`{"name":"a","limitation":{"max_subscriptions":99}}`), Limitation: Limitation{MaxSubscriptions: 10}}
	if doc := get(fb); doc["name"] != "a" || maxFilters(doc) != 10.0 {
		t.Fatalf("fallback document %v", doc)
	}
	fb.SetLimitation(Limitation{MaxSubscriptions: 3}, []byte(`{"name":"b","limitation":{"max_subscriptions":99}}`))
	if doc := get(fb); doc["name"] != "b" || maxFilters(doc) != 3.0 {
		t.Errorf("after SetLimitation: %v, want the new fallback with max_subscriptions 3", doc)
	}
	// Set before the first request, too.
	fresh := &Handler{Fallback: []byte(`{"limitation":{"max_subscriptions":99}}`), Limitation: Limitation{MaxSubscriptions: 10}}
	fresh.SetLimitation(Limitation{MaxSubscriptions: 2}, nil)
	if doc := get(fresh); maxFilters(doc) != 2.0 {
		t.Errorf("SetLimitation before any request: %v", doc)
	}
}

// TestMergeReadCost: the read budget and the price table are published in
// rate_limits, as the gate runs them.
func TestMergeReadCost(t *testing.T) {
	l := policy.DefaultLimits()
	out, err := Merge([]byte(`{"name":"r"}`), Limitation{Limits: &l, ReadCost: policy.ReadCost{}.Resolved()})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"read":[{"rate":16777216,"period_seconds":60,"cost":1,"burst":16777216,`,
		`"narrow":1,"wide":2,"scrape":10,"scrape_limit":100,"scrape_span_seconds":7200}`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("document lacks %s: %s", want, out)
		}
	}
}

// A relay's null fields say nothing: dropped, in limitation too; its
// max_filters, which NIP-11 dropped, is not passed on.
func TestMergeNIP11DropsNullAndMaxFilters(t *testing.T) {
	doc := `{"name":"r","pubkey":null,"contact":null,"limitation":{"max_filters":10,"max_limit":null,"max_subscriptions":32}}`
	out, err := Merge([]byte(doc), Limitation{MaxSubscriptions: 50, MaxFilters: 10})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"limitation":{"max_subscriptions":32},"name":"r"}`; string(out) != want {
		t.Errorf("merged %s, want %s", out, want)
	}
}

// NIPs learns supported_nips from a document: numbers and strings of
// digits; nothing before a document, nor from one that lists none.
func TestNIPsLearn(t *testing.T) {
	var n NIPs
	if n.Supports(1) {
		t.Fatal("supports NIP-1 before any document")
	}
	for _, tc := range []struct {
		doc     string
		changed bool
		want    []int
		not     []int
	}{
		{`{"supported_nips":[1,11,45]}`, true, []int{1, 11, 45}, []int{77}},
		{`{"supported_nips":[45,11,1],"name":"x"}`, false, []int{45}, []int{77}},
		{`{"supported_nips":["77",42,1.5,-1,null,"x"]}`, true, []int{42, 77}, []int{1, 45}},
		{`{"supported_nips":"45"}`, true, nil, []int{45, 77}},
		{`{}`, false, nil, []int{45, 77}},
	} {
		if got := n.Learn([]byte(tc.doc)); got != tc.changed {
			t.Errorf("Learn(%s) changed = %v, want %v", tc.doc, got, tc.changed)
		}
		for _, nip := range tc.want {
			if !n.Supports(nip) {
				t.Errorf("after %s: NIP-%d not supported", tc.doc, nip)
			}
		}
		for _, nip := range tc.not {
			if n.Supports(nip) {
				t.Errorf("after %s: NIP-%d supported", tc.doc, nip)
			}
		}
	}
}

// Keep fetches without waiting for a request, tells OnDocument of each
// document it serves from then on, and keeps the last good one, unlearnt
// by nothing, when the upstream fails.
func TestHandlerKeep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var doc atomic.Value
		doc.Store(`{"name":"up","supported_nips":[1,45]}`)
		var n NIPs
		var told atomic.Int32
		h := &Handler{
			Fetch: func(context.Context) ([]byte, error) {
				d := doc.Load().(string)
				if d == "" {
					return nil, ErrDocument
				}
				return []byte(d), nil
			},
			OnDocument: func(base []byte) { told.Add(1); n.Learn(base) },
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { h.Keep(ctx); close(done) }()
		synctest.Wait()
		if told.Load() != 1 || !n.Supports(45) {
			t.Fatalf("after start: told %d times, NIP-45 %v; want the document read at once", told.Load(), n.Supports(45))
		}
		doc.Store("") // the upstream fails: the last document stays
		time.Sleep(DefaultTTL + retryAfterError)
		synctest.Wait()
		if told.Load() != 1 || !n.Supports(45) {
			t.Fatalf("after a failed fetch: told %d times, NIP-45 %v; want the last document kept", told.Load(), n.Supports(45))
		}
		doc.Store(`{"name":"up","supported_nips":[1]}`)
		time.Sleep(retryAfterError)
		synctest.Wait()
		if told.Load() != 2 || n.Supports(45) {
			t.Fatalf("after the upstream came back: told %d times, NIP-45 %v; want the new document", told.Load(), n.Supports(45))
		}
		cancel()
		<-done
	})
}

// Limitation.NIPs are added to supported_nips once each, after the
// document's own; a document without the list gets one.
func TestMergeNIPs(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"supported_nips":[1,11]}`, `[1,11,42]`},
		{`{"supported_nips":[1,42,11]}`, `[1,42,11]`},
		{`{"supported_nips":["42"]}`, `["42"]`},
		{`{}`, `[42]`},
		{`{"supported_nips":"1"}`, `[42]`},
	} {
		out, err := Merge([]byte(tc.doc), Limitation{NIPs: []int{42}})
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Supported json.RawMessage `json:"supported_nips"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		if string(got.Supported) != tc.want {
			t.Errorf("Merge(%s) supported_nips = %s, want %s", tc.doc, got.Supported, tc.want)
		}
	}
	out, _ := Merge([]byte(`{"name":"x"}`), Limitation{})
	if strings.Contains(string(out), "supported_nips") {
		t.Errorf("Merge without NIPs added a list: %s", out)
	}
}
