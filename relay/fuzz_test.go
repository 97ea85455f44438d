package relay

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
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
	f := Peek(frame)
	if !bytes.Equal(frame, orig) {
		t.Fatalf("Peek modified its input")
	}
	checkFrame(t, frame, f)

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
	case TypeREQ, TypeCOUNT, TypeCLOSE:
		var want []byte
		if len(elems) > 1 && elems[1][0] == '"' && len(elems[1]) <= MaxSubIDLen && utf8.Valid(elems[1]) {
			want = elems[1]
		}
		if !bytes.Equal(f.ID, want) {
			t.Fatalf("Peek sub id %q, encoding/json %q, frame %q", f.ID, want, frame)
		}
	case TypeEVENT, TypeAUTH:
		if f.ID == nil {
			return
		}
		if len(elems) < 2 || elems[1][0] != '{' {
			t.Fatalf("Peek found id %s in a non-object, frame %q", f.ID, frame)
		}
		ids := topLevelIDs(t, elems[1])
		var id string
		_ = json.Unmarshal(f.ID, &id)
		found := false
		for _, v := range ids {
			found = found || v == id
		}
		if !found {
			t.Fatalf("Peek id %s is none of the top-level ids %q, frame %q", f.ID, ids, frame)
		}
	}
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
