package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
	"github.com/nbd-wtf/go-nostr/nip19"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// The file is read with github.com/goccy/go-yaml, chosen over
// go.yaml.in/yaml/v3 (the maintained fork of gopkg.in/yaml.v3) by trying
// both on the configs TestHostileConfigs refuses. Neither names the field
// of an error in its message, but goccy's parser gives every node its
// YAML path (node.GetPath(): "$.limits.message.EVENT[0].rate") and every
// error its token (line and column), so an error is placed by the node it
// belongs to; yaml/v3's errors are only strings with a line number in them
// ("line 7: cannot unmarshal !!str `ten` into float64"), which had to be
// matched back to the tree with regular expressions. goccy also refuses
// duplicate keys in its parser, unknown fields with Strict, and YAML 1.1's
// yes/on as booleans. What it does not do, and is done here: whole numbers
// (it truncates 1.5 into an int, as yaml/v3 does), numbers (it reads "10"
// into a float64, and a plain 1e9 as a string), true/false only (it takes True and TRUE), a null where a
// list of windows belongs (it keeps the default), a map overlaid on the
// default one (it replaces the map), a second document (both libraries
// decode the first and stop), and a byte order mark (goccy reads it as part
// of the first key). It reports the first error of a file, not all of them.
// A string field given an unquoted number gets YAML's reading of it
// (name: 1.10 is "1.1"): quote such strings.

// errConfig is wrapped by every configuration error, so main can tell a bad
// config (exit 2, message names the field) from a failure to run.
var errConfig = errors.New("config")

// maxConfigSize bounds what the parser reads: a config is a page of YAML,
// and a larger file is a mistake (or a file meant to exhaust memory).
const maxConfigSize = 1 << 20

// Bounds on values that are valid limits but not sane ones. A window
// longer than a day keeps keys alive for days; more windows than this per
// type is a config written by a loop; rates beyond a billion overflow the
// burst arithmetic long before they mean anything (use [] for "free").
const (
	maxWindows   = 8
	maxPeriod    = 24 * time.Hour
	maxRate      = 1e9
	maxTimeout   = 10 * time.Second
	maxReadLimit = 64 << 20
	// defaultMaxSyncEvents bounds the events one NIP-77 sync (NEG-OPEN)
	// covers in sluice relay. eventstore's badger backend otherwise allows
	// 16,777,216 and allocates its result slice at that size for every
	// NEG-OPEN, whatever matches: four syncs over a store of 1,000 events
	// took the heap 2.4–3.2 GB above idle, against 22 MB with this bound
	// (BenchmarkSyncCost; TestE2ESyncMemoryBounded holds sluice relay to
	// it). At 100,000, a sync over 100,000 stored events costs ~0.4 s of
	// CPU, and the session khatru keeps holds ~8 MB; a sync that matches
	// more covers the newest 100,000. Enough for one author's history or a feed's recent notes;
	// a mirror that syncs a whole relay raises it.
	defaultMaxSyncEvents = 100_000
	// maxMaxSyncEvents is the store's own bound.
	maxMaxSyncEvents = 16_777_216
	// maxFilters bounds limits.max_filters: each filter is a query and a
	// listener at the relay, and clients send one to a few.
	maxFilters = 1000
	// maxSubscriptions and maxConnections bound limits.subscriptions and
	// limits.max_connections: past them a cap caps nothing.
	maxSubscriptions = 10000
	maxConnections   = 1000000
	// maxSyncs bounds limits.syncs.
	maxSyncs = 10000
	// maxFilterBytes bounds limits.max_filter_bytes (1 GiB).
	maxFilterBytes = 1 << 30
	// minFrameSize is the smallest limits.frame_size: a smaller number
	// bounds nothing a client sends (an AUTH is hundreds of bytes) and is
	// most likely a size meant in KiB.
	minFrameSize = 64
)

// fileConfig is the YAML file, field for field. Durations are strings,
// parsed by validate so that an error can name the field; pointers mark
// values whose absence differs from their zero.
type fileConfig struct {
	Listen        string         `yaml:"listen"`
	MetricsListen string         `yaml:"metrics_listen"`
	DataDir       string         `yaml:"data_dir"`
	Upstream      string         `yaml:"upstream"`
	RelayURL      string         `yaml:"relay_url"`
	ReadLimit     integer        `yaml:"read_limit"`
	MaxSyncEvents integer        `yaml:"max_sync_events"`
	Mode          string         `yaml:"mode"`
	Log           logConfig      `yaml:"log"`
	Info          infoConfig     `yaml:"info"`
	Store         storeConfig    `yaml:"store"`
	Limits        limitsConfig   `yaml:"limits"`
	Quota         quotaConfig    `yaml:"quota"`
	Identity      identityConfig `yaml:"identity"`
	Allow         allowConfig    `yaml:"allow"`
	// Tiers are the member tiers by name (policy.go).
	Tiers map[string]tierConfig `yaml:"tiers"`

	// dir is the directory of the config file ("" for none): a tier's
	// pubkeys_file is read relative to it.
	dir string `yaml:"-"`
	// from names where a field's value came from when that was not the
	// file ("SLUICE_LISTEN", "--listen"), keyed by the field's path, so
	// an error about it names what the operator actually set.
	from map[string]string `yaml:"-"`
	// at is where the file sets a field ("line 3, column 5"), keyed by
	// the field's path, so an error about its value says where to look.
	at map[string]string `yaml:"-"`
}

type logConfig struct {
	Format string `yaml:"format"`
	Level  string `yaml:"level"`
}

type infoConfig struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	Contact     string `yaml:"contact"`
	Pubkey      string `yaml:"pubkey"`
	Icon        string `yaml:"icon"`
}

type storeConfig struct {
	Redis   string `yaml:"redis"`
	Prefix  string `yaml:"prefix"`
	Timeout string `yaml:"timeout"`
}

