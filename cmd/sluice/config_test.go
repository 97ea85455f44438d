package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

const examplePath = "../../sluice.example.yaml"

// TestExampleIsTheDefault holds sluice.example.yaml and the built-in
// defaults equal, field for field: the file documents what sluice runs on.
func TestExampleIsTheDefault(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	// Parse over an empty config, not over the defaults, so that a field
	// missing from the file shows up as a difference.
	got, err := parseConfigOver(fileConfig{}, data)
	if err != nil {
		t.Fatalf("example does not parse: %v", err)
	}
	want := defaultFileConfig()
	got.at = nil // where the file sets each field, which the defaults do not have
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sluice.example.yaml differs from the defaults:\n got %+v\nwant %+v", got, want)
		for label := range want.Limits.Message {
			if !reflect.DeepEqual(got.Limits.Message[label], want.Limits.Message[label]) {
				t.Errorf("limits.message.%s differs", label)
			}
		}
	}
	if _, err := got.validate(); err != nil {
		t.Errorf("example does not validate: %v", err)
	}
}

// TestDefaultLimitsAreTheGates: the binary's defaults are the library's.
func TestDefaultLimitsAreTheGates(t *testing.T) {
	fc := defaultFileConfig()
	cfg, err := fc.validate()
	if err != nil {
		t.Fatal(err)
	}
	if want := policy.DefaultLimits(); !sameLimits(cfg.Limits, want) {
		t.Errorf("default limits\n got %+v\nwant %+v", cfg.Limits, want)
	}
	if cfg.ReadLimit != (relay.Options{}).Resolved().ReadLimit || cfg.Identity.IPv6Prefix != 64 ||
		cfg.QuotaEvents != 600 || cfg.QuotaWindow != time.Minute || cfg.QuotaUnlimited || cfg.Redis != "" {
		t.Errorf("defaults: %+v", cfg)
	}
}

// sameLimits compares limits with nil and empty windows equal (both free).
func sameLimits(a, b policy.Limits) bool {
	same := func(x, y []ratelimit.Limit) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i].Rate != y[i].Rate || x[i].Period != y[i].Period || x[i].EffectiveCost() != y[i].EffectiveCost() {
				return false
			}
		}
		return true
	}
	if !same(a.Connection, b.Connection) {
		return false
	}
	for t := range a.Message {
		if !same(a.Message[t], b.Message[t]) {
			return false
		}
	}
	return true
}

// TestShapeDefaults: max_filters, frame_size and relay_url default to
// what the gate does with its zero Options: wire.DefaultBounds().MaxFilters,
// relay.Options.Resolved for every type, and the host the client used.
func TestShapeDefaults(t *testing.T) {
	fc := defaultFileConfig()
	cfg, err := fc.validate()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxFilters != wire.DefaultBounds().MaxFilters {
		t.Errorf("MaxFilters = %d, want wire.DefaultBounds().MaxFilters %d", cfg.MaxFilters, wire.DefaultBounds().MaxFilters)
	}
	if cfg.FrameSize != ([wire.NumTypes]int{}) {
		t.Errorf("FrameSize = %v, want all 0 (relay.Options.Resolved)", cfg.FrameSize)
	}
	if cfg.RelayURL != "" {
		t.Errorf("RelayURL = %q, want \"\"", cfg.RelayURL)
	}
	if cfg.Subscriptions != (relay.Options{}).Resolved().MaxSubscriptions || cfg.MaxConnections != (relay.Options{}).Resolved().MaxConnections {
		t.Errorf("Subscriptions %d MaxConnections %d, want the relay defaults", cfg.Subscriptions, cfg.MaxConnections)
	}
}

// TestCapFields: limits.subscriptions, max_connections and max_filter_bytes reach the
// config, and out-of-range values are refused with the field named.
func TestCapFields(t *testing.T) {
	cfg, err := parseAndValidate([]byte("limits: {subscriptions: 7, max_connections: 3, max_filter_bytes: 4096}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Subscriptions != 7 || cfg.MaxConnections != 3 || cfg.MaxFilterBytes != 4096 {
		t.Errorf("Subscriptions %d MaxConnections %d MaxFilterBytes %d", cfg.Subscriptions, cfg.MaxConnections, cfg.MaxFilterBytes)
	}
	for yaml, want := range map[string]string{
		"limits: {subscriptions: 0}":     "limits.subscriptions (line 1, column 10): must be between 1 and 10000, got 0",
		"limits: {subscriptions: 10001}": "limits.subscriptions (line 1, column 10): must be between 1 and 10000, got 10001",
		"limits: {max_connections: 0}":   "limits.max_connections (line 1, column 10): must be between 1 and 1000000, got 0",
		"limits: {max_connections: -1}":  "limits.max_connections (line 1, column 10): must be between 1 and 1000000, got -1",
		"limits: {max_connections: 1.5}": "limits.max_connections (line 1, column 27): expected a whole number, got !!float `1.5`",
		"limits: {subscriptions: many}":  "limits.subscriptions (line 1, column 25): expected a whole number, got !!str `many`",
		"limits: {max_filter_bytes: 0}":  "limits.max_filter_bytes (line 1, column 10): must be between 1 and 1073741824, got 0",
	} {
		_, err := parseAndValidate([]byte(yaml))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", yaml, err, want)
		}
	}
}

// TestShapeFields: max_filters, frame_size and relay_url reach the config
// as written; a type left out of frame_size keeps its default (0).
func TestShapeFields(t *testing.T) {
	cfg, err := parseAndValidate([]byte(`
relay_url: wss://relay.example.com/nostr
read_limit: 131072
limits:
  max_filters: 25
  max_event_tags: 500
  max_tag_value_bytes: 256
  max_filter_values: 1000
  max_filter_fanout: 20000
  frame_size: {EVENT: 131072, REQ: 4096, AUTH: 2048, NEG-CLOSE: 64}
`))
	if err != nil {
		t.Fatal(err)
	}
	if want := (wire.Bounds{MaxTags: 500, MaxTagValueBytes: 256, MaxFilterValues: 1000, MaxFanout: 20000}); cfg.Bounds != want {
		t.Errorf("Bounds = %+v, want %+v", cfg.Bounds, want)
	}
	if cfg.RelayURL != "wss://relay.example.com/nostr" || cfg.MaxFilters != 25 {
		t.Errorf("relay_url %q max_filters %d", cfg.RelayURL, cfg.MaxFilters)
	}
	var want [wire.NumTypes]int
	want[wire.TypeEVENT], want[wire.TypeREQ], want[wire.TypeAUTH], want[wire.TypeNEGCLOSE] = 131072, 4096, 2048, 64
	if cfg.FrameSize != want {
		t.Errorf("FrameSize = %v, want %v", cfg.FrameSize, want)
	}
	// What the gate is built with must build, and NIP-11 states what it
	// enforces: the default REQ window (50/1s) admits the 25 filters at
	// once.
	pc, err := buildPolicy(cfg, localQuotas(nil))
	if err != nil {
		t.Fatal(err)
	}
	opts := gateOptions(cfg, pc)
	if _, err := relay.New(opts); err != nil {
		t.Fatalf("relay.New refuses the config: %v", err)
	}
	if got := nip11Limitation(cfg, pc).MaxFilters; got != 25 {
		t.Errorf("NIP-11 max_filters = %d, want 25 (REQ 50/1s admits them)", got)
	}
}

