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
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nbd-wtf/go-nostr/nip19"
	"gopkg.in/yaml.v3"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay"
)

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
	// maxFilters bounds limits.max_filters: each filter is a query and a
	// listener at the relay, and clients send one to a few.
	maxFilters = 1000
	// maxSubscriptions and maxConnections bound limits.subscriptions and
	// limits.max_connections: past them a cap caps nothing.
	maxSubscriptions = 10000
	maxConnections   = 1000000
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
	Log           logConfig      `yaml:"log"`
	Info          infoConfig     `yaml:"info"`
	Store         storeConfig    `yaml:"store"`
	Limits        limitsConfig   `yaml:"limits"`
	Quota         quotaConfig    `yaml:"quota"`
	Identity      identityConfig `yaml:"identity"`
	Allow         allowConfig    `yaml:"allow"`

	// from names where a field's value came from when that was not the
	// file ("SLUICE_LISTEN", "--listen"), keyed by the field's path, so
	// an error about it names what the operator actually set.
	from map[string]string `yaml:"-"`
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
	// Subscriptions caps the subscriptions one connection holds open;
	// MaxConnections the connections one client holds open at once.
	Subscriptions  integer `yaml:"subscriptions"`
	MaxConnections integer `yaml:"max_connections"`
	// FrameSize holds only the types the file names; the others keep
	// relay.DefaultFrameSize, which for EVENT is read_limit whatever
	// read_limit is set to (a number in the defaults could not say that).
	FrameSize map[string]integer `yaml:"frame_size"`
}

type limitConfig struct {
	Rate   *float64 `yaml:"rate"`
	Period string   `yaml:"period"`
	Cost   *float64 `yaml:"cost"`
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
}

type allowConfig struct {
	IPs     []string `yaml:"ips"`
	Pubkeys []string `yaml:"pubkeys"`
}

// integer is a whole number in the file. yaml.v3 would truncate 1.5 into
// an int field without a word; this type refuses it instead.
type integer int64

// UnmarshalYAML implements yaml.Unmarshaler.
func (i *integer) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int" {
		var v int64
		if err := n.Decode(&v); err == nil {
			*i = integer(v)
			return nil
		}
	}
	// Shaped like yaml.v3's own errors, so locate names the field.
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cannot unmarshal %s `%s` into int", n.Line, n.ShortTag(), n.Value)}}
}

// boolean is true or false in the file, and nothing else. yaml.v3 reads
// YAML 1.1's yes/no/on/off (in any case) into a bool field, so
// `unlimited: yes` turned the quota off while `unlimited: "true"` was
// refused; this type refuses both.
type boolean bool

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *boolean) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
		switch n.Value {
		case "true":
			*b = true
			return nil
		case "false":
			*b = false
			return nil
		}
	}
	// Shaped like yaml.v3's own errors, so locate names the field.
	tag := n.ShortTag()
	if n.Kind == yaml.ScalarNode && tag == "!!bool" {
		tag = "!!str" // yes, on, True: not true or false
	}
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cannot unmarshal %s `%s` into bool", n.Line, tag, n.Value)}}
}

// config is a validated configuration: what the subcommands run on.
type config struct {
	Listen        string
	MetricsListen string // "" turns the metrics listener off
	DataDir       string
	Upstream      string // "" unless proxy mode
	RelayURL      string // "": the host the client connected to
	ReadLimit     int64
	LogFormat     string // "text" or "json"
	LogLevel      string // "debug", "info", "warn" or "error"
	Info          infoConfig

	Redis        string // "" means the memory store
	Prefix       string
	StoreTimeout time.Duration

	Limits relay.Limits
	// MaxFilters is limits.max_filters as configured; the gate may lower
	// it (relay.Options.MaxFilters).
	MaxFilters int
	// Subscriptions and MaxConnections are limits.subscriptions and
	// limits.max_connections (relay.Options.MaxSubscriptions,
	// MaxConnections).
	Subscriptions, MaxConnections int
	// FrameSize is limits.frame_size by type; 0 means
	// relay.DefaultFrameSize.
	FrameSize [relay.NumTypes]int

	QuotaEvents    int
	QuotaWindow    time.Duration
	QuotaUnlimited bool

	// Identity says who a client is (with the allow-list in Identity.Allow).
	Identity relay.Identity
}

