package scan

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/sluice-relay/sluice/relay/wire"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"
)

// The differential tests hold Scan to its promise: a frame it calls
// canonical has one reading, so encoding/json and khatru (go-nostr's
// parsers, the relay sluice runs) must each read it as Scan did, and
// nothing in it may panic the relay.

// scanReasons is every reason Scan gives.
var scanReasons = map[string]bool{
	reasonNotNostr: true, reasonUnknownType: true, reasonNotUTF8: true, reasonShape: true,
	reasonEvent: true, reasonAuthKind: true, reasonEventKind: true, reasonSubID: true,
	reasonFilter: true, ReasonFilters: true, reasonCountOne: true, reasonNegentropy: true,
	reasonTagEmpty: true, reasonTagNoValue: true, reasonTags: true, reasonTagValue: true,
	reasonFilterValues: true, reasonFanout: true, reasonEventID: true,
}

// khatruParse reads frame as khatru v0.19.1 does (handlers.go, from line
// 149: the default message parser, then, for a label it does not know,
// nip77's), and reports a panic instead of crashing.
func khatruParse(frame []byte) (env nostr.Envelope, err error, panicked any) {
	defer func() {
		if p := recover(); p != nil {
			env, panicked = nil, fmt.Sprintf("%v\n%s", p, debug.Stack())
		}
	}()
	msg := string(frame)
	env, err = nostr.NewMessageParser().ParseMessage(msg)
	if err == nostr.UnknownLabel {
		env = nip77.ParseNegMessage(msg)
	}
	return env, err, nil
}

// scanElems is how many elements a canonical frame of type t with n
// filters has.
func scanElems(t wire.Type, n int) int {
	switch t {
	case wire.TypeREQ:
		return 2 + n
	case wire.TypeCOUNT, wire.TypeNEGMSG:
		return 3
	case wire.TypeNEGOPEN:
		return 4
	}
	return 2 // EVENT, AUTH, CLOSE, NEG-CLOSE
}

// jsonEvent is an event as encoding/json reads it (keys matched without
// case, as it does).
type jsonEvent struct {
	ID        string     `json:"id"`
	PubKey    string     `json:"pubkey"`
	CreatedAt int64      `json:"created_at"`
	Kind      int        `json:"kind"`
	Tags      [][]string `json:"tags"`
	Content   string     `json:"content"`
	Sig       string     `json:"sig"`
}