// TestQueuedBytes: limits.max_queued_bytes reaches relay.Options.QueueBytes
// (default (relay.Options{}).Resolved().QueueBytes), and a value the gate would not hold
// is refused with the field named.
func TestQueuedBytes(t *testing.T) {
	for yaml, want := range map[string]int{"": (relay.Options{}).Resolved().QueueBytes, "limits: {max_queued_bytes: 65536}": 64 << 10, "limits: {max_queued_bytes: 33554432}": 32 << 20} {
		cfg, err := parseAndValidate([]byte(yaml))
		if err != nil {
			t.Fatalf("%q: %v", yaml, err)
		}
		pc, _ := buildPolicy(cfg, localQuotas(nil))
		if got := gateOptions(cfg, pc).QueueBytes; got != want {
			t.Errorf("%q: Options.QueueBytes %d, want %d", yaml, got, want)
		}
	}
	for yaml, want := range map[string]string{
		"limits: {max_queued_bytes: 65535}":      "limits.max_queued_bytes (line 1, column 10): must be between 65536 and 1073741824, got 65535",
		"limits: {max_queued_bytes: 0}":          "limits.max_queued_bytes (line 1, column 10): must be between 65536 and 1073741824, got 0",
		"limits: {max_queued_bytes: 1073741825}": "limits.max_queued_bytes (line 1, column 10): must be between 65536 and 1073741824, got 1073741825",
		"limits: {max_queued_bytes: 4MiB}":       "limits.max_queued_bytes (line 1, column 28): expected a whole number, got !!str `4MiB`",
	} {
		if _, err := parseAndValidate([]byte(yaml)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", yaml, err, want)
		}
	}
}

