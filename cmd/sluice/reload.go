package main

import (
	"context"
	"log/slog"
	"os"
	"reflect"
	"strings"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
)

// hangups receives SIGHUP when main has asked for it (nil in tests that
// call run directly): each one reloads the configuration.
var hangups <-chan os.Signal

// reloader re-reads the configuration on SIGHUP and applies what can
// change while sluice runs: the policy (limits, kind classes, tiers and
// their pubkey files, aggregates, mode, quotas, identity and allow-lists)
// and the NIP-11 document. The rest is bound at start-up; a change to it
// is reported and not applied.
type reloader struct {
	load   func() (*config, error) // the file, the environment and the flags, as at start-up
	start  *config                 // the configuration sluice started with
	gate   *relay.Gate
	parts  *limiterParts
	m      *metrics
	logger *slog.Logger
	// nip11 publishes the document of a configuration (restart-only
	// fields as at start-up) and its policy, the gate's running one; nil
	// for none.
	nip11 func(cfg *config, pc policy.Config)
}

// restartFields are the fields a reload does not apply, by path, with
// how each is read from a config.
var restartFields = []struct {
	path string
	get  func(*config) any
}{
	{"listen", func(c *config) any { return c.Listen }},
	{"metrics_listen", func(c *config) any { return c.MetricsListen }},
	{"data_dir", func(c *config) any { return c.DataDir }},
	{"database", func(c *config) any { return c.Database }},
	{"upstream", func(c *config) any { return c.Upstream }},
	{"relay_url", func(c *config) any { return c.RelayURL }},
	{"read_limit", func(c *config) any { return c.ReadLimit }},
	{"max_sync_events", func(c *config) any { return c.MaxSyncEvents }},
	{"limits.frame_size", func(c *config) any { return c.FrameSize }},
	{"limits.subscriptions", func(c *config) any { return c.Subscriptions }},
	{"limits.max_connections", func(c *config) any { return c.MaxConnections }},
	{"limits.syncs", func(c *config) any { return c.Syncs }},
	{"limits.max_filter_bytes", func(c *config) any { return c.MaxFilterBytes }},
	{"limits.max_queued_bytes", func(c *config) any { return c.QueueBytes }},
	{"log.format", func(c *config) any { return c.LogFormat }},
	{"log.level", func(c *config) any { return c.LogLevel }},
	{"store.redis", func(c *config) any { return c.Redis }},
	{"store.prefix", func(c *config) any { return c.Prefix }},
	{"store.timeout", func(c *config) any { return c.StoreTimeout }},
}

// run reloads at every SIGHUP until ctx is done.
func (r *reloader) run(ctx context.Context) {
	if hangups == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hangups:
			_ = r.reload()
		}
	}
}

// reload loads, validates and compiles the configuration and makes its
// policy the gate's. An invalid configuration is refused (logged at
// error, the field named) and the running policy kept.
func (r *reloader) reload() error {
	cfg, err := r.load()
	if err != nil {
		r.logger.Error("reload refused: invalid configuration; the running configuration is kept", "err", indentOneLine(err))
		return err
	}
	var changed []string
	for _, f := range restartFields {
		if !reflect.DeepEqual(f.get(cfg), f.get(r.start)) {
			changed = append(changed, f.path)
		}
	}
	// What needs a restart stays as it started, in everything derived
	// from cfg (the NIP-11 document says what is enforced).
	eff := *cfg
	eff.Listen, eff.MetricsListen, eff.DataDir, eff.Upstream = r.start.Listen, r.start.MetricsListen, r.start.DataDir, r.start.Upstream
	eff.RelayURL, eff.ReadLimit, eff.FrameSize = r.start.RelayURL, r.start.ReadLimit, r.start.FrameSize
	eff.Subscriptions, eff.MaxConnections, eff.Syncs = r.start.Subscriptions, r.start.MaxConnections, r.start.Syncs
	eff.MaxFilterBytes, eff.QueueBytes = r.start.MaxFilterBytes, r.start.QueueBytes
	eff.LogFormat, eff.LogLevel = r.start.LogFormat, r.start.LogLevel
	eff.Redis, eff.Prefix, eff.StoreTimeout = r.start.Redis, r.start.Prefix, r.start.StoreTimeout

	pc, err := buildPolicy(&eff, r.parts.quotas.make)
	if err == nil {
		err = r.gate.Reload(pc)
	}
	if err != nil {
		r.logger.Error("reload refused: the policy does not compile; the running configuration is kept", "err", err)
		return err
	}
	if len(changed) > 0 {
		r.logger.Warn("reload: these fields need a restart to change; they keep their start-up values (the rest is applied)", "fields", changed)
	}
	r.parts.policy = pc
	r.m.setPolicy(pc)
	if r.nip11 != nil {
		r.nip11(&eff, pc)
	}
	members, shadow := 0, 0
	for _, t := range pc.Tiers {
		members += len(t.Pubkeys)
	}
	for _, n := range shadowWindows(pc) {
		shadow += n
	}
	mode := "enforce"
	if pc.Shadow {
		mode = "shadow"
	}
	r.logger.Info("configuration reloaded", "mode", mode, "kind_classes", len(pc.Kinds), "tiers", len(pc.Tiers),
		"members", members, "aggregates", len(pc.Aggregates), "shadow_windows", shadow, "max_filters", reqFilters(pc))
	return nil
}

// indentOneLine renders a (possibly joined) config error on one line.
func indentOneLine(err error) string {
	lines := strings.Split(indent(err), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.Join(lines, "; ")
}

// publishNIP11 returns the reloader's nip11 for handler h, whose fallback
// document fallback builds from the same limitation h merges.
func publishNIP11(h *nip11.Handler, fallback func(cfg *config, lim nip11.Limitation) ([]byte, error)) func(*config, policy.Config) {
	return func(cfg *config, pc policy.Config) {
		lim := nip11Limitation(cfg, pc)
		fb, err := fallback(cfg, lim)
		if err != nil {
			fb = nil // keep the one before
		}
		h.SetLimitation(lim, fb)
	}
}
