// Command sluice runs a Nostr relay behind a rate-limit gate, or the gate in
// front of any relay.
//
//	sluice relay                         a complete relay on ./data, memory limits
//	sluice relay --redis redis://…       the same, limits shared through Redis
//	sluice proxy --upstream ws://…       the gate in front of another relay
//	sluice check --config sluice.yaml    validate a config, print what its limits allow
//
// Run "sluice help" for the flags and the environment variables. This
// package only wires: the gate lives in package relay, the limiter in
// package ratelimit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…"; otherwise
// the module version from the build info is used.
var version = ""

// Exit codes: 2 for a usage or configuration mistake (nothing was started),
// 1 for a failure while running.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// SIGHUP reloads the configuration (reload.go); asked for before
	// anything else, so that one sent while sluice starts does not end it
	// (Go's default for an unhandled SIGHUP).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	hangups = hup
	for _, name := range unknownEnv(os.Environ()) {
		// A typo (SLUICE_REDIS_URL) would otherwise run with memory
		// budgets, silently unshared; a warning, since other tools may
		// use the prefix too.
		fmt.Fprintf(os.Stderr, "sluice: warning: ignoring unknown environment variable %s (sluice reads %s)\n",
			name, strings.Join(knownEnv, ", "))
	}
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// knownEnv is every environment variable sluice reads.
var knownEnv = []string{"SLUICE_CONFIG", "SLUICE_LISTEN", "SLUICE_METRICS_LISTEN", "SLUICE_DATA_DIR", "SLUICE_DATABASE",
	"SLUICE_UPSTREAM", "SLUICE_RELAY_URL", "SLUICE_REDIS", "SLUICE_LOG_FORMAT", "SLUICE_LOG_LEVEL"}

// unknownEnv returns the names of SLUICE_* variables in environ (as
// os.Environ gives it) that sluice does not read.
func unknownEnv(environ []string) []string {
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SLUICE_") && !slices.Contains(knownEnv, name) {
			unknown = append(unknown, name)
		}
	}
	return unknown
}

const usageText = `sluice — a rate-limit gate for Nostr relays.

Usage:
  sluice relay [flags]     run a complete relay (khatru + on-disk events) behind the gate
  sluice proxy [flags]     run the gate in front of another relay (--upstream ws://host:port)
  sluice check [flags]     validate the configuration and print what every limit allows
  sluice health [--url U]  ask a running sluice whether it is ready; exit 0 or 1
  sluice version           print the version
  sluice help [command]    print this help, or a command's flags

Start here:
  sluice relay                          a relay on 127.0.0.1:7777, events in ./data
  sluice check                          the built-in limits, in bursts and rates
  sluice check --config my.yaml         what your config means, or what is wrong with it
  sluice proxy --upstream ws://127.0.0.1:7000 --listen 0.0.0.0:7777

Configuration comes from, lowest to highest precedence:
  1. built-in defaults (sluice.example.yaml spells out every one, with comments)
  2. the YAML file given by --config or SLUICE_CONFIG
  3. environment variables SLUICE_LISTEN, SLUICE_METRICS_LISTEN, SLUICE_DATA_DIR,
     SLUICE_DATABASE, SLUICE_UPSTREAM, SLUICE_RELAY_URL, SLUICE_REDIS, SLUICE_LOG_FORMAT,
     SLUICE_LOG_LEVEL
  4. flags

Budgets live in this process's memory unless --redis names a Redis server
(redis://, rediss://, unix://, redis+sentinel://, redis+cluster://); then every
sluice pointing at it shares them.

Metrics for Prometheus are served on --metrics-listen (127.0.0.1:9777 by
default) at /metrics, with /healthz (the process serves) and /readyz (the
store decides and, for proxy, the upstream accepts a WebSocket). SIGINT or SIGTERM shuts down gracefully;
SIGHUP reloads the configuration file (limits, kind classes, tiers and their
pubkey files, aggregates, mode, quotas, allow-lists) without dropping a
connection, and keeps the running one if the new file is invalid.
`

