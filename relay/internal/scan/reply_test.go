package scan

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip77"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// goldenWait is the wait of every golden rate-limited reply: 17.2s must be
// reported as 18s (rounded up), never 17s.
const goldenWait = 17200 * time.Millisecond

// refusalShapes lists one frame of every refusal shape, with the envelope a
// client must see and the id it must carry.
var refusalShapes = []struct {
	name  string
	frame string
	label string // envelope label of the reply
	id    string // decoded event or subscription id in the reply; "" for NOTICE
}{
	{"event-id", `["EVENT",` + goNostrEvent + `]`, "OK", testID},
	{"event-noid", `["EVENT",{"kind":1,"content":"no id here"}]`, "NOTICE", ""},
	{"auth", `["AUTH",{"kind":22242,"id":"` + testID + `","tags":[["relay","ws://x"],["challenge","c"]]}]`, "OK", testID},
	{"req", `["REQ","sub:1",{"kinds":[1],"limit":10}]`, "CLOSED", "sub:1"},
	{"req-escaped", `["REQ","q\"\\\u00e9\u2028",{}]`, "CLOSED", "q\"\\é\u2028"},
	{"req-noid", `["REQ",7,{}]`, "NOTICE", ""},
	{"count", `["COUNT","cnt",{"kinds":[3]}]`, "CLOSED", "cnt"},
	{"close", `["CLOSE","sub:1"]`, "NOTICE", ""},
	{"neg-open", `["NEG-OPEN","neg",{},"6100"]`, "NEG-ERR", "neg"},
	{"neg-msg", `["NEG-MSG","neg","6100"]`, "NEG-ERR", "neg"},
	{"neg-close", `["NEG-CLOSE","neg"]`, "NOTICE", ""},
	{"other", `["HELLO","world"]`, "NOTICE", ""},
}

func TestGolden(t *testing.T) {
	reasons := []struct {
		name   string
		reason string
		build  func(dst []byte, f Frame) []byte
	}{
		{"rate-limited", "rate-limited: slow down; retry in 18s", func(dst []byte, f Frame) []byte { return AppendRateLimited(dst, f, goldenWait) }},
		{"unavailable", ReasonUnavailable, func(dst []byte, f Frame) []byte { return AppendRefusal(dst, f, ReasonUnavailable) }},
	}
	for _, shape := range refusalShapes {
		for _, r := range reasons {
			name := shape.name + "." + r.name
			t.Run(name, func(t *testing.T) {
				f := Peek([]byte(shape.frame)).Frame()
				got := r.build([]byte("prefix:"), f)
				if !bytes.HasPrefix(got, []byte("prefix:")) {
					t.Fatalf("did not append to dst: %q", got)
				}
				got = got[len("prefix:"):]
				if via := AppendRefusal(nil, f, r.reason); !bytes.Equal(via, got) {
					t.Errorf("AppendRefusal = %s, specialised form = %s", via, got)
				}
				path := filepath.Join("testdata", "golden", name+".json")
				if *update {
					if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run go test ./relay -run TestGolden -update)", err)
				}
				if !bytes.Equal(got, bytes.TrimSuffix(want, []byte("\n"))) {
					t.Errorf("reply\n got %s\nwant %s", got, want)
				}
				checkEnvelope(t, got, shape.label, shape.id, r.reason)
			})
		}
	}
}

