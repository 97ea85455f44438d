package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
	"github.com/sluice-relay/sluice/relay/wire"
)

// nip11Fields are NIP-11's top-level fields and their JSON kinds
// ("string", "number", "bool", "array", "object"); rate_limits is
// sluice's own addition (clients ignore what they do not know).
var nip11Fields = map[string]string{
	"name": "string", "description": "string", "banner": "string", "icon": "string",
	"pubkey": "string", "self": "string", "contact": "string", "supported_nips": "array",
	"software": "string", "version": "string", "privacy_policy": "string", "terms_of_service": "string",
	"limitation": "object", "retention": "array", "relay_countries": "array", "language_tags": "array",
	"tags": "array", "posting_policy": "string", "payments_url": "string", "fees": "object",
	"rate_limits": "object",
}

// nip11LimitationFields are NIP-11's limitation fields, and max_filters
// (NIP-11's own list names it too).
var nip11LimitationFields = map[string]string{
	"max_message_length": "number", "max_subscriptions": "number", "max_filters": "number",
	"max_limit": "number", "max_subid_length": "number", "max_event_tags": "number",
	"max_content_length": "number", "min_pow_difficulty": "number", "auth_required": "bool",
	"payment_required": "bool", "restricted_writes": "bool", "created_at_lower_limit": "number",
	"created_at_upper_limit": "number", "default_limit": "number",
}

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "null"
}

// checkNIP11 validates doc field by field against NIP-11: known fields of
// the right kinds, no empty strings, a pubkey that is one, supported_nips
// whole numbers once each, limitation numbers positive, no created_at_*
// (sluice enforces none) and no NIP-86 (served by neither mode's own
// document).
func checkNIP11(t *testing.T, what string, doc []byte) map[string]any {
	t.Helper()
	var top map[string]any
	if err := json.Unmarshal(doc, &top); err != nil {
		t.Fatalf("%s: not a JSON object: %v\n%s", what, err, doc)
	}
	for k, v := range top {
		kind, ok := nip11Fields[k]
		if !ok {
			t.Errorf("%s: %q is not a NIP-11 field", what, k)
			continue
		}
		if got := jsonKind(v); got != kind {
			t.Errorf("%s: %s is %s, want %s", what, k, got, kind)
		}
		if s, ok := v.(string); ok && s == "" {
			t.Errorf("%s: %s is \"\": an empty field is left out", what, k)
		}
	}
	if pk, ok := top["pubkey"].(string); ok && !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(pk) {
		t.Errorf("%s: pubkey %q is not 64 lowercase hex digits", what, pk)
	}
	if nips, ok := top["supported_nips"].([]any); ok {
		seen := map[float64]bool{}
		for _, n := range nips {
			f, ok := n.(float64)
			if !ok || f != float64(int(f)) || f < 1 || seen[f] {
				t.Errorf("%s: supported_nips %v: %v is not a NIP number, or appears twice", what, nips, n)
			}
			seen[f] = true
		}
		if seen[86] {
			t.Errorf("%s: supported_nips lists 86, which sluice does not serve", what)
		}
	}
	lim, _ := top["limitation"].(map[string]any)
	for k, v := range lim {
		kind, ok := nip11LimitationFields[k]
		if !ok {
			t.Errorf("%s: limitation.%s is not a NIP-11 field", what, k)
			continue
		}
		if got := jsonKind(v); got != kind {
			t.Errorf("%s: limitation.%s is %s, want %s", what, k, got, kind)
		}
		if strings.HasPrefix(k, "created_at_") {
			t.Errorf("%s: limitation.%s published, but sluice enforces no created_at window", what, k)
		}
		if f, ok := v.(float64); ok && f <= 0 {
			t.Errorf("%s: limitation.%s = %v: a bound is positive", what, k, f)
		}
	}
	return top
}

