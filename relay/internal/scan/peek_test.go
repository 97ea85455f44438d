package scan

import (
	"bytes"
	"encoding/json"
	"github.com/sluice-relay/sluice/relay/wire"
	"strings"
	"testing"
	"unicode/utf8"
)

const (
	testID  = "4376c65d2f232afbe9b882a35baa4f6fe8667c4e684749af565f981833ed6a65"
	testID2 = "f8a3f0e5c6b1d2e3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1b"
)

// goNostrEvent is ordered as go-nostr serializes an event (id early).
const goNostrEvent = `{"kind":1,"id":"` + testID + `","pubkey":"6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93","created_at":1673347337,"tags":[["e","` + testID2 + `"],["p","6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93"]],"content":"hello \"id\":\"x\" world","sig":"908a15e46fb4d8675bab026fc230a0e3542bfade63da02d542fb78b2a8513fcd0092619a2c8c1221e581946e0191f2af505dfdf8657a414dbca329186f009262"}`

// nostrToolsEvent is ordered as nostr-tools' finalizeEvent leaves it (id late),
// with an "id" key inside a nested object and inside the content.
const nostrToolsEvent = `{"kind":1,"created_at":1673347337,"tags":[["id","` + testID2 + `"],{"id":"` + testID2 + `"}],"content":"{\"id\":\"` + testID2 + `\"}\\","pubkey":"6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93","id":"` + testID + `","sig":"908a15e46fb4d8675bab026fc230a0e3542bfade63da02d542fb78b2a8513fcd0092619a2c8c1221e581946e0191f2af505dfdf8657a414dbca329186f009262"}`