type limitsConfig struct {
	Connection []limitConfig            `yaml:"connection"`
	Message    map[string][]limitConfig `yaml:"message"`
	MaxFilters integer                  `yaml:"max_filters"`
	// MaxEventTags, MaxTagValueBytes, MaxFilterValues and MaxFilterFanout
	// are wire.Bounds: what one frame may make the relay index or scan.
	MaxEventTags     integer `yaml:"max_event_tags"`
	MaxTagValueBytes integer `yaml:"max_tag_value_bytes"`
	MaxFilterValues  integer `yaml:"max_filter_values"`
	MaxFilterFanout  integer `yaml:"max_filter_fanout"`
	// Subscriptions caps the subscriptions one connection holds open;
	// MaxConnections the connections one client holds open at once.
	Subscriptions  integer `yaml:"subscriptions"`
	MaxConnections integer `yaml:"max_connections"`
	// Syncs caps the NIP-77 syncs one client holds open at once.
	Syncs integer `yaml:"syncs"`
	// MaxFilterBytes caps the bytes of REQs one client holds open at the
	// relay across its connections.
	MaxFilterBytes integer `yaml:"max_filter_bytes"`
	// FrameSize holds only the types the file names; the others keep
	// relay.DefaultFrameSize, which for EVENT is read_limit whatever
	// read_limit is set to (a number in the defaults could not say that).
	FrameSize map[string]integer `yaml:"frame_size"`
	// Kinds are the EVENT kind classes by name (policy.go).
	Kinds map[string]kindClassConfig `yaml:"kinds"`
}

type limitConfig struct {
	Rate   *number `yaml:"rate"`
	Period string  `yaml:"period"`
	Cost   *number `yaml:"cost"`
	Shadow boolean `yaml:"shadow"`
}

type quotaConfig struct {
	Events    integer `yaml:"events"`
	Window    string  `yaml:"window"`
	Unlimited boolean `yaml:"unlimited"`
}

type identityConfig struct {
	IPv6Prefix     integer  `yaml:"ipv6_prefix"`
	TrustedProxies []string `yaml:"trusted_proxies"`
	Header         string   `yaml:"header"`
	// IPv6Aggregate and IPv4Aggregate are the prefix aggregates
	// (policy.go).
	IPv6Aggregate []aggregateConfig `yaml:"ipv6_aggregate"`
	IPv4Aggregate []aggregateConfig `yaml:"ipv4_aggregate"`
}

type allowConfig struct {
	IPs     []string `yaml:"ips"`
	Pubkeys []string `yaml:"pubkeys"`
}

// integer is a whole number in the file. goccy/go-yaml would truncate 1.5
// into an int field without a word; this type refuses it instead.
type integer int64

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (i *integer) UnmarshalYAML(n ast.Node) error {
	if in, ok := n.(*ast.IntegerNode); ok {
		switch v := in.Value.(type) {
		case int64:
			*i = integer(v)
			return nil
		case uint64:
			if v <= math.MaxInt64 {
				*i = integer(v)
				return nil
			}
		}
	}
	return typeError(n, "a whole number")
}

// number is a number in the file: an integer, a float, .inf or .nan.
// goccy/go-yaml would read the string "10" into a float64; this type
// refuses it, as it refuses any other string.
type number float64

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (f *number) UnmarshalYAML(n ast.Node) error {
	switch n := n.(type) {
	case *ast.IntegerNode:
		switch v := n.Value.(type) {
		case int64:
			*f = number(v)
			return nil
		case uint64:
			*f = number(v)
			return nil
		}
	case *ast.FloatNode:
		*f = number(n.Value)
		return nil
	case *ast.InfinityNode:
		*f = number(n.Value)
		return nil
	case *ast.NanNode:
		*f = number(math.NaN())
		return nil
	case *ast.StringNode:
		// goccy/go-yaml reads a plain 1e9 (a float in YAML 1.2) as a
		// string; a quoted number stays a string.
		if tk := n.GetToken(); tk.Type == token.StringType {
			if v, err := strconv.ParseFloat(tk.Value, 64); err == nil {
				*f = number(v)
				return nil
			}
		}
	}
	return typeError(n, "a number")
}

// boolean is true or false in the file, and nothing else. YAML 1.2 also
// reads True and TRUE as booleans (goccy/go-yaml does) and YAML 1.1 yes,
// on and their kin (gopkg.in/yaml.v3 did: `unlimited: yes` turned the
// quota off while `unlimited: "true"` was refused); this type refuses
// them all, and quoted strings.
type boolean bool

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (b *boolean) UnmarshalYAML(n ast.Node) error {
	if _, ok := n.(*ast.BoolNode); ok {
		switch n.GetToken().Value {
		case "true":
			*b = true
			return nil
		case "false":
			*b = false
			return nil
		}
	}
	return typeError(n, "true or false")
}

// typeError says that the value at n is not what its field holds, naming
// the field by its path and position as every parse error does:
// "read_limit (line 1, column 13): expected a whole number, got !!float `1.5`".
func typeError(n ast.Node, want string) error {
	name := fieldPath(n.GetPath())
	if name == "" {
		name = "the file"
	}
	return fmt.Errorf("%s (%s): expected %s, got %s", name, position(n.GetToken()), want, describe(n))
}

// config is a validated configuration: what the subcommands run on.
type config struct {
	Listen        string
	MetricsListen string // "" turns the metrics listener off
	DataDir       string
	Upstream      string // "" unless proxy mode
	RelayURL      string // "": the host the client connected to
	ReadLimit     int64
	MaxSyncEvents int    // sluice relay: the events one NIP-77 sync may cover
	LogFormat     string // "text" or "json"
	LogLevel      string // "debug", "info", "warn" or "error"
	Info          infoConfig

	Redis        string // "" means the memory store
	Prefix       string
	StoreTimeout time.Duration

	Limits policy.Limits
	// MaxFilters is limits.max_filters as configured; the gate may lower
	// it (relay.Options.MaxFilters).
	MaxFilters int
	// Bounds are limits.max_event_tags, max_tag_value_bytes,
	// max_filter_values and max_filter_fanout (policy.Config.Bounds;
	// MaxFilters is not read).
	Bounds wire.Bounds
	// Subscriptions, MaxConnections and Syncs are limits.subscriptions,
	// limits.max_connections and limits.syncs
	// (relay.Options.MaxSubscriptions, MaxConnections, MaxSyncs).
	Subscriptions, MaxConnections, Syncs int
	// MaxFilterBytes is limits.max_filter_bytes
	// (relay.Options.MaxFilterBytes).
	MaxFilterBytes int
	// FrameSize is limits.frame_size by type; 0 means
	// relay.DefaultFrameSize.
	FrameSize [wire.NumTypes]int

	QuotaEvents    int
	QuotaWindow    time.Duration
	QuotaUnlimited bool

	// Identity says who a client is (with the allow-list in Identity.Allow).
	Identity policy.Identity

	// Shadow is mode: shadow. Kinds, Tiers and Aggregates are the policy's
	// (policy.go); a tier's quota is built with the store (buildPolicy).
	Shadow     bool
	Kinds      []policy.Class
	Tiers      []tierSpec
	Aggregates []policy.Aggregate
}