// checkScan is the differential property, for any frame.
func checkScan(t *testing.T, frame []byte) {
	t.Helper()
	orig := bytes.Clone(frame)
	f, reason := scanShape(frame, scanBounds)
	if !bytes.Equal(frame, orig) {
		t.Fatalf("Scan modified its input")
	}
	if want := Peek(frame).Type; f.typ != want {
		t.Fatalf("Scan type %v, Peek %v, frame %q", f.typ, want, frame)
	}
	if reason != "" {
		if !scanReasons[reason] {
			t.Fatalf("Scan reason %q is not one of the Reason constants", reason)
		}
		return
	}

	// The gate forwards it. Its facts are pieces of the frame.
	for name, b := range map[string][]byte{"SubID": f.SubID, "neg": f.neg, "iDLit": f.Event.iDLit, "Raw": f.Event.Raw, "Challenge": f.Event.Challenge, "Relay": f.Event.Relay} {
		if b != nil && !isSubSlice(frame, b) {
			t.Fatalf("%s %q is not a piece of the frame %q", name, b, frame)
		}
	}
	if f.Filters > scanMaxFilters {
		t.Fatalf("%d filters forwarded, the bound is %d: %q", f.Filters, scanMaxFilters, frame)
	}

	// (a) encoding/json reads the same message.
	if !json.Valid(frame) {
		t.Fatalf("forwarded frame is not valid JSON: %q", frame)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(frame, &elems); err != nil {
		t.Fatalf("encoding/json: %v, frame %q", err, frame)
	}
	if want := scanElems(f.typ, f.Filters); len(elems) != want {
		t.Fatalf("encoding/json reads %d elements, Scan's %v of %d filters has %d: %q", len(elems), f.typ, f.Filters, want, frame)
	}
	var label string
	if err := json.Unmarshal(elems[0], &label); err != nil || label != f.typ.String() {
		t.Fatalf("encoding/json label %q (%v), Scan %v: %q", label, err, f.typ, frame)
	}
	var sub string
	switch f.typ {
	case wire.TypeEVENT, wire.TypeAUTH:
		checkJSONEvent(t, frame, f, elems[1])
	default:
		if err := json.Unmarshal(elems[1], &sub); err != nil || f.SubID == nil || sub != string(f.SubID[1:len(f.SubID)-1]) {
			t.Fatalf("encoding/json sub id %q (%v), Scan %s: %q", sub, err, f.SubID, frame)
		}
	}
	switch f.typ {
	case wire.TypeREQ, wire.TypeCOUNT:
		for _, e := range elems[2:] {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(e, &m); err != nil || e[0] != '{' {
				t.Fatalf("encoding/json filter %s: %v, frame %q", e, err, frame)
			}
		}
	case wire.TypeNEGOPEN, wire.TypeNEGMSG:
		var neg string
		if err := json.Unmarshal(elems[len(elems)-1], &neg); err != nil || neg != string(f.neg) {
			t.Fatalf("encoding/json negentropy message %q (%v), Scan %q: %q", neg, err, f.neg, frame)
		}
	}

	// (b) khatru reads the same message.
	env, err, p := khatruParse(frame)
	if p != nil {
		t.Fatalf("khatru's parsers panic on a forwarded frame %q: %v", frame, p)
	}
	if env == nil {
		t.Fatalf("khatru cannot read a forwarded frame (%v): %q", err, frame)
	}
	if env.Label() != f.typ.String() {
		t.Fatalf("khatru reads %s, Scan %v: %q", env.Label(), f.typ, frame)
	}
	switch e := env.(type) {
	case *nostr.EventEnvelope:
		if e.SubscriptionID != nil {
			t.Fatalf("khatru reads a subscription id %q in %q", *e.SubscriptionID, frame)
		}
		checkGoNostrEvent(t, frame, f, &e.Event)
	case *nostr.AuthEnvelope:
		if e.Challenge != nil {
			t.Fatalf("khatru reads a challenge string %q in %q", *e.Challenge, frame)
		}
		checkGoNostrEvent(t, frame, f, &e.Event)
	case *nostr.ReqEnvelope:
		if e.SubscriptionID != sub || len(e.Filters) != f.Filters {
			t.Fatalf("khatru reads REQ %q with %d filters, Scan %s with %d: %q", e.SubscriptionID, len(e.Filters), f.SubID, f.Filters, frame)
		}
		for _, fl := range e.Filters {
			checkGoNostrFilter(t, frame, fl)
		}
	case *nostr.CountEnvelope:
		// A filter of the shape of a NIP-45 reply would make go-nostr
		// read a count instead of counting.
		if e.SubscriptionID != sub || e.Count != nil || f.Filters != 1 {
			t.Fatalf("khatru reads COUNT %q, count %v, Scan %s with %d filters: %q", e.SubscriptionID, e.Count, f.SubID, f.Filters, frame)
		}
		checkGoNostrFilter(t, frame, e.Filter)
	case *nostr.CloseEnvelope:
		if string(*e) != sub {
			t.Fatalf("khatru reads CLOSE %q, Scan %s: %q", string(*e), f.SubID, frame)
		}
	case *nip77.OpenEnvelope:
		if e.SubscriptionID != sub || e.Message != string(f.neg) {
			t.Fatalf("khatru reads NEG-OPEN %q %q, Scan %s %q: %q", e.SubscriptionID, e.Message, f.SubID, f.neg, frame)
		}
		checkGoNostrFilter(t, frame, e.Filter)
	case *nip77.MessageEnvelope:
		if e.SubscriptionID != sub || e.Message != string(f.neg) {
			t.Fatalf("khatru reads NEG-MSG %q %q, Scan %s %q: %q", e.SubscriptionID, e.Message, f.SubID, f.neg, frame)
		}
	case *nip77.CloseEnvelope:
		if e.SubscriptionID != sub {
			t.Fatalf("khatru reads NEG-CLOSE %q, Scan %s: %q", e.SubscriptionID, f.SubID, frame)
		}
	default:
		t.Fatalf("khatru reads %T, Scan %v: %q", env, f.typ, frame)
	}

	// (c) khatru's negentropy survives the message, and reads it whole.
	if f.typ == wire.TypeNEGOPEN || f.typ == wire.TypeNEGMSG {
		checkReconcile(t, string(f.neg))
	}
}

// checkJSONEvent compares the event encoding/json reads with Scan's.
func checkJSONEvent(t *testing.T, frame []byte, f Facts, raw json.RawMessage) {
	t.Helper()
	if !bytes.Equal(raw, f.Event.Raw) {
		t.Fatalf("encoding/json's event %q, Scan's Raw %q", raw, f.Event.Raw)
	}
	// Exactly the seven keys, once each, whatever the decoder's folding.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil || len(keys) != 7 {
		t.Fatalf("encoding/json reads %d keys (%v) in %q", len(keys), err, frame)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var ev jsonEvent
	if err := dec.Decode(&ev); err != nil {
		t.Fatalf("encoding/json cannot read the event: %v, frame %q", err, frame)
	}
	if ev.ID != f.Event.ID.String() || ev.PubKey != f.Event.Pubkey.String() || ev.Kind != f.Event.Kind || ev.CreatedAt != f.Event.CreatedAt {
		t.Fatalf("encoding/json reads id %s pubkey %s kind %d created_at %d; Scan %s %s %d %d: %q",
			ev.ID, ev.PubKey, ev.Kind, ev.CreatedAt, f.Event.ID, f.Event.Pubkey, f.Event.Kind, f.Event.CreatedAt, frame)
	}
	if string(f.Event.iDLit) != `"`+ev.ID+`"` {
		t.Fatalf("iDLit %s, id %s", f.Event.iDLit, ev.ID)
	}
}

// checkGoNostrEvent compares the event khatru reads with Scan's, and for
// AUTH the first challenge and relay tags, as nip42 finds them.
func checkGoNostrEvent(t *testing.T, frame []byte, f Facts, ev *nostr.Event) {
	t.Helper()
	if len(ev.Tags) > wire.DefaultBounds().MaxTags {
		t.Fatalf("go-nostr reads %d tags, the bound is %d: %.200q", len(ev.Tags), wire.DefaultBounds().MaxTags, frame)
	}
	for _, tag := range ev.Tags {
		letter := len(tag) > 0 && len(tag[0]) == 1 && isLetter(tag[0][0])
		switch {
		case len(tag) == 0:
			t.Fatalf("go-nostr reads an empty tag in a forwarded event: %.200q", frame)
		case letter && len(tag) < 2:
			t.Fatalf("go-nostr reads the one-letter tag %q without a value: %.200q", tag, frame)
		case letter && len(tag[1]) > wire.DefaultBounds().MaxTagValueBytes:
			// Scan bounds the value as written, so the decoded one can
			// only be shorter.
			t.Fatalf("go-nostr reads a %d-byte %s value: %.200q", len(tag[1]), tag[0], frame)
		}
	}
	if ev.ID != f.Event.ID.String() || ev.PubKey != f.Event.Pubkey.String() || ev.Kind != f.Event.Kind || int64(ev.CreatedAt) != f.Event.CreatedAt {
		t.Fatalf("khatru reads id %s pubkey %s kind %d created_at %d; Scan %s %s %d %d: %q",
			ev.ID, ev.PubKey, ev.Kind, ev.CreatedAt, f.Event.ID, f.Event.Pubkey, f.Event.Kind, f.Event.CreatedAt, frame)
	}
	checkID(t, frame, f, ev)
	if f.typ != wire.TypeAUTH {
		if f.Event.Challenge != nil || f.Event.Relay != nil {
			t.Fatalf("EVENT with AUTH tags in its facts: %q", frame)
		}
		return
	}
	for _, tag := range []struct {
		name string
		lit  []byte
	}{{"challenge", f.Event.Challenge}, {"relay", f.Event.Relay}} {
		found := ev.Tags.Find(tag.name)
		if (found == nil) != (tag.lit == nil) {
			t.Fatalf("go-nostr's first %s tag %q, Scan's %s: %q", tag.name, found, tag.lit, frame)
		}
		if found == nil {
			continue
		}
		// Scan's literal decodes to go-nostr's value, when it is one the
		// gate can compare at all (Unquote refuses escapes outside ASCII).
		buf := make([]byte, 0, len(tag.lit))
		if v, ok := Unquote(buf, tag.lit); ok && string(v) != found[1] {
			t.Fatalf("go-nostr's first %s is %q, Scan's %s: %q", tag.name, found[1], tag.lit, frame)
		}
	}
}

// checkReconcile runs msg through go-nostr's server side, as khatru does
// for NEG-OPEN and NEG-MSG, over small non-empty sets (one past the size
// where go-nostr splits ranges into fingerprints): it must neither panic
// nor fail, since checkNegentropy accepted it.
func checkReconcile(t *testing.T, msg string) {
	t.Helper()
	for _, n := range []int{3, 40} {
		_, err, p, stack := serverReconcile(negVector(negRange(0, n, nil)), msg)
		if p != nil {
			t.Fatalf("go-nostr's Reconcile panics on %q (%d items): %v\n%s", msg, n, p, stack)
		}
		if err != nil {
			t.Fatalf("go-nostr's Reconcile fails on %q (%d items), which checkNegentropy accepts: %v", msg, n, err)
		}
	}
}

// scanSeeds are the frames that seed FuzzScanDifferential and that
// TestScanDifferential checks: the table tests, Peek's hostile frames,
// and frames go-nostr writes.
func scanSeeds() []string {
	var seeds []string
	for _, c := range scanCanonical {
		seeds = append(seeds, c.frame)
	}
	for _, h := range scanHostile {
		seeds = append(seeds, h.frame)
	}
	seeds = append(seeds, hostileFrames...)
	seeds = append(seeds,
		`["NEG-OPEN","s",{},"`+negPanicWrap+`"]`,
		`["NEG-MSG","s","`+negPanicHugeLength+`"]`,
		`["REQ","s",{"kinds":[1]}]  `,
		`["COUNT","s",{"#e":["x"],"#E":["y"]}]`,
	)
	return seeds
}

// TestScanDifferential runs the property over every seed, large ones
// included, without -fuzz.
func TestScanDifferential(t *testing.T) {
	for _, s := range scanSeeds() {
		checkScan(t, []byte(s))
	}
}

func FuzzScanDifferential(f *testing.F) {
	for _, s := range scanSeeds() {
		if len(s) <= 2048 { // the large ones only slow the minimizer down
			f.Add([]byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		checkScan(t, frame)
	})
}

// negSeeds are go-nostr's own messages from a few reconciliations, and
// the hostile ones of the table test.
func negSeeds(tb testing.TB) []string {
	var seeds []string
	for _, tc := range []struct {
		client, server []int
		limit          int
	}{
		{negRange(0, 5, nil), negRange(2, 9, nil), 1 << 16},
		{negRange(0, 60, func(i int) bool { return i%3 != 0 }), negRange(0, 60, func(i int) bool { return i%4 != 0 }), 4096},
	} {
		msgs, _, _, err := reconcile(tc.client, tc.server, tc.limit)
		if err != nil {
			tb.Fatal(err)
		}
		seeds = append(seeds, msgs...)
	}
	return append(seeds, "", "61", "6100000200", negPanicReadBound, negPanicHugeLength, negPanicWrap, negPanicBigDelta,
		"61"+negVarint(1<<62+1)+"0000"+negVarint(1<<62+1)+"0000"+"01000200")
}

// FuzzCheckNegentropy: whatever checkNegentropy accepts, go-nostr's
// server reads without a panic or an error. Each input is tried as it is
// and hex-encoded, so the fuzzer mutates both the message's bytes and its
// hex.
func FuzzCheckNegentropy(f *testing.F) {
	for _, s := range negSeeds(f) {
		f.Add([]byte(s))
		if b, err := hex.DecodeString(s); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, msg := range [][]byte{data, []byte(hex.EncodeToString(data)), []byte(negBuild(data))} {
			if checkNegentropy(msg) {
				checkReconcile(t, string(msg))
			}
		}
	})
}

// negBuild reads data as a recipe for a message of ranges that are
// well-formed byte by byte (the version, then bounds of any timestamp
// varint of up to 9 bytes, id prefixes of 0 to 33 bytes, modes 0 to 3
// with their payloads, ids from the test vectors' or any), so that
// FuzzCheckNegentropy spends its time on what checkNegentropy may
// accept: sums of timestamps, bounds after the infinite one, ids the
// server has.
func negBuild(data []byte) string {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	bytesOf := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = next()
		}
		return hex.EncodeToString(b)
	}
	var w strings.Builder
	w.WriteString("61")
	for len(data) > 0 {
		var ts uint64
		for range next() % 10 { // 0 bytes: the infinite bound
			ts = ts<<7 | uint64(next()&0x7f)
		}
		w.WriteString(negVarint(ts))
		n := int(next() % 34)
		w.WriteString(negVarint(uint64(n)))
		if c := next(); c < 128 && n <= 32 {
			w.WriteString(negID(int(c))[:2*n]) // a prefix of an id the server may have
		} else {
			w.WriteString(bytesOf(n))
		}
		mode := next() % 4
		w.WriteString(negVarint(uint64(mode)))
		switch mode {
		case 1:
			w.WriteString(bytesOf(16))
		case 2:
			count := int(next() % 4)
			w.WriteString(negVarint(uint64(count)))
			for range count {
				if c := next(); c < 128 {
					w.WriteString(negID(int(c)))
				} else {
					w.WriteString(bytesOf(32))
				}
			}
		}
	}
	return w.String()
}

