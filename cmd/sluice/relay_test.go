package main

import (
	"encoding/json"
	"testing"

	"github.com/nbd-wtf/go-nostr/nip11"

	"github.com/sluice-relay/sluice/relay/wire"
)

// TestNIP11DocumentLimitation: the document sluice relay builds has one
// limitation object, with max_filters (which go-nostr's type lacks) beside
// go-nostr's fields, and every other field of khatru's document kept.
func TestNIP11DocumentLimitation(t *testing.T) {
	info := &nip11.RelayInformationDocument{Name: "n", SupportedNIPs: []any{1, 42}}
	info.Limitation = &nip11.RelayLimitationDocument{MaxMessageLength: 1000, MaxLimit: 500, MaxSubidLength: wire.MaxSubIDBytes}
	data, err := json.Marshal(nip11Document{RelayInformationDocument: info, Limitation: relayLimitation{*info.Limitation, 7}})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Name          string
		SupportedNIPs []int `json:"supported_nips"`
		Limitation    map[string]any
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Name != "n" || len(doc.SupportedNIPs) != 2 {
		t.Errorf("document lost khatru's fields: %s", data)
	}
	for k, want := range map[string]float64{"max_filters": 7, "max_subid_length": 64, "max_message_length": 1000, "max_limit": 500} {
		if got, _ := doc.Limitation[k].(float64); got != want {
			t.Errorf("limitation.%s = %v, want %v in %s", k, doc.Limitation[k], want, data)
		}
	}
}
