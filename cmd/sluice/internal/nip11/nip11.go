package nip11

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// This file serves NIP-11 relay information documents with sluice's limits
// in them. In proxy mode the document is the upstream relay's own, fetched
// over HTTP and merged, so the operator's name, contact and supported NIPs
// stay what the relay says; sluice only adds what it enforces.

// ErrDocument is wrapped by Fetch and Merge for a document they
// cannot use: an HTTP error, a body too large, or JSON that is not an object.
var ErrDocument = errors.New("nip11: bad NIP-11 document")

// ErrURL is wrapped by URL and Fetch for a relay URL they cannot use.
var ErrURL = errors.New("nip11: bad relay URL")

// NIP-11 defaults.
const (
	// ContentType is the media type of a NIP-11 document, and what a
	// client's Accept header asks for.
	ContentType = "application/nostr+json"
	// MaxSize bounds an upstream's document: real ones are a few KiB.
	MaxSize = 256 << 10
	// DefaultTTL is how long Handler keeps a fetched document.
	DefaultTTL = time.Minute
	// DefaultTimeout bounds one fetch when the client has no timeout.
	DefaultTimeout = 5 * time.Second
)

// IsRequest reports whether r asks for a NIP-11 document: a GET or
// HEAD, not a WebSocket upgrade, whose Accept header names
// application/nostr+json.
func IsRequest(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if wire.IsUpgrade(r) {
		return false
	}
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err == nil && mt == ContentType {
				return true
			}
		}
	}
	return false
}

// Limitation is what sluice adds to a NIP-11 document. The zero value
// adds nothing.
type Limitation struct {
	// MaxMessageLength is the gate's read limit in bytes. It is published
	// as sluice's in rate_limits.bounds (with Limits), and written to
	// limitation.max_message_length only when the document has one of
	// its own, as the smaller of the two (what a client can send): where
	// the relay says nothing, sluice's bound is not the relay's. 0 leaves
	// the field as it is.
	MaxMessageLength int64
	// MaxFilters, MaxSubidLength and MaxSubscriptions are the gate's
	// bounds on a forwarded REQ and on the subscriptions a connection
	// holds (the policy's Bounds.MaxFilters, wire.MaxSubIDBytes, relay.Options.MaxSubscriptions),
	// published and merged the same way (max_filters only in
	// rate_limits.bounds: NIP-11 no longer has it, and a document's own is
	// dropped); 0 leaves a field as it is.
	MaxFilters, MaxSubidLength, MaxSubscriptions int64
	// Bounds, when not nil, are the gate's bounds on what a frame may ask
	// of the relay (policy.Policy.Bounds), written the same way to
	// limitation.max_event_tags (NIP-11's name) and to the sluice-specific
	// max_tag_value_bytes, max_filter_values and max_filter_fanout.
	// MaxFilters is not read from it.
	Bounds *wire.Bounds
	// Limits, when not nil, are published as the top-level "rate_limits"
	// object (not part of NIP-11: clients that do not know it ignore it).
	Limits *policy.Limits
	// Quota, when not nil and not unlimited (Events 0), is published in
	// rate_limits.
	Quota ratelimit.ActorQuota
	// Kinds are the policy's kind classes (policy.Config.Kinds), published
	// with Limits as rate_limits.kinds: per class name, its kinds and its
	// windows, charged in addition to EVENT's.
	Kinds []policy.Class
	// Shadow is mode: shadow (policy.Config.Shadow), published with Limits
	// as rate_limits.mode "shadow" (else "enforce"); every window is then
	// marked "shadow": true, as a window with Limit.Shadow always is.
	Shadow bool
	// ReadCost is the price of a filter by its shape (policy.ReadCost,
	// resolved), published with Limits as rate_limits.read_cost; the read
	// budget, Limits.Read, as rate_limits.read (windows in bytes).
	ReadCost policy.ReadCost
	// NIPs are added to supported_nips (once each, after the document's
	// own): what sluice serves itself whatever the relay does, such as
	// NIP-42 when the gate does it (auth: gate).
	NIPs []int
}

// nip11ReadCost is policy.ReadCost as rate_limits.read_cost publishes it.
type nip11ReadCost struct {
	Note              string  `json:"note"`
	Narrow            int     `json:"narrow"`
	Wide              int     `json:"wide"`
	Scrape            int     `json:"scrape"`
	ScrapeLimit       int     `json:"scrape_limit"`
	ScrapeSpanSeconds float64 `json:"scrape_span_seconds"`
}

