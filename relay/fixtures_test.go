package relay

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mailru/easyjson"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// Canonical event fixtures for the gate's tests (wire's tests have their
// own, hostile ones). The signatures are well-formed but not valid: the
// gate checks an EVENT's shape, the relay its signature.
const (
	testID     = "c4912daf11f1498139a32d604690f6763c5d11acc0e9e49c79c06e278c4a8d4d" // goNostrEvent's
	testID3    = "46465a46f75945d906e84e686480386b915db307d54e2ecc363c58323d67d269" // nostrToolsEvent's
	testID2    = "f8a3f0e5c6b1d2e3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1b"
	testPubkey = "6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93"
	testSig    = "908a15e46fb4d8675bab026fc230a0e3542bfade63da02d542fb78b2a8513fcd0092619a2c8c1221e581946e0191f2af505dfdf8657a414dbca329186f009262"
)

// goNostrEvent is an event in go-nostr's field order.
const goNostrEvent = `{"kind":1,"id":"` + testID + `","pubkey":"` + testPubkey + `","created_at":1673347337,"tags":[["e","` + testID2 + `"],["p","` + testPubkey + `"]],"content":"hello \"id\":\"x\" world","sig":"` + testSig + `"}`

// nostrToolsEvent is an event in nostr-tools' order: the id comes late,
// after tags and content that mention other ids.
const nostrToolsEvent = `{"kind":1,"created_at":1673347337,"tags":[["id","` + testID2 + `"]],"content":"{\"id\":\"` + testID2 + `\"}\\","pubkey":"` + testPubkey + `","id":"` + testID3 + `","sig":"` + testSig + `"}`

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
	id, ok := scan.DecodeHex32(ev.ID)
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

// withID returns frame, an EVENT or AUTH frame or an event object, with
// its "id" set to the event's hash (go-nostr's), its fields where they
// were: the gate forwards only events whose id is their hash.
func withID(frame string) string {
	start := strings.Index(frame, "{")
	end := strings.LastIndex(frame, "}") + 1
	var ev nostr.Event
	if err := easyjson.Unmarshal([]byte(frame[start:end]), &ev); err != nil {
		panic(fmt.Sprintf("withID(%.100s): %v", frame, err))
	}
	at := strings.Index(frame, `"id":"`) + len(`"id":"`)
	return frame[:at] + ev.GetID() + frame[at+64:]
}

// idOf returns the id an event frame carries.
func idOf(frame string) string {
	at := strings.Index(frame, `"id":"`) + len(`"id":"`)
	return frame[at : at+64]
}

// eventFrameOf is e as a client's EVENT frame.
func eventFrameOf(t *testing.T, e nostr.Event) []byte {
	t.Helper()
	b, err := nostr.EventEnvelope{Event: e}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