// served is doc as a NIP11Handler serves it (merged with the gate's
// limitation and rate_limits).
func served(t *testing.T, cfg *config, doc []byte) []byte {
	t.Helper()
	p, err := newLimiter(context.Background(), cfg, newMetrics(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	pc, err := buildPolicy(cfg, p.quotas.make)
	if err != nil {
		t.Fatal(err)
	}
	h := &nip11.Handler{Fallback: doc, Limitation: nip11Limitation(cfg, pc)}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Accept", "application/nostr+json")
	h.ServeHTTP(w, r)
	return bytes.TrimSpace(w.Body.Bytes())
}

// TestRelayNIP11: sluice relay's document, as served, field by field: the
// running policy's bounds, the NIPs served end to end, nothing empty.
func TestRelayNIP11(t *testing.T) {
	cfg, err := parseAndValidate([]byte("read_limit: 200000\nlimits: {subscriptions: 30, max_filters: 7}\n"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := relayNIP11(cfg, testLimitation(t, cfg), 500)
	if err != nil {
		t.Fatal(err)
	}
	top := checkNIP11(t, "sluice relay", served(t, cfg, doc))
	lim := top["limitation"].(map[string]any)
	for k, want := range map[string]any{
		"max_message_length": float64(200000), "max_subscriptions": float64(30),
		"max_limit": float64(500), "max_subid_length": float64(wire.MaxSubIDBytes),
		"auth_required": false, "payment_required": false, "restricted_writes": false,
	} {
		if lim[k] != want {
			t.Errorf("limitation.%s = %v, want %v", k, lim[k], want)
		}
	}
	var nips []int
	for _, n := range top["supported_nips"].([]any) {
		nips = append(nips, int(n.(float64)))
	}
	if !slices.Equal(nips, []int{1, 9, 11, 40, 42, 45, 70, 77}) {
		t.Errorf("supported_nips %v", nips)
	}
	for _, k := range []string{"pubkey", "contact", "icon", "banner"} {
		if _, ok := top[k]; ok {
			t.Errorf("%s present though not configured", k)
		}
	}
	if top["name"] != "sluice" || top["rate_limits"] == nil {
		t.Errorf("name %v, rate_limits %v", top["name"], top["rate_limits"])
	}

	// Configured, they appear.
	cfg.Info.Pubkey = strings.Repeat("ab", 32)
	cfg.Info.Contact = "mailto:op@example.com"
	doc, _ = relayNIP11(cfg, testLimitation(t, cfg), 500)
	top = checkNIP11(t, "sluice relay with info", doc)
	if top["pubkey"] != cfg.Info.Pubkey || top["contact"] != cfg.Info.Contact {
		t.Errorf("configured info missing: %v", top)
	}
}

// testLimitation is what sluice publishes under cfg's policy.
func testLimitation(t *testing.T, cfg *config) nip11.Limitation {
	t.Helper()
	pc, err := buildPolicy(cfg, localQuotas(nil))
	if err != nil {
		t.Fatal(err)
	}
	return nip11Limitation(cfg, pc)
}

// TestProxyFallbackNIP11: the document sluice proxy serves when the
// upstream has none says only what sluice knows, field by field.
func TestProxyFallbackNIP11(t *testing.T) {
	cfg, err := parseAndValidate(nil)
	if err != nil {
		t.Fatal(err)
	}
	top := checkNIP11(t, "sluice proxy fallback", served(t, cfg, proxyFallbackNIP11(cfg)))
	if _, ok := top["supported_nips"]; ok {
		t.Error("the fallback lists supported_nips: those are the upstream's, which sluice does not know")
	}
	if lim, ok := top["limitation"]; ok {
		t.Errorf("limitation %v: the fallback presents sluice's bounds as the relay's", lim)
	}
	rl := top["rate_limits"].(map[string]any)
	if b := rl["bounds"].(map[string]any); b["max_filters"] != float64(10) || b["max_subscriptions"] != float64(50) || b["max_message_length"] != float64(524288) {
		t.Errorf("rate_limits.bounds %v", b)
	}
}