// nip11Window is one limit as rate_limits publishes it: the configured
// numbers and what they mean, so a client need not know the EWMA math.
type nip11Window struct {
	Rate          float64 `json:"rate"`
	PeriodSeconds float64 `json:"period_seconds"`
	Cost          float64 `json:"cost"`
	Burst         int     `json:"burst"`
	Sustained     float64 `json:"sustained_per_second"`
	// Shadow: the window is decided and counted but refuses nothing.
	Shadow bool `json:"shadow,omitempty"`
}

// nip11Class is one kind class as rate_limits.kinds publishes it: its
// kinds as numbers and "from-to" ranges, as the config writes them.
type nip11Class struct {
	Kinds  []any         `json:"kinds"`
	Limits []nip11Window `json:"limits"`
}

type nip11Quota struct {
	Events        int     `json:"events"`
	WindowSeconds float64 `json:"window_seconds"`
}

type nip11RateLimits struct {
	Note       string                   `json:"note"`
	Mode       string                   `json:"mode"`
	Connection []nip11Window            `json:"connection"`
	Message    map[string][]nip11Window `json:"message"`
	Kinds      map[string]nip11Class    `json:"kinds,omitempty"`
	Quota      *nip11Quota              `json:"quota,omitempty"`
	Read       []nip11Window            `json:"read,omitempty"`
	ReadCost   *nip11ReadCost           `json:"read_cost,omitempty"`
	// Bounds are sluice's own bounds on a frame and on what a connection
	// holds open (limitation's names), whatever the relay allows.
	Bounds map[string]int64 `json:"bounds,omitempty"`
}

func nip11Windows(ls []ratelimit.Limit, shadow bool) []nip11Window {
	out := make([]nip11Window, 0, len(ls))
	for _, l := range ls {
		out = append(out, nip11Window{
			Rate:          l.Rate,
			PeriodSeconds: l.Period.Seconds(),
			Cost:          l.EffectiveCost(),
			Burst:         l.Burst(),
			Sustained:     math.Round(l.Sustained()*1000) / 1000,
			Shadow:        l.Shadow || shadow,
		})
	}
	return out
}