// checkEnvelope decodes reply with encoding/json and with go-nostr's parser
// and checks it is the expected envelope carrying id and reason.
func checkEnvelope(t *testing.T, reply []byte, label, id, reason string) {
	t.Helper()
	var arr []any
	if err := json.Unmarshal(reply, &arr); err != nil {
		t.Fatalf("encoding/json cannot decode %s: %v", reply, err)
	}
	var want []any
	switch label {
	case "OK":
		want = []any{"OK", id, false, reason}
	case "CLOSED", "NEG-ERR":
		want = []any{label, id, reason}
	case "NOTICE":
		want = []any{"NOTICE", reason}
	}
	gotJSON, _ := json.Marshal(arr)
	wantJSON, _ := json.Marshal(want)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("decoded %s, want %s", gotJSON, wantJSON)
	}

	if label == "NEG-ERR" {
		// NIP-77's envelopes are go-nostr's nip77 package's.
		e, ok := nip77.ParseNegMessage(string(reply)).(*nip77.ErrorEnvelope)
		if !ok || e.SubscriptionID != id || e.Reason != reason {
			t.Errorf("go-nostr's nip77 parsed %s as %#v, want NEG-ERR %q %q", reply, e, id, reason)
		}
		return
	}
	env := nostr.ParseMessage(string(reply))
	switch e := env.(type) {
	case *nostr.OKEnvelope:
		if label != "OK" || e.EventID != id || e.OK || e.Reason != reason {
			t.Errorf("go-nostr parsed %#v, want %s %q false %q", e, label, id, reason)
		}
	case *nostr.ClosedEnvelope:
		if label != "CLOSED" || e.SubscriptionID != id || e.Reason != reason {
			t.Errorf("go-nostr parsed %#v, want %s %q %q", e, label, id, reason)
		}
	case *nostr.NoticeEnvelope:
		if label != "NOTICE" || string(*e) != reason {
			t.Errorf("go-nostr parsed %#v, want %s %q", e, label, reason)
		}
	default:
		t.Errorf("go-nostr parsed %s as %T, want %s", reply, env, label)
	}
}

func TestRateLimitedReason(t *testing.T) {
	for _, tt := range []struct {
		wait time.Duration
		want string
	}{
		{0, "rate-limited: slow down; retry in 1s"},
		{-time.Second, "rate-limited: slow down; retry in 1s"},
		{time.Nanosecond, "rate-limited: slow down; retry in 1s"},
		{time.Second, "rate-limited: slow down; retry in 1s"},
		{time.Second + time.Nanosecond, "rate-limited: slow down; retry in 2s"},
		{17200 * time.Millisecond, "rate-limited: slow down; retry in 18s"},
		{18 * time.Second, "rate-limited: slow down; retry in 18s"},
		{time.Hour, "rate-limited: slow down; retry in 3600s"},
	} {
		if got := RateLimitedReason(tt.wait); got != tt.want {
			t.Errorf("RateLimitedReason(%v) = %q, want %q", tt.wait, got, tt.want)
		}
		if !strings.HasPrefix(tt.want, "rate-limited: ") {
			t.Fatal("NIP-01 prefix missing from the test itself")
		}
	}
	if strings.HasPrefix(ReasonUnavailable, "rate-limited:") || !strings.HasPrefix(ReasonUnavailable, "error: ") {
		t.Errorf("ReasonUnavailable = %q must use the error: prefix, never rate-limited:", ReasonUnavailable)
	}
}