// TestScanFuzzCorpora keeps the committed seed corpora from silently
// disappearing: go test runs each file as a case of its fuzz test.
func TestScanFuzzCorpora(t *testing.T) {
	for _, name := range []string{"FuzzScanDifferential", "FuzzCheckNegentropy"} {
		files, err := filepath.Glob(filepath.Join("testdata", "fuzz", name, "*"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no seed corpus in testdata/fuzz/%s: %v", name, err)
		}
		for _, file := range files {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(b), "go test fuzz v1\n[]byte(") {
				t.Errorf("%s is not a go test fuzz v1 file of one []byte", file)
			}
		}
	}
}

// checkGoNostrFilter checks a filter Scan forwarded against the bounds as
// go-nostr reads it: values per field, and the index scans eventstore's
// badger planner opens for it (plannerFanout).
func checkGoNostrFilter(t *testing.T, frame []byte, fl nostr.Filter) {
	t.Helper()
	fields := map[string]int{"ids": len(fl.IDs), "authors": len(fl.Authors), "kinds": len(fl.Kinds)}
	for k, v := range fl.Tags {
		fields["#"+k] = len(v)
	}
	for name, n := range fields {
		if n > wire.DefaultBounds().MaxFilterValues {
			t.Fatalf("go-nostr reads %d %s, the bound is %d: %.200q", n, name, wire.DefaultBounds().MaxFilterValues, frame)
		}
	}
	if n := plannerFanout(fl); n > wire.DefaultBounds().MaxFanout {
		t.Fatalf("eventstore's planner opens %d scans for a forwarded filter, the bound is %d: %.200q", n, wire.DefaultBounds().MaxFanout, frame)
	}
}