// defaultFileConfig returns the configuration used when no file is given.
// sluice.example.yaml spells out exactly this (a test holds them equal).
func defaultFileConfig() fileConfig {
	def := policy.DefaultLimits()
	msg := make(map[string][]limitConfig, wire.NumTypes)
	for t := wire.Type(0); t < wire.NumTypes; t++ {
		msg[t.String()] = toLimitConfigs(def.Message[t])
	}
	return fileConfig{
		Listen:        "127.0.0.1:7777",
		Mode:          "enforce",
		MetricsListen: "127.0.0.1:9777",
		DataDir:       "./data",
		ReadLimit:     relay.DefaultReadLimit,
		MaxSyncEvents: defaultMaxSyncEvents,
		Log:           logConfig{Format: "text", Level: "info"},
		Info: infoConfig{
			Name:        "sluice",
			Description: "A Nostr relay behind sluice, a rate-limit gate.",
		},
		Store: storeConfig{Prefix: "sluice:", Timeout: "100ms"},
		Limits: limitsConfig{
			Connection:       toLimitConfigs(def.Connection),
			Message:          msg,
			MaxFilters:       wire.DefaultMaxFilters,
			MaxEventTags:     wire.DefaultMaxTags,
			MaxTagValueBytes: wire.DefaultMaxTagValueBytes,
			MaxFilterValues:  wire.DefaultMaxFilterValues,
			MaxFilterFanout:  wire.DefaultMaxFanout,
			Subscriptions:    relay.DefaultMaxSubscriptions,
			Syncs:            relay.DefaultMaxSyncs,
			MaxFilterBytes:   relay.DefaultMaxFilterBytes,
			MaxConnections:   relay.DefaultMaxConnections,
			FrameSize:        map[string]integer{},
			Kinds:            map[string]kindClassConfig{},
		},
		Quota: quotaConfig{Events: 600, Window: "60s"},
		Identity: identityConfig{IPv6Prefix: 64, TrustedProxies: []string{}, Header: "X-Forwarded-For",
			IPv6Aggregate: []aggregateConfig{}, IPv4Aggregate: []aggregateConfig{}},
		Allow: allowConfig{IPs: []string{}, Pubkeys: []string{}},
		Tiers: map[string]tierConfig{},
	}
}

func toLimitConfigs(ls []ratelimit.Limit) []limitConfig {
	out := make([]limitConfig, len(ls))
	for i, l := range ls {
		rate := number(l.Rate)
		out[i] = limitConfig{Rate: &rate, Period: formatDuration(l.Period)}
		if c := number(l.EffectiveCost()); c != 1 {
			out[i].Cost = &c
		}
	}
	return out
}

// formatDuration writes d the way a person would in the config: "1s",
// "60s", "100ms" rather than time.Duration's "1m0s".
func formatDuration(d time.Duration) string {
	switch {
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d%time.Millisecond == 0:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	}
	return d.String()
}

// parseConfig decodes a YAML config over the defaults: every field left out
// keeps its default; a message type listed replaces that type's default
// windows, and [] makes it free. Unknown fields, duplicate keys, a second
// document and values of the wrong type are refused, naming the field and
// where the file has it.
func parseConfig(data []byte) (fileConfig, error) {
	return parseConfigOver(defaultFileConfig(), data)
}

// byteOrderMark may start a YAML stream; goccy/go-yaml would read it as
// part of the first key.
var byteOrderMark = []byte("\ufeff")

// parseConfigOver decodes data over fc.
func parseConfigOver(fc fileConfig, data []byte) (fileConfig, error) {
	if len(data) > maxConfigSize {
		return fc, fmt.Errorf("%w: file is larger than %d bytes", errConfig, maxConfigSize)
	}
	data = bytes.TrimPrefix(data, byteOrderMark)
	file, err := parser.ParseBytes(data, 0)
	if err != nil {
		return fc, fmt.Errorf("%w: %s", errConfig, describeError(err, nil, data))
	}
	if len(file.Docs) > 1 {
		return fc, fmt.Errorf("%w: the file holds more than one YAML document", errConfig)
	}
	if len(file.Docs) == 0 || file.Docs[0].Body == nil {
		return fc, nil // empty, or only comments: the defaults
	}
	body := file.Docs[0].Body
	fields := indexFields(body)
	// goccy/go-yaml keeps a field's default when the file gives it null.
	// For these two, whose defaults are limits, a null is more likely a
	// list or mapping left unfinished than a wish for the defaults, and
	// reading it as either could surprise: refuse it and say what to
	// write. (A null message type decodes as nil, which validate refuses.)
	for _, f := range []struct{ path, msg string }{
		{"limits.connection", "must be a list of windows; write [] for no connection limit"},
		{"limits.message", "must be a mapping of message types to windows; leave it out to keep the defaults"},
	} {
		if mv, ok := fields[f.path].(*ast.MappingValueNode); ok && mv.Value.Type() == ast.NullType {
			return fc, fmt.Errorf("%w: %s (%s): %s", errConfig, f.path, position(mv.Key.GetToken()), f.msg)
		}
	}
	// goccy/go-yaml replaces a map it decodes; the file's message types
	// and frame sizes are laid over the ones before instead.
	message, frameSize := fc.Limits.Message, fc.Limits.FrameSize
	if err := yaml.NodeToValue(body, &fc, yaml.Strict()); err != nil {
		return fc, fmt.Errorf("%w: %s", errConfig, describeError(err, body, data))
	}
	fc.Limits.Message = overlay(message, fc.Limits.Message)
	fc.Limits.FrameSize = overlay(frameSize, fc.Limits.FrameSize)
	fc.at = make(map[string]string, len(fields))
	for path, n := range fields {
		fc.at[path] = position(fieldToken(n))
	}
	return fc, nil
}

// overlay returns over with every key of under that over lacks (nil stays
// nil, for validate to refuse).
func overlay[V any](under, over map[string]V) map[string]V {
	if over == nil {
		return nil
	}
	for k, v := range under {
		if _, ok := over[k]; !ok {
			over[k] = v
		}
	}
	return over
}