func TestPeek(t *testing.T) {
	tests := []struct {
		name  string
		frame string
		want  wire.Type
		id    string // expected raw ID literal; "" means nil
	}{
		{"event go-nostr order", `["EVENT",` + goNostrEvent + `]`, wire.TypeEVENT, `"` + testID + `"`},
		{"event nostr-tools order", `["EVENT",` + nostrToolsEvent + `]`, wire.TypeEVENT, `"` + testID + `"`},
		{"event spaced", " \r\n\t[ \n\"EVENT\" ,\t{ \"id\" : \"" + testID + "\" } ]", wire.TypeEVENT, `"` + testID + `"`},
		{"event escaped label", `["\u0045VENT",{"id":"` + testID + `"}]`, wire.TypeEVENT, `"` + testID + `"`},
		{"event fully escaped label", `["\u0045\u0056\u0045\u004e\u0054",{}]`, wire.TypeEVENT, ""},
		{"event lower-case hex escape", `["\u0045\u0056\u0045\u004E\u0054",{}]`, wire.TypeEVENT, ""},
		{"neg-close fully escaped", `["\u004e\u0045\u0047\u002d\u0043\u004c\u004f\u0053\u0045","s"]`, wire.TypeNEGCLOSE, `"s"`},
		{"solidus escape", `["NEG\/OPEN"]`, wire.TypeOther, ""},
		{"event upper-case id", `["EVENT",{"id":"` + strings.ToUpper(testID) + `"}]`, wire.TypeEVENT, ""},
		{"event short id", `["EVENT",{"id":"abcd"}]`, wire.TypeEVENT, ""},
		{"event id not a string", `["EVENT",{"id":123}]`, wire.TypeEVENT, ""},
		{"event escaped id key", `["EVENT",{"\u0069d":"` + testID + `"}]`, wire.TypeEVENT, ""},
		{"event id only nested", `["EVENT",{"tags":[["id","` + testID + `"]],"x":{"id":"` + testID + `"}}]`, wire.TypeEVENT, ""},
		{"event id only in content", `["EVENT",{"content":"\",\"id\":\"` + testID + `\""}]`, wire.TypeEVENT, ""},
		{"event id after escaped quote and brace", `["EVENT",{"content":"\"}","id":"` + testID + `"}]`, wire.TypeEVENT, `"` + testID + `"`},
		{"event id after long escaped quote and brace", `["EVENT",{"content":"` + strings.Repeat("x", 40) + `\"}\\\"}","id":"` + testID + `"}]`, wire.TypeEVENT, `"` + testID + `"`},
		{"event id after escaped backslashes", `["EVENT",{"content":"\\\\","id":"` + testID + `"}]`, wire.TypeEVENT, `"` + testID + `"`},
		{"event id after long escaped backslashes", `["EVENT",{"content":"` + strings.Repeat("x", 40) + `\\\\","id":"` + testID + `"}]`, wire.TypeEVENT, `"` + testID + `"`},
		{"event id in object right after key comma", `["EVENT",{"a":1,{"id":"` + testID + `"}}]`, wire.TypeEVENT, ""},
		{"event id as value", `["EVENT",{"x":"id","y":"` + testID + `"}]`, wire.TypeEVENT, ""},
		{"event not an object", `["EVENT","` + testID + `"]`, wire.TypeEVENT, ""},
		{"event truncated in object", `["EVENT",{"content":"abc`, wire.TypeEVENT, ""},
		{"auth", `["AUTH",{"id":"` + testID + `","kind":22242}]`, wire.TypeAUTH, `"` + testID + `"`},
		{"req", `["REQ","sub1",{"kinds":[1]}]`, wire.TypeREQ, `"sub1"`},
		{"req escaped sub id", `["REQ","a\"b\\c\u00e9\n",{}]`, wire.TypeREQ, `"a\"b\\c\u00e9\n"`},
		{"req utf-8 sub id", `["REQ","süß🙂",{}]`, wire.TypeREQ, `"süß🙂"`},
		{"req sub id not a string", `["REQ",42,{}]`, wire.TypeREQ, ""},
		{"req sub id bad escape", `["REQ","a\x",{}]`, wire.TypeREQ, ""},
		{"req sub id bad \\u", `["REQ","a\u12",{}]`, wire.TypeREQ, ""},
		{"req sub id control char", "[\"REQ\",\"a\tb\",{}]", wire.TypeREQ, ""},
		{"req sub id invalid utf-8", "[\"REQ\",\"a\xffb\",{}]", wire.TypeREQ, ""},
		{"req sub id truncated", `["REQ","abc`, wire.TypeREQ, ""},
		{"req sub id max", `["REQ","` + strings.Repeat("s", maxSubIDLen-2) + `"]`, wire.TypeREQ, `"` + strings.Repeat("s", maxSubIDLen-2) + `"`},
		{"req sub id too long", `["REQ","` + strings.Repeat("s", maxSubIDLen-1) + `"]`, wire.TypeREQ, ""},
		{"count", `["COUNT","c",{}]`, wire.TypeCOUNT, `"c"`},
		{"close", `["CLOSE","sub1"]`, wire.TypeCLOSE, `"sub1"`},
		{"close alone", `["CLOSE"]`, wire.TypeCLOSE, ""},
		{"neg-open", `["NEG-OPEN","s",{},"00"]`, wire.TypeNEGOPEN, `"s"`},
		{"neg-msg", `["NEG-MSG","s","00"]`, wire.TypeNEGMSG, `"s"`},
		{"neg-close", `["NEG-CLOSE","s"]`, wire.TypeNEGCLOSE, `"s"`},
		{"lower-case label", `["event",{}]`, wire.TypeOther, ""},
		{"OTHER label", `["OTHER"]`, wire.TypeOther, ""},
		{"unknown label", `["FOO",1]`, wire.TypeOther, ""},
		{"empty label", `["",1]`, wire.TypeOther, ""},
		{"label with NUL escape", `["EVENT\u0000",{}]`, wire.TypeOther, ""},
		{"label prefix of longer", `["EVENTS",{}]`, wire.TypeOther, ""},
		{"huge label", `["` + strings.Repeat("A", 1<<16) + `"]`, wire.TypeOther, ""},
		{"empty", ``, wire.TypeOther, ""},
		{"bracket", `[`, wire.TypeOther, ""},
		{"bracket quote", `["`, wire.TypeOther, ""},
		{"truncated label", `["EVE`, wire.TypeOther, ""},
		{"truncated after label", `["EVENT"`, wire.TypeOther, ""},
		{"truncated after label ws", `["EVENT"  `, wire.TypeOther, ""},
		{"label then garbage", `["EVENT":{}]`, wire.TypeOther, ""},
		{"one-element array", `[ "EVENT" ]`, wire.TypeEVENT, ""},
		{"object", `{}`, wire.TypeOther, ""},
		{"object with label", `{"EVENT":1}`, wire.TypeOther, ""},
		{"number", `123`, wire.TypeOther, ""},
		{"nested array", `[["EVENT"],{}]`, wire.TypeOther, ""},
		{"number first", `[1,"EVENT"]`, wire.TypeOther, ""},
		{"NUL bytes", "\x00[\"EVENT\",{}]", wire.TypeOther, ""},
		{"NUL in label", "[\"EV\x00ENT\",{}]", wire.TypeOther, ""},
		{"BOM", "\xef\xbb\xbf[\"EVENT\",{}]", wire.TypeOther, ""},
		{"invalid utf-8 label", "[\"EV\xffT\",{}]", wire.TypeOther, ""},
		{"lone surrogate label", `["\ud800",{}]`, wire.TypeOther, ""},
		{"surrogate pair label", `["\ud83d\ude00",{}]`, wire.TypeOther, ""},
		{"non-ascii escape label", `["EVEN\u0054\u00e9"]`, wire.TypeOther, ""},
		{"invalid escape label", `["\EVENT",{}]`, wire.TypeOther, ""},
		{"short \\u label", `["\u004",{}]`, wire.TypeOther, ""},
		{"bad hex label", `["\u00g5VENT",{}]`, wire.TypeOther, ""},
		{"vertical tab is not whitespace", "\v[\"EVENT\",{}]", wire.TypeOther, ""},
		{"non-breaking space is not whitespace", "\u00a0[\"EVENT\",{}]", wire.TypeOther, ""},
		{"lots of whitespace", strings.Repeat(" ", 1<<16) + `["REQ","s",{}]`, wire.TypeREQ, `"s"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := []byte(tt.frame)
			got := Peek(frame).Frame()
			if got.Type != tt.want {
				t.Errorf("Type = %v, want %v", got.Type, tt.want)
			}
			if tt.id == "" && got.ID != nil {
				t.Errorf("ID = %q, want nil", got.ID)
			}
			if tt.id != "" && string(got.ID) != tt.id {
				t.Errorf("ID = %q, want %q", got.ID, tt.id)
			}
			checkFrame(t, frame, got)
		})
	}
}

// checkFrame asserts the invariants every Peek result keeps.
func checkFrame(t *testing.T, frame []byte, f Frame) {
	t.Helper()
	if f.Type >= wire.NumTypes {
		t.Fatalf("Type %d out of range", f.Type)
	}
	if f.ID == nil {
		return
	}
	if !isSubSlice(frame, f.ID) {
		t.Fatalf("ID %q is not a sub-slice of the frame", f.ID)
	}
	if !validStringLiteral(f.ID) {
		t.Fatalf("ID %q is not a valid JSON string literal", f.ID)
	}
	if cap(f.ID) != len(f.ID) {
		t.Fatalf("ID cap %d > len %d: appending to it would overwrite the frame", cap(f.ID), len(f.ID))
	}
}

func isSubSlice(outer, inner []byte) bool {
	if len(inner) == 0 {
		return false
	}
	for i := 0; i+len(inner) <= len(outer); i++ {
		if &outer[i] == &inner[0] {
			return bytes.Equal(outer[i:i+len(inner)], inner)
		}
	}
	return false
}

// TestPeekLargeEvents checks the scan bounds: a big real event (a contact
// list of 4,000 follows with relay hints and petnames, id last as
// nostr-tools writes it) still yields its
// id, while a frame of nothing but structure gives up before reaching it.
func TestPeekLargeEvents(t *testing.T) {
	var follows strings.Builder
	for i := range 4000 {
		if i > 0 {
			follows.WriteByte(',')
		}
		follows.WriteString(`["p","` + testID2 + `","wss://relay.example.com","alice"]`)
	}
	contacts := []byte(`["EVENT",{"kind":3,"created_at":1,"tags":[` + follows.String() + `],"content":"","pubkey":"` + testID2 + `","id":"` + testID + `","sig":"00"}]`)
	if len(contacts) > maxIDScan {
		t.Fatalf("test event of %d bytes exceeds maxIDScan", len(contacts))
	}
	if f := Peek(contacts).Frame(); string(f.ID) != `"`+testID+`"` {
		t.Errorf("contact list (%d bytes): ID = %q, want the id", len(contacts), f.ID)
	}
	article := []byte(`["EVENT",{"kind":30023,"content":"` + strings.Repeat("words and \"quotes\" ", 20000) + `","id":"` + testID + `"}]`)
	if f := Peek(article).Frame(); string(f.ID) != `"`+testID+`"` {
		t.Errorf("long article (%d bytes): ID = %q, want the id", len(article), f.ID)
	}
	flood := []byte(`["EVENT",{"a":[` + strings.Repeat("[],", maxIDTokens) + `[]],"id":"` + testID + `"}]`)
	if f := Peek(flood).Frame(); f.Type != wire.TypeEVENT || f.ID != nil {
		t.Errorf("structural flood: %v %q, want EVENT without id", f.Type, f.ID)
	}
	past := []byte(`["EVENT",{"content":"` + strings.Repeat("x", maxIDScan) + `","id":"` + testID + `"}]`)
	if f := Peek(past).Frame(); f.Type != wire.TypeEVENT || f.ID != nil {
		t.Errorf("id past maxIDScan: %v %q, want EVENT without id", f.Type, f.ID)
	}
}

func TestTypeString(t *testing.T) {
	want := []string{"OTHER", "EVENT", "REQ", "CLOSE", "COUNT", "AUTH", "NEG-OPEN", "NEG-MSG", "NEG-CLOSE"}
	if len(want) != int(wire.NumTypes) {
		t.Fatalf("NumTypes = %d, test knows %d", wire.NumTypes, len(want))
	}
	for i, w := range want {
		typ := wire.Type(i)
		if got := typ.String(); got != w {
			t.Errorf("Type(%d).String() = %q, want %q", i, got, w)
		}
		if i != int(wire.TypeOther) {
			if got := Peek([]byte(`["` + w + `"]`)).Frame().Type; got != typ {
				t.Errorf("Peek of %q label = %v", w, got)
			}
		}
	}
	if got := wire.Type(200).String(); got != "OTHER" {
		t.Errorf("out-of-range String = %q", got)
	}
	for _, bad := range []string{"", "event", "Event", "NEG_OPEN", "EVENT ", " EVENT", "other"} {
		if got := Peek([]byte(`["` + bad + `"]`)).Type; got != wire.TypeOther {
			t.Errorf("Peek of %q label = %v, want OTHER", bad, got)
		}
	}
}

func TestPeekAllocs(t *testing.T) {
	frames := [][]byte{
		[]byte(`["EVENT",` + nostrToolsEvent + `]`),
		[]byte(`["\u0045VENT",` + goNostrEvent + `]`),
		[]byte(`["REQ","süß",{"kinds":[1]}]`),
		[]byte(`["` + strings.Repeat("A", 100) + `"]`),
	}
	var sink Frame
	for _, f := range frames {
		if n := testing.AllocsPerRun(100, func() { sink = Peek(f).Frame() }); n != 0 {
			t.Errorf("Peek(%.20q…).Frame() allocates %v times", f, n)
		}
	}
	_ = sink
}

// validStringLiteral reports whether b is exactly one JSON string literal of
// valid UTF-8, checked with encoding/json as an independent oracle.
func validStringLiteral(b []byte) bool {
	if len(b) < 2 || b[0] != '"' || !utf8.Valid(b) {
		return false
	}
	var s string
	return json.Unmarshal(b, &s) == nil
}

func BenchmarkPeek(b *testing.B) {
	bigContent := `["EVENT",{"kind":1,"tags":[],"content":"` + strings.Repeat("lorem ipsum ", 5000) + `","pubkey":"6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93","id":"` + testID + `","sig":"00"}]`
	for _, bm := range []struct{ name, frame string }{
		{"EVENT", `["EVENT",` + goNostrEvent + `]`},
		{"EVENT-id-late", `["EVENT",` + nostrToolsEvent + `]`},
		{"EVENT-id-late-60KiB", bigContent},
		{"REQ", `["REQ","sub:1",{"kinds":[1],"limit":10}]`},
		{"escaped-label", `["\u0045\u0056\u0045\u004e\u0054",` + goNostrEvent + `]`},
		{"hostile-long-label", `["` + strings.Repeat("A", 4096) + `"]`},
		{"hostile-nested-4KiB", `["EVENT",{"a":` + strings.Repeat("[", 4096) + `]`},
		{"hostile-quotes-4KiB", `["EVENT",{"a":[` + strings.Repeat(`""",`, 800) + `]`},
		{"hostile-structure-512KiB", `["EVENT",{"a":[` + strings.Repeat(`[],`, (512<<10)/3-8) + `]}]`},
		{"hostile-digits-512KiB", `["EVENT",{"a":` + strings.Repeat(`1`, (512<<10)-20) + `}]`},
		{"hostile-whitespace-512KiB", strings.Repeat(" ", (512<<10)-20) + `["REQ","s"]`},
		{"hostile-whitespace-4KiB", strings.Repeat(" ", 4096) + `["REQ","s"]`},
		{"hostile-garbage", "\xef\xbb\xbf\x00\x00garbage"},
	} {
		frame := []byte(bm.frame)
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(frame)))
			var f Frame
			for b.Loop() {
				f = Peek(frame).Frame()
			}
			_ = f
		})
	}
}