// plannerFanout is the most iterators eventstore v0.17.2's badger
// prepareQueries can open for fl, written from its source apart from
// Scan's counting: ChooseNarrowestTag's ranking is run over every order of
// two keys by taking, among the keys of the best rank, the most values.
func plannerFanout(fl nostr.Filter) int {
	if len(fl.IDs) > 0 {
		return len(fl.IDs)
	}
	rank := func(k string) int {
		switch k {
		case "e", "E", "q":
			return 9
		case "a", "A", "i", "I", "g", "r":
			return 8
		case "d":
			if len(fl.Authors) > 0 {
				return 7
			}
			return 4
		case "h", "t", "l", "k", "K":
			return 6
		case "p":
			return 2
		}
		return 0
	}
	if len(fl.Tags) > 0 {
		best, most := 0, 0
		for k := range fl.Tags {
			best = max(best, rank(k))
		}
		for k, v := range fl.Tags {
			if rank(k) >= 3 || best < 3 {
				most = max(most, len(v))
			}
		}
		if best >= 3 || len(fl.Authors) == 0 && len(fl.Kinds) == 0 {
			return most
		}
	}
	switch {
	case len(fl.Authors) > 0 && len(fl.Kinds) > 0:
		return len(fl.Authors) * len(fl.Kinds)
	case len(fl.Authors) > 0:
		return len(fl.Authors)
	case len(fl.Kinds) > 0:
		return len(fl.Kinds)
	}
	return 1
}

// checkID holds Scan's id check to go-nostr's (khatru's): the frame's id
// matches exactly when it is go-nostr's hash of the event khatru reads,
// and the frame with go-nostr's hash written in as its id is canonical.
func checkID(t *testing.T, frame []byte, f Facts, ev *nostr.Event) {
	t.Helper()
	want := ev.GetID()
	if got := f.Event.idMatches(); got != (want == ev.ID) {
		t.Fatalf("Scan's id check says %v, go-nostr's hash is %s, the id %s: %q", got, want, ev.ID, frame)
	}
	fixed := bytes.Clone(frame)
	at := bytes.Index(frame, f.Event.iDLit) + 1
	copy(fixed[at:at+64], want)
	if _, reason := Scan(fixed, scanBounds); reason != "" {
		t.Fatalf("Scan refuses the event under go-nostr's hash %s: %q; frame %q", want, reason, fixed)
	}
}
