package scan

import (
	"bytes"
	"encoding/json"
	"github.com/sluice-relay/sluice/relay/wire"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"
)

// hostileFrames are frames a client may send to confuse Peek; the short ones
// seed FuzzPeek, and testdata/fuzz/FuzzPeek holds more (and whatever the
// fuzzer finds). The invariants in checkPeek hold for all of them.
var hostileFrames = []string{
	``,
	`[`,
	`["`,
	`["\`,
	`["\u`,
	`["\u004`,
	`["EVENT`,
	`["EVENT"`,
	`["EVENT",`,
	`["EVENT",{`,
	`["EVENT",{"id"`,
	`["EVENT",{"id":`,
	`["EVENT",{"id":"` + testID[:40],
	`["EVENT",{"id":"` + testID + `"`,
	`["REQ","`,
	`["REQ","\`,
	`["REQ","\u12`,
	`[ "EVENT" ]`,
	`["` + strings.Repeat("A", 4096) + `"]`,
	`["` + strings.Repeat(`\u0041`, 100) + `"]`,
	strings.Repeat("[", 10000),
	`["EVENT",` + strings.Repeat("[", 10000) + `]`,
	`["EVENT",{"a":` + strings.Repeat("{", 5000) + `}`,
	`["EVENT",{"a":"` + strings.Repeat(`\\`, 5000) + `","id":"` + testID + `"}]`,
	`["EVENT",{"a":"` + strings.Repeat(`\"`, 5000) + `","id":"` + testID + `"}]`,
	"\x00\x00\x00",
	"[\"EVENT\x00\",{}]",
	"[\"\xff\xfe\",{}]",
	"[\"REQ\",\"\xc3\",{}]",
	`["\ud800",{}]`,
	`["\udc00\ud800"]`,
	`["REQ","\ud800",{}]`,
	"\xef\xbb\xbf[\"EVENT\",{}]",
	`123`,
	`-1e999`,
	`{}`,
	`{"EVENT":[]}`,
	`"EVENT"`,
	`null`,
	`[null,"EVENT"]`,
	`[true]`,
	`[]`,
	`[,"EVENT"]`,
	`["EVENT",{"id":"` + testID + `","id":"` + testID2 + `"}]`,
	`["EVENT",{"tags":[{"id":"` + testID2 + `"}],"id":"` + testID + `"}]`,
	`["EVENT",{}}"id":"` + testID + `"}]`,
	`["AUTH","challenge"]`,
	`["CLOSE",{"id":"` + testID + `"}]`,
	`["COUNT","` + strings.Repeat("x", 300) + `",{}]`,
	`["NEG-OPEN","s",{},"61"]`,
	"[\"EVENT\"\v,{}]",
}

func FuzzPeek(f *testing.F) {
	for _, h := range hostileFrames {
		// The huge ones stay in TestHostileFrames: as seeds they only slow
		// the fuzzer's minimizer down.
		if len(h) <= 512 {
			f.Add([]byte(h))
		}
	}
	// Well-formed frames seed the fuzzer with the structure worth mutating.
	f.Add([]byte(`["EVENT",` + goNostrEvent + `]`))
	f.Add([]byte(`["EVENT",` + nostrToolsEvent + `]`))
	f.Add([]byte(`["REQ","sub",{"kinds":[1]},{"authors":["` + testID + `"]}]`))
	f.Add([]byte(`["\u0043\u004fUNT","c",{}]`))
	f.Add([]byte(`[0,"EVENT",` + goNostrEvent + `]`))
	f.Add([]byte("\x01[\"REQ\",\"s\",{}]"))
	f.Add([]byte(`["NEG-OPEN","s",{},"6100"]`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		checkPeek(t, frame)
	})
}

// TestHostileFrames runs the fuzz invariants over the hostile table and
// the committed corpus even when the corpus is not loaded by a -fuzz run.
func TestHostileFrames(t *testing.T) {
	for _, h := range hostileFrames {
		checkPeek(t, []byte(h))
	}
}

// checkPeek asserts what Peek guarantees for any input: it does not panic,
// Type is in range, ID is nil or a valid JSON string literal inside the
// frame; and wherever encoding/json can read the frame as an array whose
// first element is a string, Peek agrees with it on the type and, when it
// reports an id, on the id.
func checkPeek(t *testing.T, frame []byte) {
	t.Helper()
	orig := bytes.Clone(frame)
	f := Peek(frame).Frame()
	if !bytes.Equal(frame, orig) {
		t.Fatalf("Peek modified its input")
	}
	checkFrame(t, frame, f)

	// khatru reads frames with go-nostr's default parser, which takes the
	// text between the first two quotes anywhere in the frame as the label
	// ([0,"EVENT",{…}] is an EVENT to it). A frame it reads as a message
	// must be one the gate refuses to forward, or one charged as that
	// message: otherwise its limits (and the quota) are skipped.
	if typ, _, shaped := peekType(frame); shaped {
		// What the gate forwards, khatru's negentropy parser must survive
		// (it panics on some frames the gate refuses, such as [1,"X"]),
		// and what it reads as a negentropy message, the gate must charge
		// as one. khatru asks it only of frames whose label it does not know.
		mp := nostr.NewMessageParser()
		if _, err := mp.ParseMessage(string(frame)); err == nostr.UnknownLabel {
			if env := nip77.ParseNegMessage(string(frame)); env != nil {
				if want := labelType([]byte(env.Label())); typ != want {
					t.Fatalf("khatru reads %q as %s, the gate charges it as %v and forwards it", frame, env.Label(), typ)
				}
			}
		}
	}
	if env := nostr.ParseMessage(string(frame)); env != nil {
		if typ, _, shaped := peekType(frame); shaped {
			if want := labelType([]byte(env.Label())); typ != want {
				t.Fatalf("go-nostr reads %q as %s, the gate charges it as %v and forwards it", frame, env.Label(), typ)
			}
		}
	}

	var elems []json.RawMessage
	if json.Unmarshal(frame, &elems) != nil || len(elems) == 0 || elems[0][0] != '"' {
		return
	}
	var label string
	if err := json.Unmarshal(elems[0], &label); err != nil {
		t.Fatalf("encoding/json decoded the array but not its first string %s: %v", elems[0], err)
	}
	if want := labelType([]byte(label)); f.Type != want {
		t.Fatalf("Peek type %v, encoding/json label %q (%v), frame %q", f.Type, label, want, frame)
	}
	switch f.Type {
	case wire.TypeREQ, wire.TypeCOUNT, wire.TypeCLOSE:
		var want []byte
		if len(elems) > 1 && elems[1][0] == '"' && len(elems[1]) <= maxSubIDLen && utf8.Valid(elems[1]) {
			want = elems[1]
		}
		if !bytes.Equal(f.ID, want) {
			t.Fatalf("Peek sub id %q, encoding/json %q, frame %q", f.ID, want, frame)
		}
	case wire.TypeEVENT, wire.TypeAUTH:
		if len(elems) < 2 || elems[1][0] != '{' {
			if f.ID != nil {
				t.Fatalf("Peek found id %s in a non-object, frame %q", f.ID, frame)
			}
			return
		}
		ids := topLevelIDs(t, elems[1])
		if f.ID == nil {
			// Without escapes anywhere every key is spelled plainly, so a
			// valid first top-level "id" is one Peek must find (within its
			// scan bounds, which a frame this short cannot exceed).
			plain := !bytes.ContainsRune(elems[1], '\\') && len(frame) <= maxIDTokens
			if plain && len(ids) > 0 && isHexID(ids[0]) {
				t.Fatalf("Peek found no id, encoding/json's first id is %q, frame %q", ids[0], frame)
			}
			return
		}
		// Peek takes the first plainly spelled "id"; an escaped key
		// ("\u0069d") before it is one only encoding/json sees.
		var id string
		_ = json.Unmarshal(f.ID, &id)
		found := false
		for _, v := range ids {
			found = found || v == id
		}
		if !found || (!bytes.ContainsRune(elems[1], '\\') && id != ids[0]) {
			t.Fatalf("Peek id %s, encoding/json top-level ids %q, frame %q", f.ID, ids, frame)
		}
	}
}

// isHexID reports whether s is 64 lowercase hex digits.
func isHexID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// topLevelIDs returns the string values of every top-level key of obj that
// decodes to "id" (duplicates included), using encoding/json's tokenizer.
func topLevelIDs(t *testing.T, obj []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	var ids []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		var s string
		if k == "id" && json.Unmarshal(v, &s) == nil {
			ids = append(ids, s)
		}
	}
	return ids
}

// TestFuzzCorpusPresent keeps the committed seed corpus from silently
// disappearing: go test runs every file in it as a FuzzPeek case.
func TestFuzzCorpusPresent(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzPeek", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no seed corpus in testdata/fuzz/FuzzPeek: %v", err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("go test fuzz v1\n")) {
			t.Errorf("%s is not a go test fuzz v1 file", name)
		}
	}
}