// TestAppendRefusalEscapes checks that any reason, however hostile, leaves
// a reply that decodes back to that reason (invalid UTF-8 becoming U+FFFD,
// as encoding/json does).
func TestAppendRefusalEscapes(t *testing.T) {
	f := Peek([]byte(`["REQ","s"]`)).Frame()
	for _, reason := range []string{
		``, `plain`, `"quoted"`, `back\slash`, "nl\nnl", "cr\rtab\t", "\x00\x01\x1f\x7f",
		"é ü 🙂", "\u2028\u2029", "bad \xff\xfe utf8", "\xed\xa0\x80", "</script>&",
		strings.Repeat(`"\`, 100),
	} {
		reply := AppendRefusal(nil, f, reason)
		if !utf8.Valid(reply) {
			t.Errorf("reply for %q is not valid UTF-8: %q", reason, reply)
		}
		var arr []string
		if err := json.Unmarshal(reply, &arr); err != nil {
			t.Errorf("reply for %q does not decode: %v: %s", reason, err, reply)
			continue
		}
		want := strings.ToValidUTF8(reason, "\ufffd")
		// encoding/json replaces every invalid byte, ToValidUTF8 runs of them.
		var ref string
		b, _ := json.Marshal(reason)
		_ = json.Unmarshal(b, &ref)
		if len(arr) != 3 || arr[2] != ref {
			t.Errorf("reason %q came back as %q (want %q; collapsed %q)", reason, arr, ref, want)
		}
		if bytes.ContainsAny(reply, "\u2028\u2029") {
			t.Errorf("reply for %q carries a raw U+2028/U+2029", reason)
		}
	}
}

func TestAppendRefusalAllocs(t *testing.T) {
	f := Peek([]byte(`["EVENT",` + goNostrEvent + `]`)).Frame()
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf = AppendRateLimited(buf[:0], f, goldenWait) }); n != 0 {
		t.Errorf("AppendRateLimited allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { buf = AppendRefusal(buf[:0], f, "reason with \"quotes\"") }); n != 0 {
		t.Errorf("AppendRefusal allocates %v times", n)
	}
}

func BenchmarkAppendRefusal(b *testing.B) {
	event := Peek([]byte(`["EVENT",` + goNostrEvent + `]`)).Frame()
	req := Peek([]byte(`["REQ","sub:1",{}]`)).Frame()
	b.Run("EVENT-rate-limited", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 256)
		for b.Loop() {
			buf = AppendRateLimited(buf[:0], event, goldenWait)
		}
	})
	b.Run("REQ-unavailable", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 256)
		for b.Loop() {
			buf = AppendRefusal(buf[:0], req, ReasonUnavailable)
		}
	})
	b.Run("NOTICE-escaped-reason", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 256)
		for b.Loop() {
			buf = AppendRefusal(buf[:0], Frame{}, "reason with \"quotes\" and \n é")
		}
	})
}

func ExampleAppendRateLimited() {
	frame := []byte(`["REQ","feed",{"kinds":[1],"limit":20}]`)
	f := Peek(frame).Frame()
	fmt.Println(f.Type, string(f.ID))
	fmt.Println(string(AppendRateLimited(nil, f, 17200*time.Millisecond)))
	fmt.Println(string(AppendRefusal(nil, Peek([]byte(`["CLOSE","feed"]`)).Frame(), ReasonUnavailable)))
	// Output:
	// REQ "feed"
	// ["CLOSED","feed","rate-limited: slow down; retry in 18s"]
	// ["NOTICE","error: rate limiter unavailable"]
}

func ExamplePeek() {
	for _, frame := range []string{
		`["EVENT",{"id":"4376c65d2f232afbe9b882a35baa4f6fe8667c4e684749af565f981833ed6a65","kind":1}]`,
		` [ "\u0043OUNT" , "c1", {} ]`,
		`["event",{}]`,
		`["EVENT"`,
	} {
		f := Peek([]byte(frame)).Frame()
		fmt.Printf("%v id=%s\n", f.Type, f.ID)
	}
	// Output:
	// EVENT id="4376c65d2f232afbe9b882a35baa4f6fe8667c4e684749af565f981833ed6a65"
	// COUNT id="c1"
	// OTHER id=
	// OTHER id=
}

func TestRetrySeconds(t *testing.T) {
	tests := []struct {
		wait time.Duration
		want int64
	}{
		{-time.Second, 1},
		{0, 1},
		{time.Nanosecond, 1},
		{time.Millisecond, 1},
		{999 * time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + time.Nanosecond, 2},
		{17*time.Second + 1, 18},
		{18 * time.Second, 18},
		{time.Hour, 3600},
	}
	for _, tt := range tests {
		if got := RetrySeconds(tt.wait); got != tt.want {
			t.Errorf("RetrySeconds(%v) = %d, want %d", tt.wait, got, tt.want)
		}
	}
}
