package main

import (
	"strconv"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// This file is the configuration's schema: the YAML file field for field
// (fileConfig and its sections, the policy sections included), its
// defaults (sluice.example.yaml spells them out), and the validated config
// the subcommands run on. config_yaml.go decodes a file into a fileConfig,
// config_check.go checks it, config_convert.go turns it into the library's
// types (policy.Config, relay.Options) and maps the library's errors back
// onto the file's fields.

// fileConfig is the YAML file, field for field. Durations are strings,
// parsed by validate so that an error can name the field; pointers mark
// values whose absence differs from their zero.
type fileConfig struct {
	Listen        string `yaml:"listen"`
	MetricsListen string `yaml:"metrics_listen"`
	DataDir       string `yaml:"data_dir"`
	Database      string `yaml:"database"`
	Upstream      string `yaml:"upstream"`
	// UpstreamVerifies: the upstream verifies event signatures
	// (relay.Options.UpstreamVerifies).
	UpstreamVerifies boolean `yaml:"upstream_verifies"`
	// Auth is who does NIP-42 behind sluice proxy: "relay" (the relay's
	// challenges, passed on) or "gate" (relay.Options.GateAuth).
	Auth          string         `yaml:"auth"`
	RelayURL      string         `yaml:"relay_url"`
	ReadLimit     integer        `yaml:"read_limit"`
	MaxSyncEvents integer        `yaml:"max_sync_events"`
	Mode          string         `yaml:"mode"`
	Log           logConfig      `yaml:"log"`
	Info          infoConfig     `yaml:"info"`
	Store         storeConfig    `yaml:"store"`
	Limits        limitsConfig   `yaml:"limits"`
	Quota         quotaConfig    `yaml:"quota"`
	Penalty       penaltyConfig  `yaml:"penalty"`
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
	// MaxQueuedBytes bounds what may wait for one client, past which it
	// is cut (relay.Options.QueueBytes).
	MaxQueuedBytes integer `yaml:"max_queued_bytes"`
	// FrameSize holds only the types the file names; the others keep
	// relay.Options.Resolved, which for EVENT is read_limit whatever
	// read_limit is set to (a number in the defaults could not say that).
	FrameSize map[string]integer `yaml:"frame_size"`
	// Kinds are the EVENT kind classes by name (policy.go).
	Kinds map[string]kindClassConfig `yaml:"kinds"`
	// MaxDelay is how long a frame whose wait is that short is held
	// rather than refused (policy.Limits.MaxDelay); "0s" holds nothing.
	MaxDelay string `yaml:"max_delay"`
	// Read is the read budget in bytes (policy.Limits.Read); ReadCost the
	// price of a filter by its shape (policy.ReadCost).
	Read     []limitConfig  `yaml:"read"`
	ReadCost readCostConfig `yaml:"read_cost"`
}

// readCostConfig is limits.read_cost (policy.ReadCost).
type readCostConfig struct {
	Narrow      integer `yaml:"narrow"`
	Wide        integer `yaml:"wide"`
	Scrape      integer `yaml:"scrape"`
	ScrapeLimit integer `yaml:"scrape_limit"`
	ScrapeSpan  string  `yaml:"scrape_span"`
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

// penaltyConfig is the penalty box (policy.Config.Penalty), off unless
// enabled.
type penaltyConfig struct {
	Enabled   boolean `yaml:"enabled"`
	Threshold number  `yaml:"threshold"`
	HalfLife  string  `yaml:"half_life"`
	Ban       string  `yaml:"ban"`
	MaxBan    string  `yaml:"max_ban"`
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

// config is a validated configuration: what the subcommands run on.
type config struct {
	Listen        string
	MetricsListen string // "" turns the metrics listener off
	DataDir       string
	Database      string // sluice relay: "" keeps events in badger under DataDir; a postgres:// URL shares them
	Upstream      string // "" unless proxy mode
	// UpstreamVerifies is upstream_verifies (relay.Options.UpstreamVerifies).
	UpstreamVerifies bool
	// GateAuth is auth: gate (relay.Options.GateAuth).
	GateAuth      bool
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
	// ReadCost is limits.read_cost.
	ReadCost policy.ReadCost
	// MaxFilters is limits.max_filters.
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
	// QueueBytes is limits.max_queued_bytes (relay.Options.QueueBytes).
	QueueBytes int
	// FrameSize is limits.frame_size by type; 0 means
	// relay.Options.Resolved.
	FrameSize [wire.NumTypes]int

	QuotaEvents    int
	QuotaWindow    time.Duration
	QuotaUnlimited bool

	// Penalty is the penalty box when penalty.enabled, else nil.
	Penalty *ratelimit.Penalty

	// Identity says who a client is, and holds allow.ips and
	// allow.pubkeys (AllowIPs, AllowPubkeys).
	Identity policy.Identity

	// Shadow is mode: shadow. Kinds, Tiers and Aggregates are the
	// policy's, in the order of their paths (see libPaths); a tier's
	// quota is built with the store (buildPolicy).
	Shadow     bool
	Kinds      []policy.Class
	Tiers      []tierSpec
	Aggregates []policy.Aggregate
}

// defaultFileConfig returns the configuration used when no file is given.
// sluice.example.yaml spells out exactly this (a test holds them equal).
func defaultFileConfig() fileConfig {
	def := policy.DefaultLimits()
	gate := relay.Options{}.Resolved()
	msg := make(map[string][]limitConfig, wire.NumTypes)
	for t := wire.Type(0); t < wire.NumTypes; t++ {
		msg[t.String()] = toLimitConfigs(def.Message[t])
	}
	return fileConfig{
		Listen:        "127.0.0.1:7777",
		Mode:          "enforce",
		Auth:          "relay",
		MetricsListen: "127.0.0.1:9777",
		DataDir:       "./data",
		ReadLimit:     integer(gate.ReadLimit),
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
			MaxFilters:       integer(wire.DefaultBounds().MaxFilters),
			MaxEventTags:     integer(wire.DefaultBounds().MaxTags),
			MaxTagValueBytes: integer(wire.DefaultBounds().MaxTagValueBytes),
			MaxFilterValues:  integer(wire.DefaultBounds().MaxFilterValues),
			MaxFilterFanout:  integer(wire.DefaultBounds().MaxFanout),
			Subscriptions:    integer(gate.MaxSubscriptions),
			Syncs:            integer(gate.MaxSyncs),
			MaxFilterBytes:   integer(gate.MaxFilterBytes),
			MaxQueuedBytes:   integer(gate.QueueBytes),
			MaxConnections:   integer(gate.MaxConnections),
			FrameSize:        map[string]integer{},
			Kinds:            map[string]kindClassConfig{},
			MaxDelay:         formatDuration(def.MaxDelay),
			Read:             toLimitConfigs(def.Read),
			ReadCost:         defaultReadCost(),
		},
		Quota:   quotaConfig{Events: 600, Window: "60s"},
		Penalty: penaltyConfig{Threshold: 10, HalfLife: "10m", Ban: "1m", MaxBan: "1h"},
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

// kindClassConfig is one limits.kinds entry.
type kindClassConfig struct {
	Kinds  []kindSpec    `yaml:"kinds"`
	Limits []limitConfig `yaml:"limits"`
}

// tierConfig is one tiers entry.
type tierConfig struct {
	Pubkeys     []string         `yaml:"pubkeys"`
	PubkeysFile string           `yaml:"pubkeys_file"`
	Limits      tierLimitsConfig `yaml:"limits"`
	Quota       *tierQuotaConfig `yaml:"quota"`
}

// tierLimitsConfig is a tier's limits: per message type only (a
// connection is charged at its upgrade, before any AUTH).
type tierLimitsConfig struct {
	Message map[string][]limitConfig `yaml:"message"`
}

// tierQuotaConfig is a tier's quota; a field left out is the global
// quota's.
type tierQuotaConfig struct {
	Events    *integer `yaml:"events"`
	Window    string   `yaml:"window"`
	Unlimited boolean  `yaml:"unlimited"`
}

// aggregateConfig is one identity.ipv6_aggregate or ipv4_aggregate entry.
type aggregateConfig struct {
	Prefix *integer      `yaml:"prefix"`
	Limits []limitConfig `yaml:"limits"`
	Read   []limitConfig `yaml:"read"` // policy.Aggregate.Read, bytes
}

// tierSpec is a validated tier: the policy's Tier without its quota,
// which is built on the store the binary runs (buildPolicy).
type tierSpec struct {
	policy.Tier
	// QuotaSet: the tier has a quota of its own, of QuotaEvents per
	// QuotaWindow, or none when QuotaUnlimited.
	QuotaSet       bool
	QuotaEvents    int
	QuotaWindow    time.Duration
	QuotaUnlimited bool
	// File is the pubkeys_file as resolved ("" for none).
	File string
	// from says where each of Pubkeys came from: k ≥ 0 is pubkeys[k], -n
	// is line n of File.
	from []int32
}

// defaultReadCost is limits.read_cost as the library's defaults have it.
func defaultReadCost() readCostConfig {
	rc := policy.ReadCost{}.Resolved()
	return readCostConfig{
		Narrow: integer(rc.Narrow), Wide: integer(rc.Wide), Scrape: integer(rc.Scrape),
		ScrapeLimit: integer(rc.ScrapeLimit), ScrapeSpan: spanString(rc.ScrapeSpan),
	}
}
