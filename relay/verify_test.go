package relay

import (
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// validSig accepts an event its author signed, and refuses one whose
// signature or pubkey is another's, or whose sig is written with spaces
// around its colon.
func TestValidSig(t *testing.T) {
	sk, _ := newKey(t)
	ev := nostr.Event{Kind: 1, CreatedAt: 1700000000, Tags: nostr.Tags{{"t", "sig"}}, Content: `"sig":"` + strings.Repeat("0", 128) + `"`}
	if err := ev.Sign(sk); err != nil {
		t.Fatal(err)
	}
	frame := `["EVENT",` + ev.String() + `]`
	check := func(frame string, want bool) {
		t.Helper()
		f, reason := scan.Scan([]byte(frame), nil)
		if reason != "" {
			t.Fatalf("Scan: %s", reason)
		}
		if got := validSig(&f.Event); got != want {
			t.Errorf("validSig = %v, want %v: %s", got, want, frame)
		}
	}
	check(frame, true)
	check(strings.Replace(frame, `"sig":"`, `"sig" :  "`, 1), true)
	other := nostr.Event{Kind: 1, CreatedAt: 1, Content: "x"}
	_ = other.Sign(sk)
	check(strings.Replace(frame, ev.Sig, other.Sig, 1), false)
}

// BenchmarkEventChecks is what an EVENT costs the gate to read: its shape
// and id (scan.Scan), then with the verification of its signature the
// quota asks for (unless Options.UpstreamVerifies). The difference is the
// signature's cost per EVENT; wire's BenchmarkScanEventID gives the id's.
//
//	go test ./relay -run '^$' -bench EventChecks -benchtime 20000x -count 5
func BenchmarkEventChecks(b *testing.B) {
	sk := nostr.GeneratePrivateKey()
	ev := nostr.Event{Kind: 1, CreatedAt: 1700000000, Tags: nostr.Tags{{"e", strings.Repeat("1", 64)}, {"p", strings.Repeat("2", 64)}}, Content: strings.Repeat("hello, nostr ", 30)}
	if err := ev.Sign(sk); err != nil {
		b.Fatal(err)
	}
	frame := []byte(`["EVENT",` + ev.String() + `]`)
	b.Run("shape+id", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, reason := scan.Scan(frame, nil); reason != "" {
				b.Fatal(reason)
			}
		}
	})
	b.Run("shape+id+sig", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			f, reason := scan.Scan(frame, nil)
			if reason != "" || !validSig(&f.Event) {
				b.Fatal(reason)
			}
		}
	})
}