// FuzzAppendRefusal checks that whatever frame is refused with whatever
// reason, the reply is valid JSON of the right envelope carrying the frame's
// id and the reason, and that go-nostr reads it as that envelope.
func FuzzAppendRefusal(f *testing.F) {
	for _, shape := range refusalShapes {
		f.Add([]byte(shape.frame), ReasonUnavailable, int64(17200))
	}
	f.Add([]byte(`["REQ","\ud800",{}]`), "bad \xff utf8 \u2028", int64(-5))
	f.Add([]byte(`["COUNT","a\"b",{}]`), "\"\\\x00", int64(1<<40))
	f.Fuzz(func(t *testing.T, frame []byte, reason string, waitMs int64) {
		fr := Peek(frame).Frame()
		reply := AppendRefusal(nil, fr, reason)
		if !utf8.Valid(reply) {
			t.Fatalf("reply is not valid UTF-8: %q", reply)
		}
		var arr []any
		if err := json.Unmarshal(reply, &arr); err != nil {
			t.Fatalf("reply %q does not decode: %v", reply, err)
		}
		var wantReason string
		b, _ := json.Marshal(reason)
		_ = json.Unmarshal(b, &wantReason)
		var id string
		if fr.ID != nil {
			_ = json.Unmarshal(fr.ID, &id)
		}
		var want []any
		switch {
		case fr.ID != nil && (fr.Type == wire.TypeEVENT || fr.Type == wire.TypeAUTH):
			want = []any{"OK", id, false, wantReason}
		case fr.ID != nil && (fr.Type == wire.TypeREQ || fr.Type == wire.TypeCOUNT):
			want = []any{"CLOSED", id, wantReason}
		case fr.ID != nil && (fr.Type == wire.TypeNEGOPEN || fr.Type == wire.TypeNEGMSG):
			want = []any{"NEG-ERR", id, wantReason}
		default:
			want = []any{"NOTICE", wantReason}
		}
		gotJSON, _ := json.Marshal(arr)
		wantJSON, _ := json.Marshal(want)
		if !bytes.Equal(gotJSON, wantJSON) {
			t.Fatalf("reply %s decodes to %s, want %s", reply, gotJSON, wantJSON)
		}
		if want[0] == "NEG-ERR" {
			// (go-nostr's ErrorEnvelope labels itself NEG-ERROR, though it
			// reads and writes NEG-ERR.)
			if e, ok := nip77.ParseNegMessage(string(reply)).(*nip77.ErrorEnvelope); !ok || e.SubscriptionID != id || e.Reason != wantReason {
				t.Fatalf("go-nostr's nip77 reads %s as %v, want NEG-ERR", reply, e)
			}
		} else if env := nostr.ParseMessage(string(reply)); env == nil || env.Label() != want[0] {
			t.Fatalf("go-nostr reads %s as %v, want %s", reply, env, want[0])
		}

		wait := time.Duration(waitMs) * time.Millisecond
		rl := AppendRateLimited(nil, fr, wait)
		if via := AppendRefusal(nil, fr, RateLimitedReason(wait)); !bytes.Equal(rl, via) {
			t.Fatalf("AppendRateLimited %s != AppendRefusal %s", rl, via)
		}
		if !json.Valid(rl) || !json.Valid(AppendRefusal(nil, fr, ReasonUnavailable)) {
			t.Fatalf("invalid JSON from the specialised forms: %s", rl)
		}
	})
}