// loadConfigFile reads path (at most maxConfigSize bytes) and parses it.
func loadConfigFile(path string) (fileConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return defaultFileConfig(), fmt.Errorf("%w: config file: %v", errConfig, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return defaultFileConfig(), fmt.Errorf("%w: %s: %v", errConfig, path, err)
	}
	fc, err := parseConfig(data)
	if err != nil {
		return fc, fmt.Errorf("%w: %s: %s", errConfig, path, strings.TrimPrefix(err.Error(), errConfig.Error()+": "))
	}
	fc.dir = filepath.Dir(path)
	return fc, nil
}

// indexFields maps the path of every field and list item in the document
// ("limits.message.EVENT[0]") to its node: a *ast.MappingValueNode for a
// field, the item's node for a list item. The first node of a path wins;
// the paths are the parser's own (node.GetPath()).
func indexFields(body ast.Node) map[string]ast.Node {
	out := map[string]ast.Node{}
	ast.Walk(visitor(func(n ast.Node) {
		switch n.Type() {
		case ast.MappingKeyType, ast.CommentType, ast.CommentGroupType:
			return
		}
		if p := fieldPath(n.GetPath()); p != "" {
			if _, ok := out[p]; !ok {
				out[p] = n
			}
		}
	}), body)
	return out
}

// visitor adapts a func to ast.Visitor, visiting every node.
type visitor func(ast.Node)

func (v visitor) Visit(n ast.Node) ast.Visitor {
	v(n)
	return v
}

// fieldToken is where a field starts: its key, or the item itself.
func fieldToken(n ast.Node) *token.Token {
	if mv, ok := n.(*ast.MappingValueNode); ok && mv.Key != nil {
		return mv.Key.GetToken()
	}
	return n.GetToken()
}

// nodeOf returns the first node under root (depth first) whose token is
// tk: the node an error from the decoder is about. A mapping shares its
// token with its first field, and comes first.
func nodeOf(root ast.Node, tk *token.Token) ast.Node {
	var found ast.Node
	ast.Walk(visitor(func(n ast.Node) {
		if found == nil && n.GetToken() == tk {
			found = n
		}
	}), root)
	return found
}

// fieldPath turns the parser's path ("$.limits.message.EVENT[0]") into the
// one messages use ("limits.message.EVENT[0]"); the root is "".
func fieldPath(p string) string {
	return strings.TrimPrefix(strings.TrimPrefix(p, "$"), ".")
}

func position(tk *token.Token) string {
	if tk == nil || tk.Position == nil {
		return "unknown position"
	}
	return fmt.Sprintf("line %d, column %d", tk.Position.Line, tk.Position.Column)
}

// describeError words an error of the parser or the decoder from its type
// and its token, never from its message: "store.redis_url (line 2, column
// 3): unknown field", "listen (line 1, column 9): expected a string, got
// !!seq". A syntax error (duplicate keys among them) keeps the parser's
// words, with the position and, when the line is indented with a tab, why.
// Errors of this file's own types are worded already.
func describeError(err error, body ast.Node, data []byte) string {
	var ye yaml.Error
	if !errors.As(err, &ye) || ye.GetToken() == nil {
		return err.Error()
	}
	tk := ye.GetToken()
	var n ast.Node
	if body != nil {
		n = nodeOf(body, tk)
	}
	var (
		unknown   *yaml.UnknownFieldError
		mistyped  *yaml.TypeError
		misshapen *yaml.UnexpectedNodeTypeError
	)
	switch {
	case n != nil && errors.As(err, &unknown):
		return fmt.Sprintf("%s (%s): unknown field", fieldPath(n.GetPath()), position(tk))
	case n != nil && errors.As(err, &mistyped):
		return typeError(n, describeType(mistyped.DstType)).Error()
	case n != nil && errors.As(err, &misshapen):
		want := "a mapping"
		if misshapen.Expected == ast.SequenceType {
			want = "a list"
		}
		return typeError(n, want).Error()
	}
	msg := fmt.Sprintf("%s: %s", position(tk), ye.GetMessage())
	if tk.Position != nil && indentedWithTab(data, tk.Position.Line) {
		msg += " (YAML does not allow tabs for indentation)"
	}
	return msg
}

// indentedWithTab reports whether line (from 1) of data has a tab in its
// indentation.
func indentedWithTab(data []byte, line int) bool {
	for ; line > 1; line-- {
		var ok bool
		if _, data, ok = bytes.Cut(data, []byte("\n")); !ok {
			return false
		}
	}
	l, _, _ := bytes.Cut(data, []byte("\n"))
	return bytes.IndexByte(l[:len(l)-len(bytes.TrimLeft(l, " \t"))], '\t') >= 0
}

// describeType says what a Go field holds, in the file's terms.
func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list"
	}
	return "a mapping"
}

// describe renders a value as YAML tags it: "!!str `ten`", "!!seq".
func describe(n ast.Node) string {
	var tag string
	switch n := n.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		return "!!map"
	case *ast.SequenceNode:
		return "!!seq"
	case *ast.AnchorNode:
		return describe(n.Value)
	case *ast.AliasNode:
		return "an alias"
	case *ast.TagNode:
		tag = n.Start.Value
		if n.Value != nil {
			return fmt.Sprintf("%s `%s`", tag, clip(n.Value.GetToken().Value))
		}
		return tag
	case *ast.StringNode, *ast.LiteralNode:
		tag = "!!str"
	case *ast.IntegerNode:
		tag = "!!int"
	case *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		tag = "!!float"
	case *ast.BoolNode:
		tag = "!!bool"
	case *ast.NullNode:
		tag = "!!null"
	default:
		return n.Type().String()
	}
	return fmt.Sprintf("%s `%s`", tag, clip(n.GetToken().Value))
}

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// maxErrors bounds the problems validate lists: a file of a hundred
// thousand bad windows gets the first ones and a count, not a megabyte.
const maxErrors = 20

