package main

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
)

// TestHintsDocRateLimits: the rate_limits object docs/hints.md shows is the
// one sluice publishes in NIP-11 with the default configuration.
func TestHintsDocRateLimits(t *testing.T) {
	doc, err := os.ReadFile("../../docs/hints.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "## The NIP-11 `rate_limits` object")
	_, rest, ok2 := strings.Cut(rest, "```json\n")
	shown, _, ok3 := strings.Cut(rest, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/hints.md has no rate_limits example")
	}
	fc := defaultFileConfig()
	cfg, err := fc.validate()
	if err != nil {
		t.Fatal(err)
	}
	pc, err := buildPolicy(cfg, localQuotas(nil))
	if err != nil {
		t.Fatal(err)
	}
	info, err := nip11.Merge([]byte(`{}`), nip11Limitation(cfg, pc))
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(info, &top); err != nil {
		t.Fatal(err)
	}
	var got, want any
	if err := json.Unmarshal(top["rate_limits"], &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(shown), &want); err != nil {
		t.Fatalf("the example is not JSON: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("docs/hints.md shows\n%s\nsluice publishes\n%s", shown, top["rate_limits"])
	}
}