// flagValues holds the flags every subcommand shares.
type flagValues struct {
	config, listen, metricsListen, dataDir, database, upstream, redis, logFormat, logLevel string
	offline                                                                                bool // check: do not dial Redis
}

// newFlagSet returns the flag set of cmd; the flags it declares depend on
// what cmd uses.
func newFlagSet(cmd string, out io.Writer) (*flag.FlagSet, *flagValues) {
	fs := flag.NewFlagSet("sluice "+cmd, flag.ContinueOnError)
	fs.SetOutput(out)
	v := &flagValues{}
	fs.StringVar(&v.config, "config", "", "YAML config `file` (default: built-in defaults; env SLUICE_CONFIG)")
	fs.StringVar(&v.listen, "listen", "", "`host:port` clients connect to (default 127.0.0.1:7777; env SLUICE_LISTEN)")
	fs.StringVar(&v.metricsListen, "metrics-listen", "", "`host:port` for Prometheus /metrics, \"\" for none (default 127.0.0.1:9777; env SLUICE_METRICS_LISTEN)")
	fs.StringVar(&v.redis, "redis", "", "Redis `URL` to share limits; empty keeps them in memory (env SLUICE_REDIS)")
	fs.StringVar(&v.logFormat, "log-format", "", "log `format`: text or json (default text; env SLUICE_LOG_FORMAT)")
	fs.StringVar(&v.logLevel, "log-level", "", "log `level`: debug, info, warn, error (default info; env SLUICE_LOG_LEVEL)")
	if cmd != "proxy" {
		fs.StringVar(&v.dataDir, "data-dir", "", "`directory` of the event database (default ./data; env SLUICE_DATA_DIR)")
		fs.StringVar(&v.database, "database", "", "postgres:// `URL` keeping events in PostgreSQL, shared by every sluice relay on it; empty: badger in --data-dir (env SLUICE_DATABASE)")
	}
	if cmd != "relay" {
		fs.StringVar(&v.upstream, "upstream", "", "ws:// or wss:// `URL` of the relay to protect (env SLUICE_UPSTREAM)")
	}
	if cmd == "check" {
		fs.BoolVar(&v.offline, "offline", false, "do not dial the Redis store (by default check PINGs it, and fails when it does not answer)")
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice %s [flags]\n\n%s\n\nFlags (-flag and --flag both work):\n", cmd, commandHelp[cmd])
		fs.PrintDefaults()
	}
	return fs, v
}

var commandHelp = map[string]string{
	"relay": `Runs a complete Nostr relay: khatru with events stored on disk under
--data-dir (badger), or in PostgreSQL with --database, shared by every
sluice relay on it (events published through one reach the subscribers of
all), the gate in front. Serves NIP-11 with the limits in
"limitation" and "rate_limits", and sends every connection a NIP-42
challenge (set relay_url, or SLUICE_RELAY_URL, to the public wss:// URL).`,
	"proxy": `Runs the gate in front of the relay at --upstream. Admitted frames are
forwarded byte for byte; NIP-11 requests get the upstream's document with
sluice's limits merged in.`,
	"check": `Validates the configuration (file, environment and flags, as relay and proxy
would see them) and prints, for every limit, the burst it allows from rest
and the rate it sustains after. Exits 2 and names the field when something
is wrong. With a Redis store it dials Redis and PINGs it, and exits 1 when
that fails (--offline skips it).`,
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "-h", "-help", "--help", "help":
		if len(rest) > 0 {
			if rest[0] == "health" {
				return runHealth([]string{"-help"}, getenv, stdout, stdout)
			}
			if _, ok := commandHelp[rest[0]]; ok {
				fs, _ := newFlagSet(rest[0], stdout)
				fs.Usage()
				return exitOK
			}
			if rest[0] != "version" {
				fmt.Fprintf(stderr, "sluice help: unknown command %q\n\n%s", rest[0], usageText)
				return exitUsage
			}
		}
		fmt.Fprint(stdout, usageText)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, "sluice", buildVersion())
		return exitOK
	case "health":
		return runHealth(rest, getenv, stdout, stderr)
	case "relay", "proxy", "check":
	default:
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", cmd, usageText)
		return exitUsage
	}

	fs, fv := newFlagSet(cmd, stderr)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice %s: unexpected argument %q (flags start with --)\n", cmd, fs.Arg(0))
		return exitUsage
	}
	cfg, err := loadConfig(fs, fv, getenv)
	if err == nil && cmd == "proxy" && cfg.Upstream == "" {
		err = fmt.Errorf("%w: upstream: sluice proxy needs the relay to protect: --upstream ws://host:port", errConfig)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice %s: invalid configuration:\n%s\n", cmd, indent(err))
		return exitUsage
	}
	if cmd == "check" {
		printCheck(stdout, cfg)
		if cfg.Redis != "" && !fv.offline {
			if err := pingRedis(ctx, cfg); err != nil {
				fmt.Fprintf(stderr, "sluice check: %v\n", err)
				return exitFailure
			}
			fmt.Fprintln(stdout, "redis: answered PING")
		}
		return exitOK
	}

	logger := newLogger(cfg, stderr)
	// Libraries that log with the standard log package (eventstore's
	// migrations, go-redis) then write through the same handler, so JSON
	// logs stay JSON.
	slog.SetDefault(logger)
	// A reload reads what start-up read: the same file, environment and
	// flags.
	load := func() (*config, error) { return loadConfig(fs, fv, getenv) }
	switch cmd {
	case "relay":
		err = runRelay(ctx, cfg, logger, load)
	case "proxy":
		err = runProxy(ctx, cfg, logger, load)
	}
	if err != nil {
		logger.Error("sluice stopped", "err", err)
		if errors.Is(err, errConfig) {
			return exitUsage
		}
		return exitFailure
	}
	return exitOK
}