// Merge returns doc, a JSON object, with lim merged in: limitation's
// bounds that doc sets and sluice enforces become the smaller of the two,
// limitation.max_filters is dropped, and sluice's own bounds and limits
// are published as sluice's, in rate_limits. Every other field of doc is
// kept byte for byte, including fields this package does not know, except
// empty string and null fields and zero created_at limits, which are
// dropped (dropEmpty).
func Merge(doc []byte, lim Limitation) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(doc, &top); err != nil || top == nil {
		return nil, fmt.Errorf("%w: not a JSON object", ErrDocument)
	}
	var b wire.Bounds
	if lim.Bounds != nil {
		b = *lim.Bounds
	}
	// Sluice's bounds, as sluice's (rate_limits.bounds, below). In
	// limitation, which a client reads as the relay's, a bound is written
	// only where the document sets one itself, as the smaller of the two:
	// what a client can send through the gate. Where the relay says
	// nothing, sluice's bound is not the relay's (the relay may refuse
	// far less), so it does not go there.
	bounds := map[string]int64{}
	var limitation map[string]json.RawMessage
	if raw, ok := top["limitation"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if err := json.Unmarshal(raw, &limitation); err != nil || limitation == nil {
			return nil, fmt.Errorf("%w: limitation is not a JSON object", ErrDocument)
		}
	}
	for _, f := range []struct {
		key  string
		ours int64
	}{
		{"max_message_length", lim.MaxMessageLength}, {"max_subid_length", lim.MaxSubidLength}, {"max_subscriptions", lim.MaxSubscriptions},
		{"max_event_tags", int64(b.MaxTags)}, {"max_tag_value_bytes", int64(b.MaxTagValueBytes)}, {"max_filter_values", int64(b.MaxFilterValues)}, {"max_filter_fanout", int64(b.MaxFanout)},
	} {
		if f.ours <= 0 {
			continue
		}
		bounds[f.key] = f.ours
		var theirs float64
		if raw, ok := limitation[f.key]; ok && json.Unmarshal(raw, &theirs) == nil && theirs > 0 {
			limitation[f.key], _ = json.Marshal(min(f.ours, int64(theirs)))
		}
	}
	if limitation != nil {
		// NIP-11 no longer has max_filters; the gate's bound on filters
		// per REQ is in rate_limits.bounds.
		delete(limitation, "max_filters")
		top["limitation"], _ = json.Marshal(limitation)
	}
	if lim.MaxFilters > 0 {
		bounds["max_filters"] = lim.MaxFilters
	}
	if len(lim.NIPs) > 0 {
		var nips []json.RawMessage
		if raw, ok := top["supported_nips"]; ok && json.Unmarshal(raw, &nips) != nil {
			nips = nil // not a list: sluice's own are all that is known
		}
		have := nipSet(nips)
		for _, n := range lim.NIPs {
			if !have[n] {
				have[n] = true
				nips = append(nips, json.RawMessage(strconv.Itoa(n)))
			}
		}
		top["supported_nips"], _ = json.Marshal(nips)
	}
	dropEmpty(top)
	if lim.Limits != nil {
		rl := nip11RateLimits{
			Note:       "per client (IP address or IPv6 prefix); EWMA windows: burst from rest, then sustained_per_second; a refusal says how long to wait",
			Mode:       "enforce",
			Connection: nip11Windows(lim.Limits.Connection, lim.Shadow),
			Message:    make(map[string][]nip11Window, wire.NumTypes),
			Bounds:     bounds,
		}
		if lim.Shadow {
			rl.Mode = "shadow"
		}
		for t := wire.Type(0); t < wire.NumTypes; t++ {
			rl.Message[t.String()] = nip11Windows(lim.Limits.Message[t], lim.Shadow)
		}
		if len(lim.Kinds) > 0 {
			rl.Kinds = make(map[string]nip11Class, len(lim.Kinds))
			for _, c := range lim.Kinds {
				nc := nip11Class{Kinds: make([]any, 0, len(c.Kinds)), Limits: nip11Windows(c.Limits, lim.Shadow)}
				for _, r := range c.Kinds {
					if r[0] == r[1] {
						nc.Kinds = append(nc.Kinds, r[0])
					} else {
						nc.Kinds = append(nc.Kinds, fmt.Sprintf("%d-%d", r[0], r[1]))
					}
				}
				rl.Kinds[c.Name] = nc
			}
		}
		rl.Read = nip11Windows(lim.Limits.Read, lim.Shadow)
		if rc := lim.ReadCost; rc.Narrow > 0 {
			rl.ReadCost = &nip11ReadCost{
				Note:   "each REQ, COUNT and NEG-OPEN filter costs narrow (ids; authors or a tag with limit <= scrape_limit), wide, or scrape (no ids, authors or tag, and limit > scrape_limit or until-since > scrape_span, no since being all of time) of its type's windows; read windows are in bytes sent",
				Narrow: rc.Narrow, Wide: rc.Wide, Scrape: rc.Scrape, ScrapeLimit: rc.ScrapeLimit, ScrapeSpanSeconds: rc.ScrapeSpan.Seconds(),
			}
		}
		if q := lim.Quota; q != nil && q.Events() > 0 {
			rl.Quota = &nip11Quota{Events: q.Events(), WindowSeconds: q.Window().Seconds()}
		}
		top["rate_limits"], _ = json.Marshal(rl)
	}
	return json.Marshal(top)
}

// dropEmpty removes from a NIP-11 document what says nothing true: string
// fields that are "" (a pubkey, contact, icon or banner the relay left
// empty), and limitation.created_at_lower_limit / upper_limit of 0 (by
// NIP-11 a zero-second window, which no relay enforces; khatru writes them
// so). NIP-11 lets any field be omitted.
func dropEmpty(top map[string]json.RawMessage) {
	for k, v := range top {
		if v := bytes.TrimSpace(v); bytes.Equal(v, []byte(`""`)) || bytes.Equal(v, []byte("null")) {
			delete(top, k)
		}
	}
	raw, ok := top["limitation"]
	if !ok {
		return
	}
	var limitation map[string]json.RawMessage
	if json.Unmarshal(raw, &limitation) != nil || limitation == nil {
		return
	}
	changed := false
	for _, k := range []string{"created_at_lower_limit", "created_at_upper_limit"} {
		if v, ok := limitation[k]; ok && bytes.Equal(bytes.TrimSpace(v), []byte("0")) {
			delete(limitation, k)
			changed = true
		}
	}
	for k, v := range limitation {
		if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			delete(limitation, k)
			changed = true
		}
	}
	if changed {
		top["limitation"], _ = json.Marshal(limitation)
	}
}

