package scan

import (
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// hostileStrings are content and tag values written as a client may write
// them: every JSON escape, escaped and raw Unicode, control characters,
// surrogate pairs and lone surrogates, escapes of characters that need
// none.
var hostileStrings = []string{
	`plain`, ``, `\"quoted\"`, `back\\slash`, `\/solidus`, `\b\f\n\r\t`,
	`\u0000\u0001\u0007\u0008\u000b\u000e\u001a\u001f`, `\u0041\u00e9\u20ac`, `\u00E9\u20AC`,
	`é€😀`, `\ud83d\ude00`, `\uD83D\uDE00`, `\ud83d`, `\ude00x`, `\ud83d\u0041`, `\ud83d\ud83d\ude00`,
	`\u2028\u2029 `, `\u007f`, "\u007f", `\u0022\u005c`, `a\u005cu0041`, `<script>&amp;`,
	`\\u0041`, `tab\there`, `\uffff\ufffe`,
}

// The id Scan computes is go-nostr's, whatever the escapes: an event
// signed by a client that escapes otherwise than the gate's scanner keeps
// its id, and one byte off refuses it.
func TestScanEventID(t *testing.T) {
	sk := nostr.GeneratePrivateKey()
	pk, _ := nostr.GetPublicKey(sk)
	for _, s := range hostileStrings {
		for _, where := range []string{"content", "tag", "spaced tags"} {
			content, tags := `"x"`, `[["t","`+s+`"],["e","`+strings.Repeat("0", 64)+`"]]`
			switch where {
			case "content":
				content, tags = `"`+s+`"`, `[]`
			case "spaced tags":
				tags = "[ [\"t\" ,\t\"" + s + "\" ] ,\n[\"x\",\"" + s + "\",\"" + s + "\"]\r]"
			}
			frame := []byte(`["EVENT",{"id":"` + strings.Repeat("0", 64) + `","pubkey":"` + pk + `","created_at":1700000000,"kind":1,"tags":` + tags + `,"content":` + content + `,"sig":"` + strings.Repeat("0", 128) + `"}]`)
			env, err, _ := khatruParse(frame)
			if err != nil {
				t.Fatalf("%s %s: go-nostr: %v", where, s, err)
			}
			ev := &env.(*nostr.EventEnvelope).Event
			id := ev.GetID()
			copy(frame[len(`["EVENT",{"id":"`):], id)
			if _, reason := Scan(frame, nil); reason != "" {
				t.Errorf("%s %s: Scan = %q for go-nostr's id %s", where, s, reason, id)
			}
			if at := len(`["EVENT",{"id":"`); frame[at] == '0' {
				frame[at] = '1'
			} else {
				frame[at] = '0'
			}
			if _, reason := Scan(frame, nil); reason != reasonEventID {
				t.Errorf("%s %s: Scan = %q for a wrong id, want %q", where, s, reason, reasonEventID)
			}
			checkScan(t, frame)
		}
	}
}

// The id check costs a hash of the event's serialization per EVENT: the
// same frames scanned with it and without.
func BenchmarkScanEventID(b *testing.B) {
	sk := nostr.GeneratePrivateKey()
	for _, size := range []int{200, 2000, 20000} {
		ev := nostr.Event{Kind: 1, CreatedAt: 1700000000, Tags: nostr.Tags{{"e", strings.Repeat("1", 64)}, {"p", strings.Repeat("2", 64)}}, Content: strings.Repeat("hello, nostr ", size/13)}
		if err := ev.Sign(sk); err != nil {
			b.Fatal(err)
		}
		frame := []byte(`["EVENT",` + ev.String() + `]`)
		if _, reason := Scan(frame, nil); reason != "" {
			b.Fatal(reason)
		}
		for _, check := range []bool{false, true} {
			name := "shape"
			if check {
				name = "shape+id"
			}
			b.Run(name+"/"+itoa(len(frame))+"B", func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(frame)))
				for b.Loop() {
					if _, reason := scan(frame, nil, check); reason != "" {
						b.Fatal(reason)
					}
				}
			})
		}
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}