// validate checks every value and resolves the file into a config. Where
// the library has a check (ratelimit.Limit.Validate, ValidateLimits,
// NewQuota; relay.New, Identity.Validate, NewAllowList; redisstore's URL
// parsing and New), validate calls it and prefixes its error with the
// field's path and position, as in "limits.message.EVENT[1] (line 3,
// column 7): ratelimit: invalid limit: rate 1 must be greater than cost 1";
// the checks written here are the binary's own: what the file's shape
// means (a null, an unknown type, a cost of 0), and bounds the library
// leaves to its caller (see the constants above), each said where it is
// made.
func (fc *fileConfig) validate() (*config, error) {
	var errs []error
	more := 0
	bad := func(path, format string, args ...any) {
		if len(errs) == maxErrors {
			more++
			return
		}
		msg := fmt.Sprintf(format, args...)
		where := path
		if src := fc.from[path]; src != "" {
			msg += " (set by " + src + ")"
		} else if at := fc.at[path]; at != "" {
			where += " (" + at + ")"
		}
		errs = append(errs, fmt.Errorf("%w: %s: %s", errConfig, where, msg))
	}
	c := &config{
		Listen:         fc.Listen,
		MetricsListen:  fc.MetricsListen,
		DataDir:        fc.DataDir,
		Upstream:       fc.Upstream,
		RelayURL:       fc.RelayURL,
		ReadLimit:      int64(fc.ReadLimit),
		MaxSyncEvents:  int(min(max(fc.MaxSyncEvents, 0), maxMaxSyncEvents)),
		LogFormat:      fc.Log.Format,
		LogLevel:       fc.Log.Level,
		Info:           fc.Info,
		Redis:          fc.Store.Redis,
		Prefix:         fc.Store.Prefix,
		QuotaEvents:    int(fc.Quota.Events),
		QuotaUnlimited: bool(fc.Quota.Unlimited),
	}

	if err := checkHostPort(fc.Listen); err != nil {
		bad("listen", "%v", err)
	}
	if fc.MetricsListen != "" {
		if err := checkHostPort(fc.MetricsListen); err != nil {
			bad("metrics_listen", "%v (write \"\" to turn metrics off)", err)
		} else if sameListener(fc.Listen, fc.MetricsListen) {
			// Both are bound at start-up; the second would fail.
			bad("metrics_listen", "%q would bind the port of listen %q: give metrics a port of its own (or \"\" to turn metrics off)", fc.MetricsListen, fc.Listen)
		}
	}
	if fc.DataDir == "" {
		bad("data_dir", "must not be empty")
	}
	if fc.Upstream != "" {
		// The gate's own check (a ws:// or wss:// URL with a host), then
		// the binary's: a URL in a config file must not hold a password.
		if _, err := probeGate().Proxy(fc.Upstream); err != nil {
			bad("upstream", "%v", err)
		} else if u, _ := url.Parse(fc.Upstream); u.User != nil {
			bad("upstream", "must not carry credentials")
		}
	}
	if fc.RelayURL != "" {
		// The binary's check first: the gate's error for a bad relay URL
		// wraps relay.ErrUpstream ("relay: bad upstream"), which would
		// send an operator to look at upstream.
		if err := checkRelayURL(fc.RelayURL); err != nil {
			bad("relay_url", "%v", err)
		} else if _, err := newProbeGate(relay.Options{RelayURL: fc.RelayURL}); err != nil {
			bad("relay_url", "%v", err)
		}
	}
	// The gate takes any read limit; below 1 KiB nothing but the smallest
	// frames would pass, above 64 MiB one client could hold that much of
	// the process per frame.
	readLimitOK := fc.ReadLimit >= 1024 && fc.ReadLimit <= maxReadLimit
	if !readLimitOK {
		bad("read_limit", "must be between 1024 and %d bytes, got %d", maxReadLimit, fc.ReadLimit)
	}
	if fc.MaxSyncEvents < 1 || fc.MaxSyncEvents > maxMaxSyncEvents {
		bad("max_sync_events", "must be between 1 and %d, got %d", maxMaxSyncEvents, fc.MaxSyncEvents)
	}
	switch fc.Log.Format {
	case "text", "json":
	default:
		bad("log.format", "must be text or json, got %q", fc.Log.Format)
	}
	switch fc.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "must be debug, info, warn or error, got %q", fc.Log.Level)
	}
	if fc.Info.Pubkey != "" {
		if pk, err := parsePubkey(fc.Info.Pubkey); err != nil {
			bad("info.pubkey", "%v", err)
		} else if _, ok := wire.DecodeHex32(pk); !ok {
			bad("info.pubkey", "must be 64 hex digits or an npub, got %q", fc.Info.Pubkey)
		} else {
			c.Info.Pubkey = strings.ToLower(pk)
		}
	}
	// NIP-11 sets no bounds; these keep the document a page.
	for _, f := range []struct {
		path, v string
		max     int
	}{
		{"info.name", fc.Info.Name, 256},
		{"info.description", fc.Info.Description, 4096},
		{"info.contact", fc.Info.Contact, 512},
		{"info.icon", fc.Info.Icon, 2048},
	} {
		if len(f.v) > f.max {
			bad(f.path, "must be at most %d bytes", f.max)
		}
	}

	var redisReadTimeout time.Duration // the client's, when store.redis is good
	if fc.Store.Redis != "" {
		if rt, err := checkRedisURL(fc.Store.Redis); err != nil {
			bad("store.redis", "%v", err)
		} else {
			redisReadTimeout = rt
		}
	}
	switch {
	case fc.Store.Prefix == "":
		// The Redis store reads "" as its default prefix; say so rather
		// than let "no prefix" quietly mean "sluice:".
		bad("store.prefix", "must not be empty (the default is \"sluice:\")")
	case len(fc.Store.Prefix) > 64:
		// The store takes any length; a key prefix longer than this is a
		// value pasted into the wrong field.
		bad("store.prefix", "must be at most 64 bytes")
	default:
		if err := checkPrefix(fc.Store.Prefix); err != nil {
			bad("store.prefix", "%v", err)
		}
	}
	// The store takes any timeout (negative: none of its own); a decision
	// that may take longer than 10 s holds a client's frame that long.
	if d, err := parseDuration(fc.Store.Timeout); err != nil {
		bad("store.timeout", "%v", err)
	} else if d < time.Millisecond || d > maxTimeout {
		bad("store.timeout", "must be between 1ms and %v, got %v", maxTimeout, d)
	} else if redisReadTimeout > 0 && d > redisReadTimeout {
		// go-redis bounds each socket read by the earlier of the call's
		// deadline and its read timeout: a longer store.timeout would be
		// cut short there, silently.
		bad("store.timeout", "%v is longer than the Redis client's read timeout (%v), which bounds every call: set read_timeout=%v in store.redis, or store.timeout to at most %v", d, redisReadTimeout, d, redisReadTimeout)
	} else {
		c.StoreTimeout = d
	}

	// A null where a list or mapping belongs would otherwise read as "no
	// limits at all" (parseConfigOver refuses it in a file; this guards
	// every other way in).
	if fc.Limits.Connection == nil {
		bad("limits.connection", "must be a list of windows; write [] for no connection limit")
	}
	if fc.Limits.Message == nil {
		bad("limits.message", "must be a mapping of message types to windows; leave it out to keep the defaults")
	}
	c.Limits.Connection = resolveLimits("limits.connection", fc.Limits.Connection, bad)
	labels := make([]string, 0, len(fc.Limits.Message))
	for label := range fc.Limits.Message {
		labels = append(labels, label)
	}
	slices.Sort(labels) // errors in a stable order
	for _, label := range labels {
		path := "limits.message." + label
		t, known := wire.ParseType(label)
		if !known {
			bad(path, "unknown message type; known are %s", knownTypes())
			continue
		}
		ls := fc.Limits.Message[label]
		if ls == nil {
			bad(path, "must be a list of windows; write [] to let %s pass free", label)
			continue
		}
		// The catch-all bucket is never free (DESIGN.md): otherwise a client
		// could send anything the gate cannot classify without limit, and the
		// relay would still have to read and reject every frame. The library
		// lets a caller make it free; sluice does not.
		if t == wire.TypeOther && len(ls) == 0 {
			bad(path, "must have at least one window: the catch-all bucket is never free")
			continue
		}
		c.Limits.Message[t] = resolveLimits(path, ls, bad)
	}
	// The gate takes any positive number for these three; the bounds are
	// where a cap stops capping anything.
	if n := fc.Limits.MaxFilters; n < 1 || n > maxFilters {
		bad("limits.max_filters", "must be between 1 and %d, got %d", maxFilters, n)
	} else {
		c.MaxFilters = int(n)
	}
	c.Bounds = wire.Bounds{
		MaxTags:          int(fc.Limits.MaxEventTags),
		MaxTagValueBytes: int(fc.Limits.MaxTagValueBytes),
		MaxFilterValues:  int(fc.Limits.MaxFilterValues),
		MaxFanout:        int(fc.Limits.MaxFilterFanout),
	}
	if err := (&policy.Config{Bounds: c.Bounds}).Validate(); err != nil {
		// The library names the field; the file nests it under limits.
		field, why, _ := strings.Cut(strings.TrimPrefix(err.Error(), policy.ErrPolicy.Error()+": "), " ")
		bad("limits."+field, "%s", why)
	}
	if n := fc.Limits.Subscriptions; n < 1 || n > maxSubscriptions {
		bad("limits.subscriptions", "must be between 1 and %d, got %d", maxSubscriptions, n)
	} else {
		c.Subscriptions = int(n)
	}
	if n := fc.Limits.MaxConnections; n < 1 || n > maxConnections {
		bad("limits.max_connections", "must be between 1 and %d, got %d", maxConnections, n)
	} else {
		c.MaxConnections = int(n)
	}
	if n := fc.Limits.Syncs; n < 1 || n > maxSyncs {
		bad("limits.syncs", "must be between 1 and %d, got %d", maxSyncs, n)
	} else {
		c.Syncs = int(n)
	}
	if n := fc.Limits.MaxFilterBytes; n < 1 || n > maxFilterBytes {
		bad("limits.max_filter_bytes", "must be between 1 and %d, got %d", maxFilterBytes, n)
	} else {
		c.MaxFilterBytes = int(n)
	}
	labels = labels[:0]
	for label := range fc.Limits.FrameSize {
		labels = append(labels, label)
	}
	slices.Sort(labels)
	for _, label := range labels {
		path := "limits.frame_size." + label
		t, known := wire.ParseType(label)
		if !known {
			bad(path, "unknown message type; known are %s", forwardedTypes())
			continue
		}
		if t == wire.TypeOther {
			// OTHER frames are answered by the gate, never forwarded: a
			// size for them would bound nothing.
			bad(path, "OTHER frames are never forwarded; sizes are for %s", forwardedTypes())
			continue
		}
		n := fc.Limits.FrameSize[label]
		if n < minFrameSize {
			// The gate reads 0 as its default; in the file a size is a
			// size, and below minFrameSize it bounds nothing.
			bad(path, "must be at least %d bytes, got %d", minFrameSize, n)
			continue
		}
		if !readLimitOK {
			continue // read_limit is reported; the gate would be asked about the wrong bound
		}
		var sizes [wire.NumTypes]int
		sizes[t] = int(min(n, math.MaxInt))
		if _, err := newProbeGate(relay.Options{ReadLimit: int64(fc.ReadLimit), FrameSize: sizes}); err != nil {
			bad(path, "%v", err)
			continue
		}
		c.FrameSize[t] = int(n)
	}

	// The quota's window is fixed: the library takes any positive one; a
	// window of less than a second counts nothing a person does, and one
	// of more than a day keeps a pubkey's count for days.
	window := time.Minute // to ask NewQuota about events while the window is wrong
	if d, err := parseDuration(fc.Quota.Window); err != nil {
		bad("quota.window", "%v", err)
	} else if d < time.Second || d > maxPeriod {
		bad("quota.window", "must be between 1s and %v, got %v", maxPeriod, d)
	} else {
		c.QuotaWindow, window = d, d
	}
	// Checked even when unlimited: 0 there is a mistake in the making.
	if msg := quotaEventsProblem(int64(fc.Quota.Events), "quota.unlimited"); msg != "" {
		bad("quota.events", "%s", msg)
	} else if _, err := ratelimit.NewQuota(int(fc.Quota.Events), window); err != nil {
		bad("quota.events", "%v", err)
	}

	// The library takes 1…128 (0: its default); below /16 every IPv6
	// client of a continent would share one budget.
	if p := fc.Identity.IPv6Prefix; p < 16 || p > 128 {
		// The library's own error would offer 0 and 1…128, which the
		// file does not take.
		bad("identity.ipv6_prefix", "must be between 16 and 128, got %d", p)
	} else if err := (&policy.Config{Identity: policy.Identity{IPv6Prefix: int(min(p, math.MaxInt))}}).Validate(); err != nil {
		bad("identity.ipv6_prefix", "%v", err)
	}
	c.Identity.IPv6Prefix = int(fc.Identity.IPv6Prefix)
	for i, s := range fc.Identity.TrustedProxies {
		path := fmt.Sprintf("identity.trusted_proxies[%d]", i)
		p, err := parsePrefix(s)
		if err == nil {
			err = (&policy.Config{Identity: policy.Identity{TrustedProxies: []netip.Prefix{p}}}).Validate()
		}
		if err != nil {
			bad(path, "%v", err)
			continue
		}
		c.Identity.TrustedProxies = append(c.Identity.TrustedProxies, p)
	}
	c.Identity.Header = fc.Identity.Header
	if c.Identity.Header == "" {
		// The library reads "" as X-Forwarded-For; in the file it is
		// more likely a value forgotten.
		bad("identity.header", "must not be empty (X-Forwarded-For, X-Real-IP or another forwarding header)")
	} else if err := (&policy.Config{Identity: policy.Identity{Header: c.Identity.Header}}).Validate(); err != nil {
		bad("identity.header", "%v", err)
	}

	// npubs are the binary's to read (NIP-19); the allow-list judges the
	// hex and the addresses, and its error names the entry (ips[0]).
	pubkeys := make([]string, len(fc.Allow.Pubkeys))
	npubsOK := true
	for i, s := range fc.Allow.Pubkeys {
		pk, err := parsePubkey(s)
		if err != nil {
			bad(fmt.Sprintf("allow.pubkeys[%d]", i), "%v", err)
			npubsOK = false
		}
		pubkeys[i] = pk
	}
	// The allow-list's error names the entry within its list (ips[2]);
	// the entry's own path carries the file's line and column.
	listOK := true
	for _, l := range []struct {
		path string
		n    int
		list func(k int) error // NewAllowList's verdict on the first k entries
	}{
		{"allow.ips", len(fc.Allow.IPs), func(k int) error {
			_, err := policy.NewAllowList(fc.Allow.IPs[:k], nil)
			return err
		}},
		{"allow.pubkeys", len(pubkeys), func(k int) error {
			if !npubsOK {
				return nil // reported above
			}
			_, err := policy.NewAllowList(nil, pubkeys[:k])
			return err
		}},
	} {
		if l.list(l.n) == nil {
			continue
		}
		listOK = false
		// A prefix of the list is refused exactly when it holds a bad
		// entry: the first bad one is found in log n calls.
		i := sort.Search(l.n, func(k int) bool { return l.list(k+1) != nil })
		bad(fmt.Sprintf("%s[%d]", l.path, i), "%v", l.list(i+1))
	}
	if npubsOK && listOK && (len(fc.Allow.IPs) > 0 || len(pubkeys) > 0) {
		if al, err := policy.NewAllowList(fc.Allow.IPs, pubkeys); err != nil {
			bad("allow", "%v", err)
		} else {
			c.Identity.Allow = al
		}
	}

	fc.validatePolicy(c, bad)
	if len(errs) == 0 {
		// What the policy checks across fields (a kind in two classes, a
		// pubkey in two tiers, …) is checked by the compiler that reload
		// and start-up use, with quotas as check builds them.
		if pc, err := buildPolicy(c, localQuotas(nil)); err != nil {
			bad("quota", "%v", err)
		} else if err := pc.Validate(); err != nil {
			bad("policy", "%v", err)
		} else if _, err := relay.New(relay.Options{Limiter: probeLimiter, Policy: pc, RelayURL: fc.RelayURL}); errors.Is(err, relay.ErrNoRelayURL) {
			bad("relay_url", "must be set to the relay's public ws:// or wss:// URL when tiers or allow.pubkeys grant budgets by NIP-42 pubkey: without it an AUTH's relay tag is checked against whatever host the client claims, so an AUTH a member signed for another relay could be replayed here")
		}
	}
	if more > 0 {
		errs = append(errs, fmt.Errorf("%w: and %d more", errConfig, more))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// resolveLimits reads the windows at path into ratelimit.Limits. A window
// the file cannot mean (a field missing, a period that is not a duration,
// a cost of 0, which ratelimit.Limit reads as 1) is refused here; the
// library's Limit.Validate judges each window, and ValidateLimits the list
// (how many, and no period twice), its error naming the first window at
// which the list goes wrong; then the binary's own bounds (maxPeriod,
// maxRate, an interval of at least a microsecond).
func resolveLimits(path string, ls []limitConfig, bad func(string, string, ...any)) []ratelimit.Limit {
	out := make([]ratelimit.Limit, 0, len(ls))
	ok := true
	for i, lc := range ls {
		p := fmt.Sprintf("%s[%d]", path, i)
		fine := true
		if lc.Rate == nil {
			bad(p+".rate", "is required")
			fine = false
		}
		cost := 1.0
		if lc.Cost != nil {
			if cost = float64(*lc.Cost); cost == 0 {
				bad(p+".cost", "must be greater than 0 (leave it out for the default, 1)")
				fine = false
			}
		}
		var period time.Duration
		if lc.Period == "" {
			bad(p+".period", "is required")
			fine = false
		} else if d, err := parseDuration(lc.Period); err != nil {
			bad(p+".period", "%v", err)
			fine = false
		} else {
			period = d
		}
		if !fine {
			ok = false
			continue
		}
		l := ratelimit.Limit{Rate: float64(*lc.Rate), Period: period, Cost: cost, Shadow: bool(lc.Shadow)}
		if err := l.Validate(); err != nil {
			bad(p, "%v", err)
			ok = false
			continue
		}
		out = append(out, l)
	}
	if !ok {
		return nil
	}
	if err := ratelimit.ValidateLimits(out); err != nil {
		// Find the window at which the list first fails: the one past
		// ratelimit.MaxWindows, or the second of one period.
		for n := 1; n <= len(out); n++ {
			if err := ratelimit.ValidateLimits(out[:n]); err != nil {
				bad(fmt.Sprintf("%s[%d]", path, n-1), "%v", err)
				break
			}
		}
		return nil
	}
	for i, l := range out {
		p := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case l.Period > maxPeriod:
			bad(p+".period", "must be at most %v, got %v", maxPeriod, l.Period)
		case l.Rate > maxRate:
			bad(p+".rate", "must be at most %g, got %v", float64(maxRate), l.Rate)
		case l.Rate/l.Cost > maxRate:
			bad(p, "rate/cost is %g; a burst can be at most %g messages", l.Rate/l.Cost, float64(maxRate))
		case l.Interval() < time.Microsecond:
			// Beyond this the math still works, but nothing real sends
			// that fast, and float rounding makes the interval 0.
			bad(p, "%s allows more than a million messages a second; lower rate or raise period", limitString(l))
		default:
			continue
		}
		out = nil
	}
	return out
}

