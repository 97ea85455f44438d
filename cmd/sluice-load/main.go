// Command sluice-load puts a Nostr relay under load and reports what it
// measured: N WebSocket connections publishing pre-signed events, opening
// REQs, or just connecting, against any ws:// URL; or slow readers next to
// honest clients (stall, backlog, slowread). It also serves plain
// khatru, set up as sluice relay sets up its own, as the peer to compare
// sluice relay against.
//
//	sluice-load publish -url ws://127.0.0.1:7777 -conns N -events M [-inflight K] [-duration D] [-xff] [-size BYTES] [-kind K] [-keys K] [-live URL]
//	sluice-load req     -url ws://127.0.0.1:7777 -conns N -reqs M [-filters F] [-filter JSON] [-inflight K] [-xff]
//	sluice-load connect -url ws://127.0.0.1:7777 -conns N [-hold D] [-churn K] [-xff]
//	sluice-load khatru  -listen 127.0.0.1:7778 -data DIR|-database URL [-metrics HOST:PORT]
//	sluice-load stall    -url ws://127.0.0.1:7777 [-stallers K] [-stall-read BYTES/S] [-rcvbuf BYTES] [-publishers P] [-rate R] [-duration D] [-xff]
//	sluice-load backlog  -url ws://127.0.0.1:7777 [-read BYTES/S] [-filters F] [-event-rate R] [-count-rate R] [-duration D] [-metrics URL,...] [-xff]
//	sluice-load slowread -url ws://127.0.0.1:7777 [-read BYTES/S] [-rcvbuf BYTES] [-duration D] [-xff]
//
// Every load mode also takes -timeout (for a dial, and for a reply; default
// 10s), -parallel (dials in flight while setting up; default 64) and -json
// (the report as one JSON object on stdout).
//
// publish signs every event before the clock starts (one key per
// connection, or a pool of -keys keys shared round-robin), opens every
// connection, then starts the clock: each connection sends its share of
// the events, the next one as soon as an OK frees a slot (one in flight,
// or -inflight K), and measures each event from its write to its OK. The
// rate is OK true per second of wall time. -duration stops the sending
// early; what was sent is still awaited. -live URL subscribes once, at
// URL (another instance of a relay that shares its events, or -url
// itself), to new kind-1 events before the clock starts, and times each
// event from its write to its arrival there.
//
// req sends REQs with distinct subscription ids, each of -filters copies
// of -filter, measures each from its write to its EOSE, and closes it.
//
// connect opens -conns connections (the rate is upgrades per second and
// the latency is dial→upgrade), holds them for -hold, and closes them;
// with -churn K, -conns workers open and close K connections in all.
//
// -xff sends each connection (in connect -churn, each worker) its own
// X-Forwarded-For, 10.0.0.1, 10.0.0.2, …: a gate that trusts the tool's
// address (sluice: identity.trusted_proxies: ["127.0.0.1/32"]) sees that
// many clients.
//
// The slow-reader modes put one slow client (or several from one address)
// next to honest ones. Each first fills the store with -fill events of
// -size bytes (default 1,000 of 3,000: a 1,000-event REQ result of ~3 MB),
// then:
//
// stall measures what a stalled subscriber costs everyone else. -stallers
// connections, all with the X-Forwarded-For -stall-xff (one address), each
// with a -rcvbuf receive buffer (default 4096; the kernel doubles it)
// read at -stall-read bytes a second (0, the default: never), subscribe
// to every new kind-1 event ({"kinds":[1],"limit":0}) and then ask for the
// stored set -stall-filters times over in one REQ (default 2: ~6 MB, more
// than a 4 MiB queue holds), so that what the relay owes them is past any
// queue bound while it broadcasts to them. A staller that is cut comes
// back (-reconnect), after -redial when its upgrade is refused. After
// -settle, -publishers honest clients publish kind-1 events on a schedule
// of -rate a second each (an open loop: a stall shows as latency, not as
// fewer samples) for -duration, and one honest subscriber, subscribed
// after the stallers, times each event from its write to its arrival. The
// report: the honest publish OK latency (write→OK) and live delivery
// latency, what went unanswered or undelivered within -timeout of the
// end, and how often and how soon the stallers were cut. -stallers 0 is
// the unloaded case.
//
// backlog keeps what the relay owes one client behind for -duration
// (default 150s): the client asks for the stored set ({"kinds":[1],
// "limit":1000}, staying subscribed; -filters 2 asks for it twice over,
// past a 4 MiB queue), reads -read bytes a second (default
// 16000), and meanwhile sends EVENTs (-event-rate, default 2 a second) and
// COUNTs (-count-rate, default 10), both within sluice's default limits.
// Every URL in -metrics (Prometheus text: sluice's metrics listener, or
// sluice-load khatru -metrics) is sampled every -sample for go_goroutines
// and process_resident_memory_bytes; the report has the first, last and
// largest of each, the frames sent and answered, and whether the client
// was cut.
//
// slowread is the slowest steady reader: one client sends one REQ
// ({"kinds":[1],"limit":1000}) and reads its result at -read bytes a
// second until its EOSE (the whole result: not cut), its cut, or
// -duration.
//
// A client of these modes learns it was cut by its reads, or, when it
// reads nothing or is far behind, by an empty ping it writes every -probe
// (1s): a relay that has closed the socket answers it with a reset. A cut
// is therefore found within about a second.
//
// khatru -metrics serves the plain khatru process's go_goroutines and
// process_resident_memory_bytes, as sluice's metrics listener does, for
// backlog's -metrics.
//
// testdata/slow.yaml is the sluice config of the slow-reader figures in
// docs/BENCHMARKS.md, and testdata/slowrounds.sh runs them.
//
// Replies are counted by the NIP-01 prefix of their reason: "" for OK true
// (publish) or EOSE (req), "rate-limited:", "error:", "invalid:",
// "duplicate:", …; failed upgrades by HTTP status. A run that sets up no
// connection at all exits 1; bad flags exit 2.
//
// The text report's format (<…> stands for a run's own figures; results,
// with the commands that produced them, are in docs/BENCHMARKS.md,
// "`sluice relay` against plain khatru, from outside (`cmd/sluice-load`)"):
//
//	$ sluice-load publish -url ws://127.0.0.1:7777 -conns 64 -events 20000 -xff
//	sluice-load publish ws://127.0.0.1:7777
//	  params       events=20000 inflight=1 keys=64 kind=1 size=64 xff=true
//	  connections  64 of 64 set up
//	  events sent  20000
//	  OKs          20000 (OK true <a>)
//	  elapsed      <t>s
//	  rate         <r> events/s (OK true per second of wall time)
//	  latency      p50 <ms>ms  p90 <ms>ms  p99 <ms>ms  max <ms>ms  (20000 samples)
//	  replies by prefix
//	    ""                       <a>
//	    "rate-limited:"          <20000 - a>
//	  connection failures
//	    (none)
//
// Against sluice's default EVENT limit (a burst of 10 per client, then
// about 6.6 a second) most of such a run's events are rate-limited.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// errUsage marks a usage error (exit 2).
var errUsage = errors.New("usage")