// URL returns the http:// or https:// URL a NIP-11 document of the
// relay at a ws:// or wss:// URL is fetched from.
func URL(relayURL string) (string, error) {
	u, err := url.Parse(relayURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("%w: %q is not a relay URL", ErrURL, relayURL)
	}
	switch u.Scheme {
	case "ws":
		u.Scheme = "http"
	case "wss":
		u.Scheme = "https"
	case "http", "https":
	default:
		return "", fmt.Errorf("%w: %q: scheme must be ws or wss", ErrURL, relayURL)
	}
	u.Fragment = ""
	return u.String(), nil
}

// Fetch GETs the NIP-11 document of the relay at relayURL (ws://,
// wss://, or the http(s) URL itself) with Accept: application/nostr+json.
// The body is read up to MaxSize and must be a JSON object. A nil
// client means a client with DefaultTimeout; ctx bounds the call too.
func Fetch(ctx context.Context, client *http.Client, relayURL string) ([]byte, error) {
	target, err := URL(relayURL)
	if err != nil {
		return nil, err
	}
	if client == nil {
		client = &http.Client{Timeout: DefaultTimeout}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDocument, err)
	}
	req.Header.Set("Accept", ContentType)
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDocument, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s answered %s", ErrDocument, target, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s: %v", ErrDocument, target, err)
	}
	if len(body) > MaxSize {
		return nil, fmt.Errorf("%w: %s: document larger than %d bytes", ErrDocument, target, MaxSize)
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(body, &probe); err != nil || probe == nil {
		return nil, fmt.Errorf("%w: %s: not a JSON object", ErrDocument, target)
	}
	return body, nil
}

// Handler serves NIP-11 documents with Limitation merged in. The base
// document comes from Fetch and is kept for TTL; when Fetch fails the last
// good document is served, or Fallback when there is none, and Fetch is not
// tried again for a few seconds (a client asking for NIP-11 in a loop must
// not turn into a loop of upstream requests).
//
// Set the fields before first use; Handler is then safe for
// concurrent use.
type Handler struct {
	// Fetch returns the base document (a JSON object). Nil means Fallback
	// is always served.
	Fetch func(ctx context.Context) ([]byte, error)
	// Limitation is merged into every document served, until SetLimitation
	// replaces it.
	Limitation Limitation
	// TTL is how long a fetched document is kept. 0 means
	// DefaultTTL; a negative TTL fetches on every request (for an
	// in-process relay, where fetching costs nothing).
	TTL time.Duration
	// Fallback is the base document when Fetch fails and nothing was
	// fetched before. Nil means {}.
	Fallback []byte
	// OnError, when not nil, is told of every failed fetch.
	OnError func(error)
	// OnDocument, when not nil, is told of every fetched document that
	// Handler serves from then on (merged without error), as fetched. It
	// is called by one fetch at a time, and must not call h's methods.
	OnDocument func(base []byte)
	// Clock times the TTL and the retry after an error. Nil means the
	// real clock (see ratelimit.Clock); pass the gate's Limiter.Now.
	Clock ratelimit.Clock

	fetchMu   sync.Mutex  // held by the one request fetching
	mu        sync.Mutex  // guards the fields below
	lim       *Limitation // set by SetLimitation; nil: Limitation
	fallback0 []byte      // set by SetLimitation; nil: Fallback
	base      []byte      // the last document fetched, unmerged
	doc       []byte      // merged, ready to serve
	fresh     time.Time
	retryAt   time.Time
	fetchedOK bool
}

// retryAfterError is how long a failed fetch keeps Handler from
// trying again.
const retryAfterError = 5 * time.Second

// ServeHTTP implements http.Handler. It answers any method with the
// document (the caller routes with IsRequest), and CORS preflights.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Access-Control-Allow-Origin", "*")
	hdr.Set("Access-Control-Allow-Headers", "*")
	hdr.Set("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS")
	if r.Method == http.MethodOptions {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	doc := h.document(r.Context())
	hdr.Set("Content-Type", ContentType)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(doc)
}