// probeLimiter backs the gates validate builds only to ask relay.New (and
// Gate.Proxy) about a value; they are never served.
var probeLimiter = ratelimit.NewLimiter(ratelimit.NewMemoryStore(1), ratelimit.LimiterOptions{BlockedSlots: 4})

// newProbeGate returns relay.New's verdict on opts, with no limits (those
// are judged window by window) and the probe limiter.
func newProbeGate(opts relay.Options) (*relay.Gate, error) {
	opts.Limiter = probeLimiter
	opts.Policy.Limits = &policy.Limits{}
	return relay.New(opts)
}

// probeGate is a gate of the zero options, to ask Gate.Proxy about an
// upstream URL.
func probeGate() *relay.Gate {
	g, err := newProbeGate(relay.Options{})
	if err != nil {
		panic(err) // the zero options are valid
	}
	return g
}

// parsePrefix reads a CIDR ("10.0.0.0/8", "2001:db8::/32") or a single
// address (taken as /32 or /128) of identity.trusted_proxies; the library
// takes netip.Prefix values there and judges them (Identity.Validate),
// not strings. A prefix with host bits set is refused as a typo.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not a CIDR: %q", s)
		}
		if p.Masked() != p {
			return netip.Prefix{}, fmt.Errorf("%q has host bits set (did you mean %v?)", s, p.Masked())
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		// A zone would be dropped by netip.PrefixFrom and match every
		// interface's address.
		return netip.Prefix{}, fmt.Errorf("not an IP address or CIDR: %q", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parsePubkey turns an npub into hex and returns anything else as it is,
// for the library to judge as hex.
func parsePubkey(s string) (string, error) {
	if !strings.HasPrefix(s, "npub1") {
		return s, nil
	}
	prefix, v, err := nip19.Decode(s)
	if err != nil || prefix != "npub" {
		return "", fmt.Errorf("not a valid npub: %q", s)
	}
	pk, _ := v.(string)
	return pk, nil
}

// quotaEventsProblem says, in the file's terms, what is wrong with a
// quota's events count ("" when nothing is): ratelimit.NewQuota's own error
// says "use Unlimited", a Go field, where the file has unlimitedKey.
func quotaEventsProblem(events int64, unlimitedKey string) string {
	switch {
	case events < 1:
		return fmt.Sprintf("must be at least 1, got %d (set %s: true to turn the quota off)", events, unlimitedKey)
	case events > ratelimit.MaxQuotaEvents:
		return fmt.Sprintf("must be at most %d, got %d", ratelimit.MaxQuotaEvents, events)
	}
	return ""
}

func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, errors.New("is required (a duration such as 1s or 100ms)")
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("not a duration: %q (write e.g. 1s, 100ms, 5m)", s)
	}
	return d, nil
}