func TestOverlay(t *testing.T) {
	fc, err := parseConfig([]byte(`
limits:
  message:
    EVENT: [{rate: 5, period: 2s, cost: 2}]
    CLOSE: [{rate: 100, period: 1s}]
    AUTH: []
quota: {unlimited: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := fc.validate()
	if err != nil {
		t.Fatal(err)
	}
	def := policy.DefaultLimits()
	if got := cfg.Limits.Message[wire.TypeEVENT]; !reflect.DeepEqual(got, []ratelimit.Limit{{Rate: 5, Period: 2 * time.Second, Cost: 2}}) {
		t.Errorf("EVENT = %v, want the file's one window", got)
	}
	if got := cfg.Limits.Message[wire.TypeCLOSE]; len(got) != 1 {
		t.Errorf("CLOSE = %v, want the file's window", got)
	}
	if got := cfg.Limits.Message[wire.TypeAUTH]; len(got) != 0 {
		t.Errorf("AUTH = %v, want [] (free)", got)
	}
	if got := cfg.Limits.Message[wire.TypeREQ]; !reflect.DeepEqual(got, def.Message[wire.TypeREQ]) {
		t.Errorf("REQ = %v, want the default kept", got)
	}
	if !cfg.QuotaUnlimited || cfg.QuotaEvents != 600 {
		t.Errorf("quota: unlimited %v events %d", cfg.QuotaUnlimited, cfg.QuotaEvents)
	}
}

// TestHostileConfigs: every bad value is refused, and the message names
// the field a person has to fix.
func TestHostileConfigs(t *testing.T) {
	aliasBomb := "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n" +
		"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n" +
		"g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown top-level field", "lsiten: 127.0.0.1:1\n", "lsiten (line 1, column 1): unknown field"},
		{"unknown nested field", "store:\n  redis_url: x\n", "store.redis_url (line 2, column 3): unknown field"},
		{"unknown field in a window", "limits: {message: {EVENT: [{rate: 10, period: 1s, burst: 5}]}}", "limits.message.EVENT[0].burst (line 1, column 51): unknown field"},
		{"wrong type", "listen: [1, 2]\n", "listen (line 1, column 9): expected a string, got !!seq"},
		{"rate not a number", "limits: {message: {EVENT: [{rate: ten, period: 1s}]}}", "limits.message.EVENT[0].rate (line 1, column 35): expected a number, got !!str `ten`"},
		{"read_limit not an integer", "read_limit: 1.5\n", "read_limit (line 1, column 13): expected a whole number, got !!float `1.5`"},
		{"quota events not an integer", "quota: {events: 600.5}", "quota.events (line 1, column 17): expected a whole number, got !!float `600.5`"},
		{"ipv6 prefix a string", "identity:\n  ipv6_prefix: \"64\"\n", "identity.ipv6_prefix (line 2, column 16): expected a whole number, got !!str `64`"},
		// Booleans are true or false: yaml.v3 alone reads YAML 1.1's yes,
		// on, True into a bool, and "yes" turned the quota off.
		{"boolean yes", "quota:\n  unlimited: yes\n", "quota.unlimited (line 2, column 14): expected true or false, got !!str `yes`"},
		{"boolean on", "quota: {unlimited: on}", "quota.unlimited (line 1, column 20): expected true or false, got !!str `on`"},
		{"boolean True", "quota: {unlimited: True}", "quota.unlimited (line 1, column 20): expected true or false, got !!bool `True`"},
		{"boolean quoted", "quota: {unlimited: \"true\"}", "quota.unlimited (line 1, column 20): expected true or false, got !!str `true`"},
		{"boolean a number", "quota: {unlimited: 1}", "quota.unlimited (line 1, column 20): expected true or false, got !!int `1`"},
		// Both are bound at start-up: the second bind would fail.
		{"metrics on the listen port", "listen: 127.0.0.1:7777\nmetrics_listen: 127.0.0.1:7777\n", "metrics_listen (line 2, column 1): \"127.0.0.1:7777\" would bind the port of listen \"127.0.0.1:7777\": give metrics a port of its own (or \"\" to turn metrics off)"},
		{"metrics on every interface of the listen port", "listen: 127.0.0.1:7777\nmetrics_listen: 0.0.0.0:7777\n", "metrics_listen (line 2, column 1): \"0.0.0.0:7777\" would bind the port of listen \"127.0.0.1:7777\": give metrics a port of its own (or \"\" to turn metrics off)"},
		{"listen on every interface of the metrics port", "listen: \":9777\"\n", "metrics_listen: \"127.0.0.1:9777\" would bind the port of listen"},
		{"ipv6 wildcard covers ipv4", "listen: \"[::]:7777\"\nmetrics_listen: 127.0.0.1:7777\n", "would bind the port of listen"},
		{"rate equal to cost", "limits: {message: {EVENT: [{rate: 1, period: 1s}]}}", "limits.message.EVENT[0] (line 1, column 28): ratelimit: invalid limit: rate 1 must be greater than cost 1"},
		{"second window bad", "limits: {message: {EVENT: [{rate: 10, period: 1s}, {rate: 1, period: 60s}]}}", "limits.message.EVENT[1] (line 1, column 52): ratelimit: invalid limit: rate 1 must be greater than cost 1"},
		{"rate below cost", "limits: {connection: [{rate: 3, period: 1s, cost: 5}]}", "limits.connection[0] (line 1, column 23): ratelimit: invalid limit: rate 3 must be greater than cost 5"},
		{"cost zero", "limits: {message: {REQ: [{rate: 3, period: 1s, cost: 0}]}}", "limits.message.REQ[0].cost (line 1, column 48): must be greater than 0 (leave it out for the default, 1)"},
		{"cost negative", "limits: {message: {REQ: [{rate: 3, period: 1s, cost: -1}]}}", "limits.message.REQ[0] (line 1, column 26): ratelimit: invalid limit: cost -1 must be greater than 0"},
		{"rate missing", "limits: {message: {REQ: [{period: 1s}]}}", "limits.message.REQ[0].rate: is required"},
		{"period missing", "limits: {message: {REQ: [{rate: 5}]}}", "limits.message.REQ[0].period: is required"},
		{"period not a duration", "limits: {message: {REQ: [{rate: 5, period: 1}]}}", "limits.message.REQ[0].period (line 1, column 36): not a duration: \"1\" (write e.g. 1s, 100ms, 5m)"},
		{"period zero", "limits: {message: {REQ: [{rate: 5, period: 0s}]}}", "limits.message.REQ[0] (line 1, column 26): ratelimit: invalid limit: period 0s must be at least 1ms"},
		{"period negative", "limits: {message: {REQ: [{rate: 5, period: -1s}]}}", "limits.message.REQ[0] (line 1, column 26): ratelimit: invalid limit: period -1s must be at least 1ms"},
		{"period sub-millisecond", "limits: {message: {REQ: [{rate: 5, period: 1500us}]}}", "limits.message.REQ[0] (line 1, column 26): ratelimit: invalid limit: period 1.5ms must be a whole number of milliseconds"},
		{"period too long", "limits: {message: {REQ: [{rate: 5, period: 48h}]}}", "limits.message.REQ[0].period"},
		{"same period twice", "limits: {message: {REQ: [{rate: 5, period: 1s}, {rate: 9, period: 1000ms}]}}", "limits.message.REQ[1] (line 1, column 49): ratelimit: invalid limit: two limits with period 1s would share one key"},
		{"rate NaN", "limits: {message: {REQ: [{rate: .nan, period: 1s}]}}", "limits.message.REQ[0] (line 1, column 26): ratelimit: invalid limit: rate and cost must be finite numbers"},
		{"rate infinite", "limits: {message: {REQ: [{rate: .inf, period: 1s}]}}", "limits.message.REQ[0] (line 1, column 26): ratelimit: invalid limit: rate and cost must be finite numbers"},
		{"rate huge", "limits: {message: {REQ: [{rate: 1e300, period: 1s}]}}", "limits.message.REQ[0].rate (line 1, column 27): must be at most 1e+09, got 1e+300"},
		{"burst too large", "limits: {message: {REQ: [{rate: 1e9, period: 24h, cost: 1e-300}]}}", "limits.message.REQ[0] (line 1, column 26): rate/cost is +Inf; a burst can be at most 1e+09 messages"},
		{"interval too short", "limits: {message: {REQ: [{rate: 1e6, period: 1ms}]}}", "limits.message.REQ[0] (line 1, column 26): 1e+06/1ms allows more than a million messages a second; lower rate or raise period"},
		{"too many windows", "limits: {message: {REQ: [{rate: 5, period: 1s}, {rate: 5, period: 2s}, {rate: 5, period: 3s}, {rate: 5, period: 4s}, {rate: 5, period: 5s}, {rate: 5, period: 6s}, {rate: 5, period: 7s}, {rate: 5, period: 8s}, {rate: 5, period: 9s}]}}", "limits.message.REQ[8]"},
		{"many windows of one period", "limits: {message: {REQ: [" + strings.Repeat("{rate: 5, period: 1s},", 9) + "]}}", "limits.message.REQ[1]"},
		{"unknown type", "limits: {message: {EVNT: []}}", "limits.message.EVNT (line 1, column 20): unknown message type; known are EVENT, REQ, CLOSE, COUNT, AUTH, NEG-OPEN, NEG-MSG, NEG-CLOSE, OTHER"},
		{"lower-case type", "limits: {message: {event: []}}", "limits.message.event (line 1, column 20): unknown message type; known are EVENT, REQ, CLOSE, COUNT, AUTH, NEG-OPEN, NEG-MSG, NEG-CLOSE, OTHER"},
		{"catch-all free", "limits: {message: {OTHER: []}}", "limits.message.OTHER (line 1, column 20): must have at least one window: the catch-all bucket is never free"},
		{"null windows", "limits: {message: {EVENT: }}", "limits.message.EVENT (line 1, column 20): must be a list of windows; write [] to let EVENT pass free"},
		{"null message", "limits: {message: }", "limits.message (line 1, column 10): must be a mapping of message types to windows; leave it out to keep the defaults"},
		{"null connection", "limits: {connection: }", "limits.connection (line 1, column 10): must be a list of windows; write [] for no connection limit"},
		{"message not a map", "limits: {message: [1]}", "limits.message (line 1, column 19): expected a mapping, got !!seq"},
		{"max filters zero", "limits: {max_filters: 0}", "limits.max_filters (line 1, column 10): must be between 1 and 1000, got 0"},
		{"max event tags negative", "limits: {max_event_tags: -1}", "limits.max_event_tags (line 1, column 10): must be between 0 (its default) and 100000, got -1"},
		{"max filter fanout huge", "limits: {max_filter_fanout: 1000001}", "limits.max_filter_fanout (line 1, column 10): must be between 0 (its default) and 1000000, got 1000001"},
		{"max filters negative", "limits: {max_filters: -3}", "limits.max_filters (line 1, column 10): must be between 1 and 1000, got -3"},
		{"max filters too many", "limits: {max_filters: 1001}", "limits.max_filters (line 1, column 10): must be between 1 and 1000, got 1001"},
		{"max filters not an integer", "limits: {max_filters: 2.5}", "limits.max_filters (line 1, column 23): expected a whole number, got !!float `2.5`"},
		{"max filters a string", "limits:\n  max_filters: ten\n", "limits.max_filters (line 2, column 16): expected a whole number, got !!str `ten`"},
		{"frame size unknown type", "limits: {frame_size: {EVNT: 1024}}", "limits.frame_size.EVNT (line 1, column 23): unknown message type; known are EVENT, REQ, CLOSE, COUNT, AUTH, NEG-OPEN, NEG-MSG, NEG-CLOSE"},
		{"frame size lower-case type", "limits: {frame_size: {req: 1024}}", "limits.frame_size.req (line 1, column 23): unknown message type; known are EVENT, REQ, CLOSE, COUNT, AUTH, NEG-OPEN, NEG-MSG, NEG-CLOSE"},
		{"frame size of OTHER", "limits: {frame_size: {OTHER: 1024}}", "limits.frame_size.OTHER (line 1, column 23): OTHER frames are never forwarded; sizes are for EVENT, REQ, CLOSE, COUNT, AUTH, NEG-OPEN, NEG-MSG, NEG-CLOSE"},
		{"frame size too small", "limits: {frame_size: {CLOSE: 63}}", "limits.frame_size.CLOSE (line 1, column 23): must be at least 64 bytes, got 63"},
		{"frame size zero", "limits: {frame_size: {AUTH: 0}}", "limits.frame_size.AUTH (line 1, column 23): must be at least 64 bytes, got 0"},
		{"frame size negative", "limits: {frame_size: {REQ: -1}}", "limits.frame_size.REQ (line 1, column 23): must be at least 64 bytes, got -1"},
		{"frame size above read limit", "limits: {frame_size: {EVENT: 524289}}", "limits.frame_size.EVENT (line 1, column 23): 524289 bytes, want 0 (the default) to the read limit 524288"},
		{"frame size above a lowered read limit", "read_limit: 4096\nlimits: {frame_size: {NEG-MSG: 8192}}", "limits.frame_size.NEG-MSG (line 2, column 23): 8192 bytes, want 0 (the default) to the read limit 4096"},
		{"frame size not an integer", "limits: {frame_size: {EVENT: 1.5}}", "limits.frame_size.EVENT (line 1, column 30): expected a whole number, got !!float `1.5`"},
		{"frame size not a map", "limits: {frame_size: [1024]}", "limits.frame_size (line 1, column 22): expected a mapping, got !!seq"},
		{"relay url http", "relay_url: https://relay.example.com", "relay_url (line 1, column 1): must be a ws:// or wss:// URL with a host, got \"https://relay.example.com\""},
		{"relay url bare host", "relay_url: relay.example.com", "relay_url (line 1, column 1): must be a ws:// or wss:// URL with a host, got \"relay.example.com\""},
		{"relay url no host", "relay_url: \"wss://\"", "relay_url (line 1, column 1): must be a ws:// or wss:// URL with a host, got \"wss://\""},
		{"relay url credentials", "relay_url: \"wss://u:p@relay.example.com\"", "relay_url (line 1, column 1): must not carry credentials"},
		{"relay url query", "relay_url: \"wss://relay.example.com/?x=1\"", "relay_url (line 1, column 1): must have no query or fragment, got \"wss://relay.example.com/?x=1\""},
		{"relay url fragment", "relay_url: \"wss://relay.example.com/#x\"", "relay_url (line 1, column 1): must have no query or fragment, got \"wss://relay.example.com/#x\""},
		{"relay url garbage", "relay_url: \"wss://[::1\"", "relay_url (line 1, column 1): must be a ws:// or wss:// URL with a host, got \"wss://[::1\""},
		{"relay url not a string", "relay_url: [wss://a]", "relay_url (line 1, column 12): expected a string, got !!seq"},
		{"quota zero", "quota: {events: 0}", "quota.events (line 1, column 9): must be at least 1, got 0 (set quota.unlimited: true to turn the quota off)"},
		{"quota zero even when unlimited", "quota: {events: 0, unlimited: true}", "quota.events (line 1, column 9): must be at least 1, got 0 (set quota.unlimited: true to turn the quota off)"},
		{"quota too large", "quota: {events: 99999999999}", "quota.events (line 1, column 9): ratelimit: invalid quota: events 99999999999 must be at most 4194303"},
		{"quota negative", "quota: {events: -5}", "quota.events (line 1, column 9): must be at least 1, got -5 (set quota.unlimited: true to turn the quota off)"},
		{"quota window zero", "quota: {window: 0s}", "quota.window"},
		{"penalty threshold zero", "penalty: {enabled: true, threshold: 0}", "penalty.threshold"},
		{"penalty ban bad", "penalty: {ban: soon}", "penalty.ban"},
		{"penalty ban past max ban", "penalty: {enabled: true, ban: 2h, max_ban: 1h}", "penalty (line 1, column 1): max ban must be from the ban (2h0m0s) to 24h0m0s, got 1h0m0s"},
		{"penalty ban past max ban, off", "penalty: {ban: 2h, max_ban: 1h}", "penalty"},
		{"quota window empty", "quota: {window: \"\"}", "quota.window (line 1, column 9): is required (a duration such as 1s or 100ms)"},
		{"ipv6 prefix zero", "identity: {ipv6_prefix: 0}", "identity.ipv6_prefix (line 1, column 12): must be between 16 and 128, got 0"},
		{"ipv6 prefix too long", "identity: {ipv6_prefix: 129}", "identity.ipv6_prefix (line 1, column 12): must be between 16 and 128, got 129"},
		{"trusted proxy host bits", "identity: {trusted_proxies: [10.0.0.1/8]}", "identity.trusted_proxies[0] (line 1, column 30): \"10.0.0.1/8\" has host bits set (did you mean 10.0.0.0/8?)"},
		{"trusted proxy garbage", "identity: {trusted_proxies: [10.0.0.0/8, nonsense]}", "identity.trusted_proxies[1] (line 1, column 42): not an IP address or CIDR: \"nonsense\""},
		{"header with space", "identity: {header: \"X Forwarded\"}", "identity.header"},
		{"header empty", "identity: {header: \"\"}", "identity.header (line 1, column 12): must not be empty (X-Forwarded-For, X-Real-IP or another forwarding header)"},
		{"allow ip bad", "allow: {ips: [300.1.1.1]}", "allow.ips[0] (line 1, column 15): not an IP address or CIDR: \"300.1.1.1\""},
		{"allow pubkey short", "allow: {pubkeys: [abc]}", "allow.pubkeys[0] (line 1, column 19): must be 64 hex digits, got \"abc\""},
		{"allow pubkey not hex", "allow: {pubkeys: [" + strings.Repeat("g", 64) + "]}", "allow.pubkeys[0] (line 1, column 19): must be 64 hex digits, got \"gggggggggggggggggggggggggggggggggggggggggggggggggggggggggggggggg\""},
		{"allow ip bad, not the first", "allow: {ips: [10.0.0.0/8, \"2001:db8::/32\", 10.0.0.1/8]}", "allow.ips[2] (line 1, column 44): \"10.0.0.1/8\" has host bits set (did you mean 10.0.0.0/8?)"},
		{"allow bad npub", "allow: {pubkeys: [npub1qqqq]}", "allow.pubkeys[0] (line 1, column 19): not a valid npub: \"npub1qqqq\""},
		{"read limit tiny", "read_limit: 10", "read_limit (line 1, column 1): must be between 1024 and 67108864 bytes, got 10"},
		{"read limit huge", "read_limit: 1099511627776", "read_limit (line 1, column 1): must be between 1024 and 67108864 bytes, got 1099511627776"},
		{"max sync events zero", "max_sync_events: 0", "max_sync_events (line 1, column 1): must be between 1 and 16777216, got 0"},
		{"max sync events past the store's", "max_sync_events: 16777217", "max_sync_events (line 1, column 1): must be between 1 and 16777216, got 16777217"},
		{"log format", "log: {format: xml}", "log.format (line 1, column 7): must be text or json, got \"xml\""},
		{"log level", "log: {level: loud}", "log.level"},
		{"listen garbage", "listen: localhost", "listen (line 1, column 1): want host:port, got \"localhost\""},
		{"listen bad port", "listen: 127.0.0.1:99999", "listen (line 1, column 1): bad port in \"127.0.0.1:99999\""},
		{"metrics listen garbage", "metrics_listen: nope", "metrics_listen (line 1, column 1): want host:port, got \"nope\" (write \"\" to turn metrics off)"},
		{"data dir empty", "data_dir: \"\"", "data_dir (line 1, column 1): must not be empty"},
		{"upstream http", "upstream: http://127.0.0.1:7000", "upstream (line 1, column 1): must be a ws:// or wss:// URL with a host, got \"http://127.0.0.1:7000\""},
		{"upstream no host", "upstream: ws://", "upstream (line 1, column 1): must be a ws:// or wss:// URL with a host, got \"ws://\""},
		{"upstream credentials", "upstream: ws://u:p@h:1", "upstream (line 1, column 1): must not carry credentials"},
		{"redis scheme", "store: {redis: \"http://127.0.0.1:6379\"}", "store.redis"},
		{"redis password not echoed", "store: {redis: \"redis://u:hunter2@h:notaport/0\"}", "store.redis"},
		{"prefix empty", "store: {prefix: \"\"}", "store.prefix (line 1, column 9): must not be empty (the default is \"sluice:\")"},
		{"prefix with brace", "store: {prefix: \"a{b\"}", "store.prefix (line 1, column 9): redisstore: invalid configuration: prefix \"a{b\" must not contain '{' or '}' (the hash tag belongs to the client)"},
		{"timeout zero", "store: {timeout: 0s}", "store.timeout (line 1, column 9): must be between 1ms and 10s, got 0s"},
		{"timeout garbage", "store: {timeout: fast}", "store.timeout (line 1, column 9): not a duration: \"fast\" (write e.g. 1s, 100ms, 5m)"},
		{"timeout huge", "store: {timeout: 1h}", "store.timeout (line 1, column 9): must be between 1ms and 10s, got 1h0m0s"},
		{"timeout past a cluster's read timeout", "store: {redis: \"redis+cluster://h1:6379\", timeout: 2s}", "store.timeout (line 1, column 43): 2s is longer than the Redis client's read timeout (1s), which bounds every call: set read_timeout=2s in store.redis, or store.timeout to at most 1s"},
		{"timeout past a client's read timeout", "store: {redis: \"redis://h1:6379?read_timeout=50ms\"}", "store.timeout"},
		{"info name huge", "info: {name: " + strings.Repeat("n", 300) + "}", "info.name (line 1, column 8): must be at most 256 bytes"},
		{"info pubkey", "info: {pubkey: nope}", "info.pubkey"},
		{"two documents", "listen: 127.0.0.1:1\n---\nlisten: 127.0.0.1:2\n", "more than one YAML document"},
		{"duplicate key", "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n", "already defined"},
		{"not a mapping", "- a\n- b\n", "expected a mapping"},
		{"scalar document", "hello\n", "expected a mapping"},
		{"bad yaml", "listen: [\n", "line 1, column 9: sequence end token ']' not found"},
		{"tab indentation", "store:\n\tredis: x\n", "line 2, column 1: found character '\t' that cannot start any token (YAML does not allow tabs for indentation)"},
		{"alias bomb", aliasBomb, ""},
		{"too large", "listen: 127.0.0.1:1\n#" + strings.Repeat("x", maxConfigSize), "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseAndValidate([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("accepted: %+v", cfg)
			}
			if !errors.Is(err, errConfig) {
				t.Errorf("error %v does not wrap errConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error\n  %v\ndoes not contain\n  %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error repeats the password: %v", err)
			}
		})
	}
}

func parseAndValidate(data []byte) (*config, error) {
	fc, err := parseConfig(data)
	if err != nil {
		return nil, err
	}
	return fc.validate()
}

// TestGoodConfigs: valid but unusual configs are accepted.
func TestGoodConfigs(t *testing.T) {
	for _, y := range []string{
		"",
		"# only a comment\n",
		"listen: \"[::]:7777\"\nmetrics_listen: \"\"\n",
		"store: {redis: \"redis://127.0.0.1:6379/0\"}",
		"store: {redis: \"redis+sentinel://h1:26379,h2:26379/mymaster/0\"}",
		"store: {redis: \"redis+cluster://h1:6379,h2:6379\"}",
		"store: {redis: \"redis+cluster://h1:6379,h2:6379?read_timeout=2s\", timeout: 2s}",
		"store: {redis: \"rediss://u:p@h:6380/1\"}",
		"limits: {connection: [], message: {EVENT: [], REQ: [{rate: 1.5, period: 250ms, cost: 0.5}]}}",
		"limits: {message: {}}",
		"limits: {}",
		"limits:\n", // a null section keeps its defaults
		"identity:\nquota:\n",
		"identity: {ipv6_prefix: 48, trusted_proxies: [10.0.0.0/8, \"::1\", 192.168.1.1], header: X-Real-IP}",
		"relay_url: wss://relay.example\nallow: {ips: [203.0.113.0/24, \"2001:db8::/32\"], pubkeys: [" + strings.Repeat("Ab", 32) + "]}",
		"quota: {events: 1, window: 1s}",
		"upstream: wss://relay.example/path\n",
		"relay_url: wss://relay.example.com\n",
		"relay_url: \"ws://127.0.0.1:7777/nostr/\"\n",
		"limits: {max_filters: 1}",
		"limits: {max_filters: 1000}",
		"limits: {frame_size: {}}",
		"limits:\n  frame_size:\n", // null keeps the defaults, as {} does
		"read_limit: 1024\nlimits: {frame_size: {EVENT: 1024, CLOSE: 64}}",
		"quota: {unlimited: false}",
		// Ports of their own, or any free port, do not collide.
		"listen: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\n",
		"listen: 127.0.0.1:7777\nmetrics_listen: 127.0.0.2:7777\n",
		"listen: 0.0.0.0:7777\nmetrics_listen: \"[::1]:7777\"\n",
		"listen: 127.0.0.1:7777\nmetrics_listen: \"\"\n",
	} {
		if _, err := parseAndValidate([]byte(y)); err != nil {
			t.Errorf("%q refused: %v", y, err)
		}
	}
}

// TestQuotaUnlimited: only true turns the quota off.
func TestQuotaUnlimited(t *testing.T) {
	for y, want := range map[string]bool{"quota: {unlimited: true}": true, "quota: {unlimited: false}": false, "": false} {
		cfg, err := parseAndValidate([]byte(y))
		if err != nil {
			t.Fatalf("%q: %v", y, err)
		}
		if cfg.QuotaUnlimited != want {
			t.Errorf("%q: QuotaUnlimited %v, want %v", y, cfg.QuotaUnlimited, want)
		}
	}
}

// TestListenCollisionFromFlag: a collision made by a flag names the flag,
// and check refuses it (rather than passing it for start to fail on).
func TestListenCollisionFromFlag(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"check", "--metrics-listen", "127.0.0.1:7777"}, func(string) string { return "" }, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "would bind the port of listen") || !strings.Contains(errb.String(), "set by --metrics-listen") {
		t.Errorf("check with metrics on the listen port: exit %d\n%s", code, errb.String())
	}
}

// TestPrecedence: defaults < file < SLUICE_* < flags.
func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:1001\ndata_dir: /from/file\nstore: {redis: \"redis://file:6379\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"SLUICE_CONFIG":    path,
		"SLUICE_LISTEN":    "127.0.0.1:2002",
		"SLUICE_DATA_DIR":  "/from/env",
		"SLUICE_LOG_LEVEL": "debug",
		"SLUICE_REDIS":     "", // set but empty: ignored
		"SLUICE_RELAY_URL": "wss://env.example",
	}
	load := func(args ...string) *config {
		t.Helper()
		fs, fv := newFlagSet("relay", io.Discard)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig(fs, fv, func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	cfg := load()
	if cfg.Listen != "127.0.0.1:2002" || cfg.DataDir != "/from/env" || cfg.Redis != "redis://file:6379" || cfg.LogLevel != "debug" ||
		cfg.RelayURL != "wss://env.example" {
		t.Errorf("env over file: %+v", cfg)
	}
	cfg = load("--listen", "127.0.0.1:3003", "--redis", "")
	if cfg.Listen != "127.0.0.1:3003" || cfg.DataDir != "/from/env" || cfg.Redis != "" {
		t.Errorf("flags over env: listen %s data %s redis %q", cfg.Listen, cfg.DataDir, cfg.Redis)
	}
	env["SLUICE_CONFIG"] = filepath.Join(dir, "missing.yaml")
	fs, fv := newFlagSet("relay", io.Discard)
	_ = fs.Parse(nil)
	if _, err := loadConfig(fs, fv, func(k string) string { return env[k] }); !errors.Is(err, errConfig) {
		t.Errorf("missing config file: err %v", err)
	}
}

func TestRunExitCodes(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("limits: {message: {EVENT: [{rate: 10, period: 1s}, {rate: 1, period: 60s}]}}\n"), 0o600)
	// An allow-listed pubkey without relay_url: an AUTH for another relay
	// could be replayed (relay.Options.Validate names RelayURL); with it, fine.
	member := strings.Repeat("ab", 32)
	noURL, withURL := filepath.Join(dir, "nourl.yaml"), filepath.Join(dir, "url.yaml")
	os.WriteFile(noURL, []byte("allow: {pubkeys: ["+member+"]}\n"), 0o600)
	os.WriteFile(withURL, []byte("relay_url: wss://relay.example\nallow: {pubkeys: ["+member+"]}\n"), 0o600)
	tests := []struct {
		args     []string
		code     int
		out, err string
	}{
		{[]string{"check"}, exitOK, "EVENT       10/1s", ""},
		{[]string{"check", "--config", examplePath}, exitOK, "burst 240", ""},
		{[]string{"check", "--config", bad}, exitUsage, "", "limits.message.EVENT[1] (line 1, column 52): ratelimit: invalid limit: rate 1 must be greater than cost 1"},
		{[]string{"check", "--config", noURL}, exitUsage, "", "relay_url: must be the relay's public ws:// or wss:// URL when member tiers or allow-listed pubkeys grant budgets by NIP-42 pubkey"},
		{[]string{"check", "--config", withURL}, exitOK, "configuration OK", ""},
		{[]string{"check", "--nope"}, exitUsage, "", "flag provided but not defined"},
		{[]string{"check", "extra"}, exitUsage, "", "unexpected argument"},
		{[]string{"proxy"}, exitUsage, "", "--upstream"},
		{[]string{"relay", "--upstream", "ws://x:1"}, exitUsage, "", "flag provided but not defined"},
		{[]string{"frobnicate"}, exitUsage, "", "unknown command"},
		{nil, exitUsage, "", "Usage:"},
		{[]string{"help"}, exitOK, "sluice relay", ""},
		{[]string{"help", "proxy"}, exitOK, "-upstream", ""},
		{[]string{"help", "health"}, exitOK, "-url", ""},
		{[]string{"help", "nonesuch"}, exitUsage, "", `unknown command "nonesuch"`},
		{[]string{"relay", "--help"}, exitOK, "", "-data-dir"},
		{[]string{"version"}, exitOK, "sluice ", ""},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		code := run(context.Background(), tt.args, func(string) string { return "" }, &out, &errb)
		if code != tt.code || !strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.err) {
			t.Errorf("sluice %v: exit %d (want %d)\nstdout: %s\nstderr: %s\nwant stdout ∋ %q, stderr ∋ %q",
				tt.args, code, tt.code, out.String(), errb.String(), tt.out, tt.err)
		}
	}
}

// TestCheckPrintsEveryLimit: check prints a burst and a sustained rate for
// every configured window, and "free" for every free type.
func TestCheckPrintsEveryLimit(t *testing.T) {
	fc := defaultFileConfig()
	cfg, err := fc.validate()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printCheck(&out, cfg)
	s := out.String()
	windows := len(cfg.Limits.Connection)
	for _, ls := range cfg.Limits.Message {
		windows += len(ls)
	}
	if n := strings.Count(s, "sustained"); n < windows {
		t.Errorf("%d sustained lines for %d windows:\n%s", n, windows, s)
	}
	for _, want := range []string{
		"EVENT       10/1s     burst 10   sustained 6.58/s (one every 152ms)",
		"240/60s   burst 240  sustained 2.77/s (one every 361ms)",
		"together  burst 10   sustained 2.77/s",
		"CLOSE       free\n",
		"COUNT       20/1s     burst 20   sustained 13.5/s", // still aligned after a free type
		"quota: 600 validated events per actor per 60s",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("check output lacks %q:\n%s", want, s)
		}
	}
}

// TestCheckPrintsShape: check prints the filter bound (and that each
// filter is charged as one REQ), the frame size of every forwarded type
// and which URL an AUTH must name.
func TestCheckPrintsShape(t *testing.T) {
	check := func(yaml string) string {
		t.Helper()
		cfg, err := parseAndValidate([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		printCheck(&out, cfg)
		return out.String()
	}
	printed := func(s string, wants ...string) {
		t.Helper()
		for _, want := range wants {
			if !strings.Contains(s, want) {
				t.Errorf("check output lacks %q:\n%s", want, s)
			}
		}
	}
	s := check("")
	printed(s,
		"REQ: at most 10 filters (NIP-11 max_filters), each filter charged its price by shape (read cost, below), a REQ at most what its windows admit at once; COUNT: one filter\n",
		"largest frame forwarded, in bytes",
		"  EVENT      524288  (read_limit)\n",
		"  REQ        65536\n",
		"  CLOSE      1024\n",
		"  COUNT      65536\n",
		"  AUTH       16384\n",
		"  NEG-OPEN   524288  (read_limit)\n",
		"  NEG-MSG    524288  (read_limit)\n",
		"  NEG-CLOSE  1024\n",
		"open at once: at most 50 subscriptions per connection (NIP-11 max_subscriptions), 64 connections, 4 NIP-77 syncs and 524288 bytes of open REQs per client in this process\n",
		"NIP-42: an AUTH's relay tag must name the host the client connected to",
	)
	_, sizes, _ := strings.Cut(s, "largest frame forwarded")
	sizes, _, _ = strings.Cut(sizes, "quota:")
	if strings.Contains(sizes, "OTHER") {
		t.Errorf("check prints a frame size for OTHER, which is never forwarded:\n%s", s)
	}

	s = check(`
relay_url: wss://relay.example.com
read_limit: 200000
limits:
  max_filters: 50
  message: {REQ: [{rate: 20, period: 1s}, {rate: 8, period: 60s, cost: 2}]}
  frame_size: {EVENT: 100000, AUTH: 2048}
`)
	printed(s,
		// The windows cap a REQ's price, not its filters.
		"REQ: at most 50 filters (NIP-11 max_filters), each filter charged its price by shape (read cost, below), a REQ at most what its windows admit at once",
		"  EVENT      100000\n",
		"  AUTH       2048\n",
		"  NEG-MSG    200000  (read_limit)\n",
		"NIP-42: an AUTH's relay tag must name wss://relay.example.com\n",
	)
}

// FuzzParseConfig: no input makes the parser panic or hang, and whatever it
// accepts is a configuration the gate can run (every window valid).
func FuzzParseConfig(f *testing.F) {
	if data, err := os.ReadFile(examplePath); err == nil {
		f.Add(data)
	}
	for _, s := range []string{
		"", "listen: 127.0.0.1:1", "limits: {message: {EVENT: [{rate: 10, period: 1s}]}}",
		"limits: {message: {EVENT: [{rate: 1, period: 1s}]}}", "quota: {events: 0}",
		"a: &a [*a]", "limits: {message: {OTHER: [{rate: 2, period: 1ms, cost: 1.999999}]}}",
		"identity: {trusted_proxies: [\"::ffff:10.0.0.0/104\"]}",
		"limits: {max_filters: 7, frame_size: {EVENT: 64, REQ: 1024}}", "relay_url: wss://a.example/x",
		"read_limit: 1024\nlimits: {frame_size: {NEG-OPEN: 1024}}",
	} {
		f.Add([]byte(s))
	}
	lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(1), nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parseAndValidate(data)
		if err != nil {
			if !errors.Is(err, errConfig) {
				t.Fatalf("error does not wrap errConfig: %v", err)
			}
			return
		}
		if err := (&policy.Config{Limits: &cfg.Limits}).Validate(); err != nil {
			t.Fatalf("accepted limits the gate refuses: %v", err)
		}
		for _, ls := range append([][]ratelimit.Limit{cfg.Limits.Connection}, cfg.Limits.Message[:]...) {
			for _, l := range ls {
				if b := l.Burst(); b < 1 {
					t.Fatalf("accepted %v with burst %d", l, b)
				}
				if iv := l.Interval(); iv <= 0 {
					t.Fatalf("accepted %v with interval %v", l, iv)
				}
			}
		}
		if cfg.QuotaEvents < 1 || cfg.Identity.IPv6Prefix < 16 || cfg.ReadLimit < 1024 {
			t.Fatalf("accepted out-of-range values: %+v", cfg)
		}
		// What start-up builds from the config must build.
		if _, err := ratelimit.NewQuota(cfg.QuotaEvents, cfg.QuotaWindow); err != nil {
			t.Fatalf("accepted a quota NewQuota refuses: %v", err)
		}
		pc, err := buildPolicy(cfg, localQuotas(nil))
		if err != nil {
			t.Fatalf("accepted a config whose policy does not build: %v", err)
		}
		opts := gateOptions(cfg, pc)
		opts.Limiter = lim
		if _, err := relay.New(opts); err != nil {
			t.Fatalf("accepted a config relay.New refuses: %v", err)
		}
		if n := reqFilters(pc); n < 1 || n > cfg.MaxFilters {
			t.Fatalf("max_filters %d gave a gate bound of %d", cfg.MaxFilters, n)
		}
		for typ, n := range cfg.FrameSize {
			if n != 0 && (n < minFrameSize || int64(n) > cfg.ReadLimit || wire.Type(typ) == wire.TypeOther) {
				t.Fatalf("accepted frame_size %d for %v with read_limit %d", n, wire.Type(typ), cfg.ReadLimit)
			}
		}
	})
}

// TestBadOverrideNamesItsSource: a bad value from SLUICE_* or a flag is
// reported with the variable or flag that set it, and a missing config
// file says it is the config file.
func TestBadOverrideNamesItsSource(t *testing.T) {
	tests := []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"SLUICE_LISTEN": "7777"}, nil, `listen: want host:port, got "7777" (set by SLUICE_LISTEN)`},
		{map[string]string{"SLUICE_LISTEN": "7777"}, []string{"--listen", "x"}, `(set by --listen)`},
		{map[string]string{"SLUICE_REDIS": "nope"}, nil, "(set by SLUICE_REDIS)"},
		{map[string]string{"SLUICE_LOG_LEVEL": "loud"}, nil, "log.level: must be debug, info, warn or error, got \"loud\" (set by SLUICE_LOG_LEVEL)"},
		{map[string]string{"SLUICE_METRICS_LISTEN": "::1:9"}, nil, "(set by SLUICE_METRICS_LISTEN)"},
		{map[string]string{"SLUICE_RELAY_URL": "https://relay.example"}, nil, `relay_url: must be a ws:// or wss:// URL with a host, got "https://relay.example" (set by SLUICE_RELAY_URL)`},
		{map[string]string{"SLUICE_CONFIG": "/nonexistent/sluice.yaml"}, nil, "config file: open /nonexistent/sluice.yaml"},
	}
	for _, tt := range tests {
		fs, fv := newFlagSet("relay", io.Discard)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		_, err := loadConfig(fs, fv, func(k string) string { return tt.env[k] })
		if !errors.Is(err, errConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("env %v args %v: err %v, want it to contain %q", tt.env, tt.args, err, tt.want)
		}
	}
}

// TestKnownEnv: knownEnv (what the unknown-variable warning accepts) is
// exactly the set of variables loadConfig reads.
func TestKnownEnv(t *testing.T) {
	read := map[string]bool{}
	fs, fv := newFlagSet("proxy", io.Discard)
	_ = fs.Parse(nil)
	_, _ = loadConfig(fs, fv, func(k string) string { read[k] = true; return "" })
	for _, k := range knownEnv {
		if !read[k] {
			t.Errorf("knownEnv lists %s, which loadConfig does not read", k)
		}
		delete(read, k)
	}
	for k := range read {
		t.Errorf("loadConfig reads %s, missing from knownEnv (it would be warned about)", k)
	}
	got := unknownEnv([]string{"SLUICE_REDIS=redis://x", "SLUICE_REDIS_URL=redis://x", "PATH=/bin", "SLUICE_=1", "sluice_listen=x"})
	if want := []string{"SLUICE_REDIS_URL", "SLUICE_"}; !slices.Equal(got, want) {
		t.Errorf("unknownEnv = %v, want %v", got, want)
	}
}

// TestPenaltyEnabled: the penalty box is off unless enabled, and enabled
// with the defaults of the example file.
func TestPenaltyEnabled(t *testing.T) {
	cfg, err := parseAndValidate([]byte(""))
	if err != nil || cfg.Penalty != nil {
		t.Fatalf("default: %+v, %v; want no penalty box", cfg.Penalty, err)
	}
	cfg, err = parseAndValidate([]byte("penalty: {enabled: true, threshold: 4}"))
	if err != nil {
		t.Fatal(err)
	}
	want := ratelimit.Penalty{Threshold: 4, HalfLife: 10 * time.Minute, Ban: time.Minute, MaxBan: time.Hour}
	if cfg.Penalty == nil || *cfg.Penalty != want {
		t.Fatalf("enabled: %+v, want %+v", cfg.Penalty, want)
	}
	pc, _ := buildPolicy(cfg, func(string, int, time.Duration, bool) (ratelimit.ActorQuota, error) { return nil, nil })
	if pc.Penalty == nil || *pc.Penalty != want {
		t.Fatalf("policy: %+v", pc.Penalty)
	}
}
