package nip11

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
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
	// MaxMessageLength is the gate's read limit in bytes. It is written to
	// limitation.max_message_length unless the document already has a
	// smaller one (the smaller of the two is what a client can send). 0
	// leaves the field as it is.
	MaxMessageLength int64
	// MaxFilters, MaxSubidLength and MaxSubscriptions are the gate's
	// bounds on a forwarded REQ and on the subscriptions a connection
	// holds (policy.EffectiveMaxFilters of the running policy, wire.MaxSubIDBytes, relay.Options.MaxSubscriptions),
	// written to limitation.max_filters, max_subid_length and
	// max_subscriptions the same way: the smaller of the document's and
	// these; 0 leaves a field as it is.
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

// Merge returns doc, a JSON object, with lim merged in. Every field of
// doc other than limitation.max_message_length, max_filters,
// max_subid_length, max_subscriptions, the Bounds fields and rate_limits
// is kept byte for
// byte, including fields this package does not know, except empty string
// fields and zero created_at limits, which are dropped (dropEmpty).
func Merge(doc []byte, lim Limitation) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(doc, &top); err != nil || top == nil {
		return nil, fmt.Errorf("%w: not a JSON object", ErrDocument)
	}
	var b wire.Bounds
	if lim.Bounds != nil {
		b = *lim.Bounds
	}
	if lim.MaxMessageLength > 0 || lim.MaxFilters > 0 || lim.MaxSubidLength > 0 || lim.MaxSubscriptions > 0 || lim.Bounds != nil {
		var limitation map[string]json.RawMessage
		if raw, ok := top["limitation"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			if err := json.Unmarshal(raw, &limitation); err != nil || limitation == nil {
				return nil, fmt.Errorf("%w: limitation is not a JSON object", ErrDocument)
			}
		}
		if limitation == nil {
			limitation = map[string]json.RawMessage{}
		}
		// The smaller of the two is what a client can send.
		for _, f := range []struct {
			key  string
			ours int64
		}{
			{"max_message_length", lim.MaxMessageLength}, {"max_filters", lim.MaxFilters}, {"max_subid_length", lim.MaxSubidLength}, {"max_subscriptions", lim.MaxSubscriptions},
			{"max_event_tags", int64(b.MaxTags)}, {"max_tag_value_bytes", int64(b.MaxTagValueBytes)}, {"max_filter_values", int64(b.MaxFilterValues)}, {"max_filter_fanout", int64(b.MaxFanout)},
		} {
			if f.ours <= 0 {
				continue
			}
			v := f.ours
			var theirs float64
			if raw, ok := limitation[f.key]; ok && json.Unmarshal(raw, &theirs) == nil && theirs > 0 && theirs < float64(v) {
				v = int64(theirs)
			}
			limitation[f.key], _ = json.Marshal(v)
		}
		top["limitation"], _ = json.Marshal(limitation)
	}
	dropEmpty(top)
	if lim.Limits != nil {
		rl := nip11RateLimits{
			Note:       "per client (IP address or IPv6 prefix); EWMA windows: burst from rest, then sustained_per_second; a refusal says how long to wait",
			Mode:       "enforce",
			Connection: nip11Windows(lim.Limits.Connection, lim.Shadow),
			Message:    make(map[string][]nip11Window, wire.NumTypes),
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
					if r.From == r.To {
						nc.Kinds = append(nc.Kinds, r.From)
					} else {
						nc.Kinds = append(nc.Kinds, fmt.Sprintf("%d-%d", r.From, r.To))
					}
				}
				rl.Kinds[c.Name] = nc
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
		if bytes.Equal(bytes.TrimSpace(v), []byte(`""`)) {
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