// defaultFileConfig returns the configuration used when no file is given.
// sluice.example.yaml spells out exactly this (a test holds them equal).
func defaultFileConfig() fileConfig {
	def := relay.DefaultLimits()
	msg := make(map[string][]limitConfig, relay.NumTypes)
	for t := relay.Type(0); t < relay.NumTypes; t++ {
		msg[t.String()] = toLimitConfigs(def.Message[t])
	}
	return fileConfig{
		Listen:        "127.0.0.1:7777",
		MetricsListen: "127.0.0.1:9777",
		DataDir:       "./data",
		ReadLimit:     relay.DefaultReadLimit,
		Log:           logConfig{Format: "text", Level: "info"},
		Info: infoConfig{
			Name:        "sluice",
			Description: "A Nostr relay behind sluice, a rate-limit gate.",
		},
		Store: storeConfig{Prefix: "sluice:", Timeout: "100ms"},
		Limits: limitsConfig{
			Connection:     toLimitConfigs(def.Connection),
			Message:        msg,
			MaxFilters:     relay.DefaultMaxFilters,
			Subscriptions:  relay.DefaultMaxSubscriptions,
			MaxConnections: relay.DefaultMaxConnections,
			FrameSize:      map[string]integer{},
		},
		Quota:    quotaConfig{Events: 600, Window: "60s"},
		Identity: identityConfig{IPv6Prefix: 64, TrustedProxies: []string{}, Header: "X-Forwarded-For"},
		Allow:    allowConfig{IPs: []string{}, Pubkeys: []string{}},
	}
}

