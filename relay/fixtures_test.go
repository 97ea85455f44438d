package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/relay/wire"
)

// Canonical event fixtures for the gate's tests (wire's tests have their
// own, hostile ones). The signatures are well-formed but not valid: the
// gate checks an EVENT's shape, the relay its signature.
const (
	testID     = "4376c65d2f232afbe9b882a35baa4f6fe8667c4e684749af565f981833ed6a65"
	testID2    = "f8a3f0e5c6b1d2e3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1b"
	testPubkey = "6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93"
	testSig    = "908a15e46fb4d8675bab026fc230a0e3542bfade63da02d542fb78b2a8513fcd0092619a2c8c1221e581946e0191f2af505dfdf8657a414dbca329186f009262"
)

// goNostrEvent is an event in go-nostr's field order.
const goNostrEvent = `{"kind":1,"id":"` + testID + `","pubkey":"` + testPubkey + `","created_at":1673347337,"tags":[["e","` + testID2 + `"],["p","` + testPubkey + `"]],"content":"hello \"id\":\"x\" world","sig":"` + testSig + `"}`

// nostrToolsEvent is an event in nostr-tools' order: the id comes late,
// after tags and content that mention other ids.
const nostrToolsEvent = `{"kind":1,"created_at":1673347337,"tags":[["id","` + testID2 + `"]],"content":"{\"id\":\"` + testID2 + `\"}\\","pubkey":"` + testPubkey + `","id":"` + testID + `","sig":"` + testSig + `"}`

// signedAuth returns a NIP-42 AUTH frame signed by sk for challenge and
// relayURL at instant at, and the event's id.
func signedAuth(t testing.TB, sk, challenge, relayURL string, at time.Time) (string, hex32) {
	t.Helper()
	ev := nostr.Event{
		Kind:      22242,
		CreatedAt: nostr.Timestamp(at.Unix()),
		Tags:      nostr.Tags{{"relay", relayURL}, {"challenge", challenge}},
	}
	if err := ev.Sign(sk); err != nil {
		t.Fatal(err)
	}
	b, err := nostr.AuthEnvelope{Event: ev}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := wire.DecodeHex32(ev.ID)
	if !ok {
		t.Fatalf("bad id %q", ev.ID)
	}
	return string(b), id
}

// okFor is the relay's OK for id.
func okFor(id hex32, accepted bool, reason string) string {
	return fmt.Sprintf(`["OK","%x",%v,"%s"]`, id[:], accepted, reason)
}

// newKey returns a private key and its pubkey.
func newKey(t testing.TB) (sk, pk string) {
	t.Helper()
	sk = nostr.GeneratePrivateKey()
	pk, err := nostr.GetPublicKey(sk)
	if err != nil {
		t.Fatal(err)
	}
	return sk, pk
}