func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("want host:port, got %q", s)
	}
	if host != "" && strings.ContainsAny(host, " /") {
		return fmt.Errorf("bad host in %q", s)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("bad port in %q", s)
	}
	return nil
}

// sameListener reports whether listeners on a and b (valid host:port)
// would claim one port: the same port, not 0 (any free port), on the same
// host, or where one is every interface: "" and "::" (every address, IPv4
// too), 0.0.0.0 (every IPv4 address). Two names of one address (localhost
// and 127.0.0.1) are not resolved here; binding reports those.
func sameListener(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil {
		return false
	}
	na, _ := strconv.Atoi(pa)
	nb, _ := strconv.Atoi(pb)
	if na == 0 || na != nb {
		return false
	}
	if ha == "" || hb == "" || strings.EqualFold(ha, hb) {
		return true
	}
	ipa, ipb := net.ParseIP(ha), net.ParseIP(hb)
	covers := func(x, y net.IP) bool { // x is every address of y's family
		if x == nil || !x.IsUnspecified() {
			return false
		}
		return x.To4() == nil || (y != nil && y.To4() != nil)
	}
	return covers(ipa, ipb) || covers(ipb, ipa) || (ipa != nil && ipb != nil && ipa.Equal(ipb))
}

// checkRelayURL refuses what the gate refuses (anything but a ws:// or
// wss:// URL with a host), and what no public relay URL has: an AUTH relay
// tag is compared by host and path, so credentials, a query or a fragment
// could only be a mistake. The gate takes those; the binary does not.
func checkRelayURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("not a URL: %q (want a ws:// or wss:// URL with a host)", s)
	case u.Host == "" || (u.Scheme != "ws" && u.Scheme != "wss"):
		return fmt.Errorf("must be a ws:// or wss:// URL with a host, got %q", s)
	case u.User != nil:
		return errors.New("must not carry credentials")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return fmt.Errorf("must have no query or fragment, got %q", s)
	}
	return nil
}

