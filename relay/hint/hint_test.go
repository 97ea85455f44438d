package hint

import (
	"fmt"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		msg     string
		wait    time.Duration
		limited bool
	}{
		{"rate-limited: slow down; retry in 18s", 18 * time.Second, true},
		{"msg: rate-limited: slow down; retry in 1s", time.Second, true}, // go-nostr's Publish error
		{"  rate-limited: read budget spent; retry in 4s", 4 * time.Second, true},
		{"rate-limited: retry in 3s, or retry in 7s", 7 * time.Second, true}, // the last one
		{"rate-limited: retry in 7s; said retry in 0s", 7 * time.Second, true},
		{"rate-limited: slow down", 0, true},
		{"rate-limited: retry in 0s", 0, true},       // never 0: not a hint
		{"rate-limited: retry in 5seconds", 0, true}, // not a hint
		{"rate-limited: retry in -5s", 0, true},
		{"rate-limited: retry in 1.5s", 0, true},
		{"rate-limited: retry in 99999999999999999999s", 0, true},
		{"rate-limited: retry in 86401s", 0, true}, // past a day
		{"rate-limited: retry in 86400s", 24 * time.Hour, true},
		{"error: rate limiter unavailable", 0, false},
		{"blocked: too many open subscriptions (at most 50); close one first", 0, false},
		{"invalid: retry in 5s", 0, false}, // a hint only counts on a rate limit
		{"", 0, false},
	} {
		wait, limited := Parse(tc.msg)
		if wait != tc.wait || limited != tc.limited {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", tc.msg, wait, limited, tc.wait, tc.limited)
		}
	}
}

func TestBackoff(t *testing.T) {
	var got []time.Duration
	var b time.Duration
	for range 8 {
		b = nextBackoff(b)
		got = append(got, b)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("backoffs %v, want %v", got, want)
	}
}

func ExampleParse() {
	wait, limited := Parse(`rate-limited: slow down; retry in 18s`)
	fmt.Println(wait, limited)
	wait, limited = Parse(`blocked: too many open subscriptions`)
	fmt.Println(wait, limited)
	// Output:
	// 18s true
	// 0s false
}