// document returns the merged document, fetching it when stale. While one
// request refreshes a stale document, the others are served the stale one
// rather than waiting on the upstream; only the very first document is
// waited for.
func (h *Handler) document(ctx context.Context) []byte {
	ttl := h.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if h.Fetch == nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.doc == nil {
			h.doc = h.fallback()
		}
		return h.doc
	}

	h.mu.Lock()
	doc, usable := h.doc, h.usable(h.Clock.Now())
	h.mu.Unlock()
	if usable {
		return doc
	}
	if doc != nil {
		if !h.fetchMu.TryLock() {
			return doc // someone is refreshing it
		}
	} else {
		h.fetchMu.Lock()
	}
	defer h.fetchMu.Unlock()
	h.mu.Lock()
	doc, usable = h.doc, h.usable(h.Clock.Now())
	h.mu.Unlock()
	if usable {
		return doc // refreshed while we waited
	}

	// The fetch outlives a client that hangs up: its result serves
	// everyone after it.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultTimeout)
	base, err := h.Fetch(fctx)
	cancel()
	now := h.Clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	var merged []byte
	if err == nil {
		merged, err = Merge(base, h.limitation())
	}
	if err == nil {
		h.doc, h.base, h.fresh, h.fetchedOK = merged, base, now.Add(ttl), true
		if h.OnDocument != nil {
			h.OnDocument(base)
		}
		return h.doc
	}
	if h.OnError != nil {
		h.OnError(err)
	}
	h.retryAt = now.Add(retryAfterError)
	if !h.fetchedOK {
		h.doc = h.fallback()
	}
	return h.doc // stale but real beats a stub
}

// Keep fetches the document at once and again whenever it is stale (TTL
// after the last good fetch; retryAfterError after a failed one), until
// ctx is done, without waiting for a request to ask for it: what is
// learnt from it (OnDocument) stays as fresh as what is served.
func (h *Handler) Keep(ctx context.Context) {
	if h.Fetch == nil {
		return
	}
	tick := time.NewTicker(retryAfterError)
	defer tick.Stop()
	for {
		h.document(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// NIPs is the set of NIPs a relay's NIP-11 document lists in
// supported_nips, as learnt from the last document (Learn). The zero value
// has learnt none, and supports nothing. Safe for concurrent use.
type NIPs struct {
	set atomic.Pointer[map[int]bool]
}

// Learn makes the NIPs that doc (a NIP-11 document) lists in
// supported_nips the set, and reports whether that changed it. Numbers
// and strings of digits are read as NIP numbers; a document without a
// list there supports nothing.
func (n *NIPs) Learn(doc []byte) (changed bool) {
	var d struct {
		Supported []json.RawMessage `json:"supported_nips"`
	}
	_ = json.Unmarshal(doc, &d) // a field of another shape lists nothing
	set := nipSet(d.Supported)
	old := n.set.Swap(&set)
	return old == nil || !maps.Equal(*old, set)
}

// nipSet reads a supported_nips list: numbers, and strings of digits.
func nipSet(list []json.RawMessage) map[int]bool {
	set := make(map[int]bool, len(list))
	for _, raw := range list {
		var v any
		if json.Unmarshal(raw, &v) != nil {
			continue
		}
		switch v := v.(type) {
		case float64:
			if v == math.Trunc(v) && v >= 0 && v < 1<<16 {
				set[int(v)] = true
			}
		case string:
			if nip, err := strconv.Atoi(v); err == nil && nip >= 0 {
				set[nip] = true
			}
		}
	}
	return set
}

// Supports reports whether the document learnt last lists nip; false
// before one was learnt.
func (n *NIPs) Supports(nip int) bool {
	set := n.set.Load()
	return set != nil && (*set)[nip]
}

// usable reports whether h.doc may be served at now without fetching:
// fresh, or within the pause after a failed fetch. Called with mu held.
func (h *Handler) usable(now time.Time) bool {
	return h.doc != nil && (now.Before(h.fresh) || now.Before(h.retryAt))
}

// limitation returns what is merged: the last SetLimitation's, or
// Limitation. Called with mu held.
func (h *Handler) limitation() Limitation {
	if h.lim != nil {
		return *h.lim
	}
	return h.Limitation
}

// fallback returns Fallback (or {}) with the limitation merged in. Called
// with mu held.
func (h *Handler) fallback() []byte {
	fb := h.Fallback
	if h.fallback0 != nil {
		fb = h.fallback0
	}
	if fb == nil {
		fb = []byte("{}")
	}
	lim := h.limitation()
	merged, err := Merge(fb, lim)
	if err != nil {
		merged, _ = Merge([]byte("{}"), lim)
	}
	return merged
}

// SetLimitation makes lim what is merged into every document served from
// now on, and fallback (unless nil) the document served when there is no
// fetched one: a policy reload. The document served next is merged again,
// from the last one fetched (not fetched anew) or from the fallback. Safe
// to call while h serves.
func (h *Handler) SetLimitation(lim Limitation, fallback []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lim = &lim
	if fallback != nil {
		h.fallback0 = fallback
	}
	switch {
	case h.fetchedOK:
		if merged, err := Merge(h.base, lim); err == nil {
			h.doc = merged
		}
	case h.doc != nil:
		h.doc = h.fallback()
	}
}