// checkRedisURL parses the URL the way start-up will, with
// redisstore.NewClient (which does not dial), and drops the client. Its
// error never repeats the password.
func checkRedisURL(s string) (readTimeout time.Duration, err error) {
	client, err := redisstore.NewClient(s)
	if err != nil {
		return 0, err
	}
	switch c := client.(type) {
	case *redis.Client:
		readTimeout = c.Options().ReadTimeout
	case *redis.ClusterClient:
		readTimeout = c.Options().ReadTimeout
	}
	return readTimeout, client.Close()
}

// checkPrefix asks redisstore.New whether it takes prefix (it refuses
// braces, which would end a key's cluster hash tag early), on a client
// that is never used: go-redis dials on a client's first command, not when
// it is made. The prefix is checked with the memory store too, so that
// moving to Redis does not turn up an error of the old file.
func checkPrefix(prefix string) error {
	client, err := redisstore.NewClient("redis://127.0.0.1:6379")
	if err != nil {
		return err
	}
	defer client.Close()
	st, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		return err
	}
	return st.Close()
}

// forwardedTypes lists the types limits.frame_size may name: every type
// but the catch-all, whose frames are never forwarded.
func forwardedTypes() string {
	names := make([]string, 0, wire.NumTypes-1)
	for t := wire.Type(1); t < wire.NumTypes; t++ {
		names = append(names, t.String())
	}
	return strings.Join(names, ", ")
}

func knownTypes() string {
	names := make([]string, 0, wire.NumTypes)
	for t := wire.Type(1); t < wire.NumTypes; t++ {
		names = append(names, t.String())
	}
	return strings.Join(append(names, wire.TypeOther.String()), ", ")
}