// loadConfig layers defaults, the file, the environment and the flags,
// then validates the result.
func loadConfig(fs *flag.FlagSet, fv *flagValues, getenv func(string) string) (*config, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	path := getenv("SLUICE_CONFIG")
	if set["config"] {
		path = fv.config
	}
	fc := defaultFileConfig()
	if path != "" {
		var err error
		if fc, err = loadConfigFile(path); err != nil {
			return nil, err
		}
	}
	overrides := []struct {
		flag, env, path string
		field           *string
		value           string
	}{
		{"listen", "SLUICE_LISTEN", "listen", &fc.Listen, fv.listen},
		{"metrics-listen", "SLUICE_METRICS_LISTEN", "metrics_listen", &fc.MetricsListen, fv.metricsListen},
		{"data-dir", "SLUICE_DATA_DIR", "data_dir", &fc.DataDir, fv.dataDir},
		{"database", "SLUICE_DATABASE", "database", &fc.Database, fv.database},
		{"upstream", "SLUICE_UPSTREAM", "upstream", &fc.Upstream, fv.upstream},
		{"", "SLUICE_RELAY_URL", "relay_url", &fc.RelayURL, ""}, // no flag: set once per deployment
		{"redis", "SLUICE_REDIS", "store.redis", &fc.Store.Redis, fv.redis},
		{"log-format", "SLUICE_LOG_FORMAT", "log.format", &fc.Log.Format, fv.logFormat},
		{"log-level", "SLUICE_LOG_LEVEL", "log.level", &fc.Log.Level, fv.logLevel},
	}
	fc.from = map[string]string{}
	for _, o := range overrides {
		// An environment variable that is set but empty is ignored, so
		// SLUICE_REDIS= in a compose file does not silently win over the
		// file; a flag given as --redis "" does win (that is explicit).
		if v := getenv(o.env); v != "" {
			*o.field = v
			fc.from[o.path] = o.env
		}
		if o.flag != "" && set[o.flag] {
			*o.field = o.value
			fc.from[o.path] = "--" + o.flag
		}
	}
	return fc.validate()
}

// indent renders a (possibly joined) error one problem per line.
func indent(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = "  " + strings.TrimPrefix(l, errConfig.Error()+": ")
	}
	return strings.Join(lines, "\n")
}

func newLogger(cfg *config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated already
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		// slog's JSON handler writes a time.Duration as integer
		// nanoseconds ("timeout":10000000000); write it as the text
		// handler and the config file do ("10s").
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