// common are the flags every load mode takes.
type common struct {
	url      string
	conns    int
	xff      bool
	timeout  time.Duration
	parallel int
	duration time.Duration
	json     bool
}

const usageText = `Usage:
  sluice-load publish -url ws://HOST:PORT -conns N -events M [-inflight K] [-duration D] [-xff] [-size BYTES] [-kind K] [-keys K] [-live URL]
  sluice-load req     -url ws://HOST:PORT -conns N -reqs M [-filters F] [-filter JSON] [-inflight K] [-duration D] [-xff]
  sluice-load connect -url ws://HOST:PORT -conns N [-hold D] [-churn K] [-xff]
  sluice-load khatru  -listen HOST:PORT -data DIR|-database URL [-metrics HOST:PORT]
  sluice-load stall    -url ws://HOST:PORT [-stallers K] [-stall-read BYTES/S] [-rcvbuf BYTES] [-publishers P] [-rate R] [-duration D] [-xff]
  sluice-load backlog  -url ws://HOST:PORT [-read BYTES/S] [-filters F] [-event-rate R] [-count-rate R] [-duration D] [-metrics URL,...] [-xff]
  sluice-load slowread -url ws://HOST:PORT [-read BYTES/S] [-rcvbuf BYTES] [-duration D] [-xff]

Every load mode also takes -timeout D, -parallel N and -json (stall,
backlog and slowread: -timeout and -json).
Run "sluice-load MODE -h" for a mode's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs one command and returns its exit code: 0, 1 for a failure, 2
// for a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return 2
	}
	mode, args := args[0], args[1:]
	var (
		rep    *report
		err    error
		asJSON bool
	)
	switch mode {
	case "publish":
		var o *publishOpts
		if o, err = parsePublish(args, stderr); err == nil {
			asJSON = o.json
			rep, err = runPublish(ctx, o)
		}
	case "req":
		var o *reqOpts
		if o, err = parseReq(args, stderr); err == nil {
			asJSON = o.json
			rep, err = runReq(ctx, o)
		}
	case "connect":
		var o *connectOpts
		if o, err = parseConnect(args, stderr); err == nil {
			asJSON = o.json
			rep, err = runConnect(ctx, o)
		}
	case "stall", "backlog", "slowread":
		return runSlowMode(ctx, mode, args, stdout, stderr)
	case "khatru":
		fs := newFlagSet("khatru", stderr)
		listen := fs.String("listen", "127.0.0.1:7778", "`host:port` to serve plain khatru on")
		data := fs.String("data", "", "`directory` of the badger event store (events under DIR/events; required without -database)")
		database := fs.String("database", "", "postgres:// `URL`: eventstore's PostgreSQL backend instead of badger")
		metrics := fs.String("metrics", "", "`host:port` to serve the process's Prometheus /metrics on (go_goroutines, process_resident_memory_bytes); \"\" for none")
		if err = parseFlags(fs, args); err == nil && *data == "" && *database == "" {
			err = usagef("khatru: -data or -database is required")
		}
		if err == nil {
			logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			err = runKhatru(ctx, *listen, *data, *database, *metrics, logger)
		}
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText)
		return 0
	default:
		fmt.Fprintf(stderr, "sluice-load: unknown mode %q\n\n%s", mode, usageText)
		return 2
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		if msg := err.Error(); msg != errUsage.Error() {
			fmt.Fprintf(stderr, "sluice-load: %s\n", trimUsage(msg))
		}
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "sluice-load %s: %v\n", mode, err)
		return 1
	}
	if rep == nil {
		return 0 // khatru, stopped
	}
	if asJSON {
		if err := rep.writeJSON(stdout); err != nil {
			fmt.Fprintf(stderr, "sluice-load: %v\n", err)
			return 1
		}
	} else {
		rep.writeText(stdout)
	}
	if rep.Connected == 0 {
		fmt.Fprintf(stderr, "sluice-load %s: could not connect to %s: %s\n", mode, rep.URL, failureSummary(rep.ConnFailures))
		return 1
	}
	if ctx.Err() != nil {
		fmt.Fprintf(stderr, "sluice-load %s: interrupted; the report covers what ran\n", mode)
		return 1
	}
	return 0
}

// runSlowMode runs one of the slow-reader modes, which report in their
// own shape.
func runSlowMode(ctx context.Context, mode string, args []string, stdout, stderr io.Writer) int {
	var (
		res    interface{ writeText(io.Writer) }
		asJSON bool
		err    error
	)
	switch mode {
	case "stall":
		var o *stallOpts
		if o, err = parseStall(args, stderr); err == nil {
			asJSON = o.json
			res, err = nilable(runStall(ctx, o))
		}
	case "backlog":
		var o *backlogOpts
		if o, err = parseBacklog(args, stderr); err == nil {
			asJSON = o.json
			res, err = nilable(runBacklog(ctx, o))
		}
	case "slowread":
		var o *slowreadOpts
		if o, err = parseSlowread(args, stderr); err == nil {
			asJSON = o.json
			res, err = nilable(runSlowread(ctx, o))
		}
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		if msg := err.Error(); msg != errUsage.Error() {
			fmt.Fprintf(stderr, "sluice-load: %s\n", trimUsage(msg))
		}
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "sluice-load %s: %v\n", mode, err)
		return 1
	}
	if err := writeResult(stdout, asJSON, res); err != nil {
		fmt.Fprintf(stderr, "sluice-load: %v\n", err)
		return 1
	}
	if ctx.Err() != nil {
		fmt.Fprintf(stderr, "sluice-load %s: interrupted; the report covers what ran\n", mode)
		return 1
	}
	return 0
}

// nilable returns r as an interface value that is nil when r is.
func nilable[T interface{ writeText(io.Writer) }](r T, err error) (interface{ writeText(io.Writer) }, error) {
	if err != nil {
		return nil, err
	}
	return r, nil
}

// newFlagSet is a mode's flag set, printing its errors to stderr.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// checkURL checks a mode's -url: ws:// or wss:// with a host.
func checkURL(mode, s string) error {
	if s == "" {
		return usagef("%s: -url is required", mode)
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return usagef("%s: -url must be a ws:// or wss:// URL, got %q", mode, s)
	}
	return nil
}

// paramsText is a report's params as "k=v" pairs in key order.
func paramsText(params map[string]any) string {
	keys := slices.Sorted(maps.Keys(params))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%v", k, params[k]))
	}
	return strings.Join(parts, " ")
}

func failureSummary(m map[string]int) string {
	best, n := "no attempt", 0
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] > n {
			best, n = k, m[k]
		}
	}
	if _, err := fmt.Sscanf(best, "%d", new(int)); err == nil {
		return "upgrade refused with HTTP " + best
	}
	return best
}

func usagef(f string, a ...any) error {
	return fmt.Errorf("%w: "+f, append([]any{errUsage}, a...)...)
}

func trimUsage(msg string) string {
	p := errUsage.Error() + ": "
	if len(msg) > len(p) && msg[:len(p)] == p {
		return msg[len(p):]
	}
	return msg
}

// parseFlags parses args into fs; a flag error (already printed by the
// flag package) is a usage error, as are arguments left over.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

func commonFlags(fs *flag.FlagSet, c *common) {
	fs.StringVar(&c.url, "url", "", "relay `URL`, ws:// or wss:// (required)")
	fs.IntVar(&c.conns, "conns", 8, "number of connections (connect -churn: workers)")
	fs.BoolVar(&c.xff, "xff", false, "give each connection its own X-Forwarded-For (10.0.0.1, 10.0.0.2, …)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "the longest wait for a dial or a reply")
	fs.IntVar(&c.parallel, "parallel", 64, "dials in flight at once while connecting")
	fs.BoolVar(&c.json, "json", false, "print the report as one JSON object")
}

func checkCommon(mode string, c *common) error {
	if err := checkURL(mode, c.url); err != nil {
		return err
	}
	if c.conns < 1 {
		return usagef("%s: -conns must be at least 1, got %d", mode, c.conns)
	}
	if c.timeout <= 0 {
		return usagef("%s: -timeout must be positive, got %v", mode, c.timeout)
	}
	if c.parallel < 1 {
		return usagef("%s: -parallel must be at least 1, got %d", mode, c.parallel)
	}
	if c.duration < 0 {
		return usagef("%s: -duration must not be negative, got %v", mode, c.duration)
	}
	return nil
}

// parseMode parses the flags of load mode mode: the common ones into c
// and the mode's own, which flags declares; then it checks the common ones.
func parseMode(mode string, args []string, stderr io.Writer, c *common, flags func(fs *flag.FlagSet)) error {
	fs := flag.NewFlagSet(mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	commonFlags(fs, c)
	flags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return checkCommon(mode, c)
}

func parsePublish(args []string, stderr io.Writer) (*publishOpts, error) {
	o := &publishOpts{}
	if err := parseMode("publish", args, stderr, &o.common, func(fs *flag.FlagSet) {
		fs.IntVar(&o.events, "events", 1000, "events to publish, shared among the connections")
		fs.DurationVar(&o.duration, "duration", 0, "stop sending after this long (0: when every event is sent)")
		fs.IntVar(&o.size, "size", 64, "content size of each event in `bytes`")
		fs.IntVar(&o.kind, "kind", 1, "event kind")
		fs.IntVar(&o.inflight, "inflight", 1, "events in flight per connection")
		fs.IntVar(&o.keys, "keys", 0, "signing keys shared round-robin by the connections (0: one per connection)")
		fs.StringVar(&o.live, "live", "", "ws:// `URL` of one subscriber to kind-1 events, which times each event from its write to its arrival (another instance of the relay, or -url)")
	}); err != nil {
		return nil, err
	}
	switch {
	case o.events < 1:
		return nil, usagef("publish: -events must be at least 1, got %d", o.events)
	case o.size < 0 || o.size > 64<<20:
		return nil, usagef("publish: -size must be between 0 and %d, got %d", 64<<20, o.size)
	case o.kind < 0 || o.kind > 65535:
		return nil, usagef("publish: -kind must be between 0 and 65535, got %d", o.kind)
	case o.inflight < 1:
		return nil, usagef("publish: -inflight must be at least 1, got %d", o.inflight)
	case o.keys < 0:
		return nil, usagef("publish: -keys must not be negative, got %d", o.keys)
	case o.live != "" && o.kind != 1:
		return nil, usagef("publish: -live subscribes to kind 1: publish -kind 1, got %d", o.kind)
	}
	return o, nil
}

func parseReq(args []string, stderr io.Writer) (*reqOpts, error) {
	o := &reqOpts{}
	var filter *string
	if err := parseMode("req", args, stderr, &o.common, func(fs *flag.FlagSet) {
		fs.IntVar(&o.reqs, "reqs", 1000, "REQs to send, shared among the connections")
		fs.DurationVar(&o.duration, "duration", 0, "stop sending after this long (0: when every REQ is sent)")
		fs.IntVar(&o.filters, "filters", 1, "filters per REQ")
		filter = fs.String("filter", `{"kinds":[1],"limit":10}`, "each filter, a JSON object")
		fs.IntVar(&o.inflight, "inflight", 1, "REQs open at once per connection")
	}); err != nil {
		return nil, err
	}
	switch {
	case o.reqs < 1:
		return nil, usagef("req: -reqs must be at least 1, got %d", o.reqs)
	case o.filters < 1:
		return nil, usagef("req: -filters must be at least 1, got %d", o.filters)
	case o.inflight < 1:
		return nil, usagef("req: -inflight must be at least 1, got %d", o.inflight)
	}
	f, err := parseFilter(*filter)
	if err != nil {
		return nil, usagef("req: %v", err)
	}
	o.filter = f
	return o, nil
}

func parseConnect(args []string, stderr io.Writer) (*connectOpts, error) {
	o := &connectOpts{}
	if err := parseMode("connect", args, stderr, &o.common, func(fs *flag.FlagSet) {
		fs.DurationVar(&o.hold, "hold", 0, "keep the connections open this long before closing them")
		fs.IntVar(&o.churn, "churn", 0, "open and close this many connections in all, over -conns workers (0: open -conns and hold)")
	}); err != nil {
		return nil, err
	}
	switch {
	case o.hold < 0:
		return nil, usagef("connect: -hold must not be negative, got %v", o.hold)
	case o.churn < 0:
		return nil, usagef("connect: -churn must not be negative, got %d", o.churn)
	case o.churn > 0 && o.hold > 0:
		return nil, usagef("connect: -hold and -churn do not go together")
	}
	return o, nil
}