func toLimitConfigs(ls []ratelimit.Limit) []limitConfig {
	out := make([]limitConfig, len(ls))
	for i, l := range ls {
		rate := l.Rate
		out[i] = limitConfig{Rate: &rate, Period: formatDuration(l.Period)}
		if c := l.EffectiveCost(); c != 1 {
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
// windows, and [] makes it free. Unknown fields, a second document and
// values of the wrong type are refused, naming the field.
func parseConfig(data []byte) (fileConfig, error) {
	return parseConfigOver(defaultFileConfig(), data)
}

// parseConfigOver decodes data over fc.
func parseConfigOver(fc fileConfig, data []byte) (fileConfig, error) {
	if len(data) > maxConfigSize {
		return fc, fmt.Errorf("%w: file is larger than %d bytes", errConfig, maxConfigSize)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := cleanYAMLError(err)
		if strings.Contains(msg, "cannot start any token") && bytes.Contains(data, []byte("\t")) {
			msg += " (YAML does not allow tabs for indentation)"
		}
		return fc, fmt.Errorf("%w: %s", errConfig, msg)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return fc, fmt.Errorf("%w: %s", errConfig, locate(&doc, err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return fc, fmt.Errorf("%w: the file holds more than one YAML document", errConfig)
	}
	return fc, nil
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
	return fc, nil
}

func cleanYAMLError(err error) string {
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

var (
	reUnknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type`)
	reCannot       = regexp.MustCompile("^line (\\d+): cannot unmarshal (\\S+)(?: `(.*)`)? into (.+)$")
)

// locate rewrites yaml.v3's "line 7: cannot unmarshal !!str `ten` into
// float64" into "limits.message.EVENT[0].rate (line 7): expected a number,
// got !!str `ten`", finding the field by its line in the document tree.
func locate(doc *yaml.Node, err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return cleanYAMLError(err)
	}
	var entries []entry
	walk(doc, "", &entries)
	msgs := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		if m := reUnknownField.FindStringSubmatch(e); m != nil {
			line, _ := strconv.Atoi(m[1])
			p := findEntry(entries, line, func(en entry) bool { return en.key == m[2] })
			msgs = append(msgs, fmt.Sprintf("%s (line %d): unknown field", p, line))
			continue
		}
		if m := reCannot.FindStringSubmatch(e); m != nil {
			line, _ := strconv.Atoi(m[1])
			val := m[3]
			p := findEntry(entries, line, func(en entry) bool {
				if en.value == nil {
					return false
				}
				if val == "" { // a collection: match its kind
					return (m[2] == "!!seq" && en.value.Kind == yaml.SequenceNode) ||
						(m[2] == "!!map" && en.value.Kind == yaml.MappingNode)
				}
				if v, ok := strings.CutSuffix(val, "..."); ok {
					return strings.HasPrefix(en.value.Value, v)
				}
				return en.value.Value == val
			})
			got := m[2]
			if val != "" {
				got += " `" + val + "`"
			}
			msgs = append(msgs, fmt.Sprintf("%s (line %d): expected %s, got %s", p, line, describeType(m[4]), got))
			continue
		}
		msgs = append(msgs, e)
	}
	return strings.Join(msgs, "; ")
}

func describeType(goType string) string {
	switch {
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "a whole number"
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map"), strings.HasPrefix(goType, "main."):
		return "a mapping"
	}
	return goType
}

// entry is one key of a mapping or one item of a sequence in the document,
// with the dotted path a message names it by.
type entry struct {
	line  int
	path  string
	key   string
	value *yaml.Node
}

func walk(n *yaml.Node, path string, out *[]entry) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			walk(c, path, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			*out = append(*out, entry{line: k.Line, path: p, key: k.Value, value: v})
			walk(v, p, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			*out = append(*out, entry{line: c.Line, path: p, value: c})
			walk(c, p, out)
		}
	}
	// Aliases are not followed: yaml.v3 bounds their expansion itself, and
	// a path through an alias would name the anchor's place anyway.
}

func findEntry(entries []entry, line int, match func(entry) bool) string {
	first := ""
	for _, en := range entries {
		if en.line != line {
			continue
		}
		if match(en) {
			return en.path
		}
		if first == "" {
			first = en.path
		}
	}
	if first == "" {
		return fmt.Sprintf("line %d", line)
	}
	return first
}

// validate checks every value and resolves the file into a config. The
// error names the field by its path, as in
// "limits.message.EVENT[1].rate: must be greater than cost 1".
func (fc *fileConfig) validate() (*config, error) {
	var errs []error
	bad := func(path, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if src := fc.from[path]; src != "" {
			msg += " (set by " + src + ")"
		}
		errs = append(errs, fmt.Errorf("%w: %s: %s", errConfig, path, msg))
	}
	c := &config{
		Listen:         fc.Listen,
		MetricsListen:  fc.MetricsListen,
		DataDir:        fc.DataDir,
		Upstream:       fc.Upstream,
		RelayURL:       fc.RelayURL,
		ReadLimit:      int64(fc.ReadLimit),
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
		if err := checkUpstream(fc.Upstream); err != nil {
			bad("upstream", "%v", err)
		}
	}
	if fc.RelayURL != "" {
		if err := checkRelayURL(fc.RelayURL); err != nil {
			bad("relay_url", "%v", err)
		}
	}
	if fc.ReadLimit < 1024 || fc.ReadLimit > maxReadLimit {
		bad("read_limit", "must be between 1024 and %d bytes, got %d", maxReadLimit, fc.ReadLimit)
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
		} else {
			c.Info.Pubkey = pk
		}
	}
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

	if fc.Store.Redis != "" {
		if err := checkRedisURL(fc.Store.Redis); err != nil {
			bad("store.redis", "%v", err)
		}
	}
	if fc.Store.Prefix == "" {
		// The Redis store reads "" as its default prefix; say so rather
		// than let "no prefix" quietly mean "sluice:".
		bad("store.prefix", "must not be empty (the default is \"sluice:\")")
	}
	if strings.ContainsAny(fc.Store.Prefix, "{}") {
		// Braces would end the key's hash tag early and scatter one
		// client's windows over cluster slots.
		bad("store.prefix", "must not contain { or }")
	}
	if len(fc.Store.Prefix) > 64 {
		bad("store.prefix", "must be at most 64 bytes")
	}
	if d, err := parseDuration(fc.Store.Timeout); err != nil {
		bad("store.timeout", "%v", err)
	} else if d < time.Millisecond || d > maxTimeout {
		bad("store.timeout", "must be between 1ms and %v, got %v", maxTimeout, d)
	} else {
		c.StoreTimeout = d
	}

	// A null where a list or mapping belongs would otherwise read as "no
	// limits at all": refuse it and say how to write what was meant.
	if fc.Limits.Connection == nil {
		bad("limits.connection", "must be a list of windows; write [] for no connection limit")
	}
	if fc.Limits.Message == nil {
		bad("limits.message", "must be a mapping of message types to windows; leave it out to keep the defaults")
	}
	var ok bool
	if c.Limits.Connection, ok = resolveLimits("limits.connection", fc.Limits.Connection, bad); !ok {
		c.Limits.Connection = nil
	}
	labels := make([]string, 0, len(fc.Limits.Message))
	for label := range fc.Limits.Message {
		labels = append(labels, label)
	}
	slices.Sort(labels) // errors in a stable order
	for _, label := range labels {
		path := "limits.message." + label
		t, known := relay.ParseType(label)
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
		// relay would still have to read and reject every frame.
		if t == relay.TypeOther && len(ls) == 0 {
			bad(path, "must have at least one window: the catch-all bucket is never free")
			continue
		}
		c.Limits.Message[t], _ = resolveLimits(path, ls, bad)
	}
	if n := fc.Limits.MaxFilters; n < 1 || n > maxFilters {
		bad("limits.max_filters", "must be between 1 and %d, got %d", maxFilters, n)
	} else {
		c.MaxFilters = int(n)
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
	labels = labels[:0]
	for label := range fc.Limits.FrameSize {
		labels = append(labels, label)
	}
	slices.Sort(labels)
	for _, label := range labels {
		path := "limits.frame_size." + label
		t, known := relay.ParseType(label)
		if !known {
			bad(path, "unknown message type; known are %s", forwardedTypes())
			continue
		}
		if t == relay.TypeOther {
			// OTHER frames are answered by the gate, never forwarded: a
			// size for them would bound nothing.
			bad(path, "OTHER frames are never forwarded; sizes are for %s", forwardedTypes())
			continue
		}
		n := fc.Limits.FrameSize[label]
		if n < minFrameSize || n > fc.ReadLimit {
			bad(path, "must be between %d and read_limit (%d) bytes, got %d", minFrameSize, fc.ReadLimit, n)
			continue
		}
		c.FrameSize[t] = int(n)
	}

	if fc.Quota.Events < 1 {
		bad("quota.events", "must be at least 1, got %d (set quota.unlimited: true to turn the quota off)", fc.Quota.Events)
	} else if fc.Quota.Events > ratelimit.MaxQuotaEvents {
		bad("quota.events", "must be at most %d, got %d (set quota.unlimited: true to turn the quota off)", ratelimit.MaxQuotaEvents, fc.Quota.Events)
	}
	if d, err := parseDuration(fc.Quota.Window); err != nil {
		bad("quota.window", "%v", err)
	} else if d < time.Second || d > maxPeriod {
		bad("quota.window", "must be between 1s and %v, got %v", maxPeriod, d)
	} else {
		c.QuotaWindow = d
	}

	if p := fc.Identity.IPv6Prefix; p < 16 || p > 128 {
		// Below /16 every IPv6 client of a continent would share one budget.
		bad("identity.ipv6_prefix", "must be between 16 and 128, got %d", p)
	}
	c.Identity.IPv6Prefix = int(fc.Identity.IPv6Prefix)
	c.Identity.TrustedProxies = resolvePrefixes("identity.trusted_proxies", fc.Identity.TrustedProxies, bad)
	c.Identity.Header = fc.Identity.Header
	if c.Identity.Header == "" {
		bad("identity.header", "must not be empty (X-Forwarded-For, X-Real-IP or another forwarding header)")
	} else if err := (&relay.Identity{Header: c.Identity.Header}).Validate(); err != nil {
		bad("identity.header", "%v", err)
	}

	resolvePrefixes("allow.ips", fc.Allow.IPs, bad)
	var pubkeys []string
	for i, s := range fc.Allow.Pubkeys {
		pk, err := parsePubkey(s)
		if err != nil {
			bad(fmt.Sprintf("allow.pubkeys[%d]", i), "%v", err)
			continue
		}
		pubkeys = append(pubkeys, pk)
	}

	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// A second line of defence: the library's own checks, which the
	// per-field checks above should leave nothing to find.
	if err := c.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("%w: limits: %v", errConfig, err)
	}
	if err := c.Identity.Validate(); err != nil {
		return nil, fmt.Errorf("%w: identity: %v", errConfig, err)
	}
	if len(fc.Allow.IPs) > 0 || len(pubkeys) > 0 {
		al, err := relay.NewAllowList(fc.Allow.IPs, pubkeys)
		if err != nil {
			return nil, fmt.Errorf("%w: allow: %v", errConfig, err)
		}
		c.Identity.Allow = al
	}
	return c, nil
}

func resolveLimits(path string, ls []limitConfig, bad func(string, string, ...any)) ([]ratelimit.Limit, bool) {
	if len(ls) > maxWindows {
		bad(path, "at most %d windows, got %d", maxWindows, len(ls))
		return nil, false
	}
	out := make([]ratelimit.Limit, 0, len(ls))
	ok := true
	periods := make(map[time.Duration]bool, len(ls))
	for i, lc := range ls {
		p := fmt.Sprintf("%s[%d]", path, i)
		fine := true
		cost := 1.0
		if lc.Cost != nil {
			cost = *lc.Cost
			if math.IsNaN(cost) || math.IsInf(cost, 0) || cost <= 0 {
				bad(p+".cost", "must be a number greater than 0, got %v", cost)
				fine = false
			}
		}
		var rate float64
		switch {
		case lc.Rate == nil:
			bad(p+".rate", "is required")
			fine = false
		case math.IsNaN(*lc.Rate) || math.IsInf(*lc.Rate, 0) || *lc.Rate > maxRate:
			bad(p+".rate", "must be a finite number at most %g, got %v", float64(maxRate), *lc.Rate)
			fine = false
		case fine && *lc.Rate <= cost:
			// R ≤ c can never admit a message, and its wait is undefined.
			bad(p+".rate", "must be greater than cost %v, got %v", cost, *lc.Rate)
			fine = false
		default:
			rate = *lc.Rate
		}
		var period time.Duration
		if lc.Period == "" {
			bad(p+".period", "is required")
			fine = false
		} else if d, err := parseDuration(lc.Period); err != nil {
			bad(p+".period", "%v", err)
			fine = false
		} else if d < time.Millisecond || d > maxPeriod || d%time.Millisecond != 0 {
			bad(p+".period", "must be a whole number of milliseconds between 1ms and %v, got %v", maxPeriod, d)
			fine = false
		} else if periods[d] {
			// Two windows of one period share one store key.
			bad(p+".period", "%v appears twice", d)
			fine = false
		} else {
			periods[d] = true
			period = d
		}
		if !fine {
			ok = false
			continue
		}
		l := ratelimit.Limit{Rate: rate, Period: period, Cost: cost}
		if rate/cost > maxRate {
			bad(p, "rate/cost is %g; a burst can be at most %g messages", rate/cost, float64(maxRate))
			ok = false
			continue
		}
		if l.Interval() < time.Microsecond {
			// Beyond this the math still works, but nothing real sends
			// that fast, and float rounding makes the interval 0.
			bad(p, "%s allows more than a million messages a second; lower rate or raise period", limitString(l))
			ok = false
			continue
		}
		out = append(out, l)
	}
	return out, ok
}

func resolvePrefixes(path string, ss []string, bad func(string, string, ...any)) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range ss {
		p, err := parsePrefix(s)
		if err != nil {
			bad(fmt.Sprintf("%s[%d]", path, i), "%v", err)
			continue
		}
		out = append(out, p)
	}
	return out
}

// parsePrefix reads a CIDR ("10.0.0.0/8", "2001:db8::/32") or a single
// address (taken as /32 or /128).
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not a CIDR: %q", s)
		}
		if p.Addr().Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("zones are not allowed: %q", s)
		}
		if p.Masked() != p {
			return netip.Prefix{}, fmt.Errorf("%q has host bits set (did you mean %v?)", s, p.Masked())
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("not an IP address or CIDR: %q", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parsePubkey accepts 64 hex digits or an npub and returns lower-case hex.
func parsePubkey(s string) (string, error) {
	if strings.HasPrefix(s, "npub1") {
		prefix, v, err := nip19.Decode(s)
		if err != nil || prefix != "npub" {
			return "", fmt.Errorf("not a valid npub: %q", s)
		}
		pk, _ := v.(string)
		return pk, nil
	}
	if len(s) != 64 {
		return "", fmt.Errorf("must be 64 hex digits or an npub, got %q", s)
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			return "", fmt.Errorf("must be 64 hex digits or an npub, got %q", s)
		}
	}
	return strings.ToLower(s), nil
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

// checkRelayURL checks relay_url as the gate will read it (a ws:// or
// wss:// URL with a host), and refuses what no public relay URL has: an
// AUTH relay tag is compared by host and path, so credentials, a query or
// a fragment could only be a mistake.
func checkRelayURL(s string) error {
	if err := checkUpstream(s); err != nil {
		return err
	}
	u, _ := url.Parse(s) // checkUpstream parsed it
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return fmt.Errorf("must have no query or fragment, got %q", s)
	}
	return nil
}

func checkUpstream(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("not a URL: %q", s)
	}
	if u.Scheme != "ws" && u.Scheme != "wss" {
		return fmt.Errorf("must be a ws:// or wss:// URL, got %q", s)
	}
	if u.Host == "" {
		return fmt.Errorf("has no host: %q", s)
	}
	if u.User != nil {
		return errors.New("must not carry credentials")
	}
	return nil
}

// checkRedisURL parses the URL the way start-up will, with
// redisstore.NewClient (which does not dial), and drops the client. Its
// error never repeats the password.
func checkRedisURL(s string) error {
	client, err := redisstore.NewClient(s)
	if err != nil {
		return err
	}
	return client.Close()
}

// forwardedTypes lists the types limits.frame_size may name: every type
// but the catch-all, whose frames are never forwarded.
func forwardedTypes() string {
	names := make([]string, 0, relay.NumTypes-1)
	for t := relay.Type(1); t < relay.NumTypes; t++ {
		names = append(names, t.String())
	}
	return strings.Join(names, ", ")
}

func knownTypes() string {
	names := make([]string, 0, relay.NumTypes)
	for t := relay.Type(1); t < relay.NumTypes; t++ {
		names = append(names, t.String())
	}
	return strings.Join(append(names, relay.TypeOther.String()), ", ")
}
