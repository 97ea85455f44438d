package main

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"

	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay/wire"
)

// This file holds the binary's own checks: what the file's shape means (a
// null, an unknown type, a cost of 0), and bounds the library leaves to
// its caller, each said where it is made. What the library checks
// (policy.Config.Validate, relay.Options.Validate) is left to it:
// config_convert.go hands it the converted values and names the file's
// field in each of its errors.

// Bounds on values that are valid to the library but not sane ones. A
// window longer than a day keeps keys alive for days; rates beyond a
// billion overflow the burst arithmetic long before they mean anything
// (use [] for "free").
const (
	maxPeriod    = 24 * time.Hour
	maxRate      = 1e9
	maxTimeout   = 10 * time.Second
	maxReadLimit = 64 << 20
	// defaultMaxSyncEvents bounds the events one NIP-77 sync (NEG-OPEN)
	// covers in sluice relay. eventstore's badger backend otherwise
	// allows 16,777,216 and allocates its result slice at that size for
	// every NEG-OPEN, whatever matches (TestE2ESyncMemoryBounded holds
	// sluice relay to this bound). A sync that matches more covers the
	// newest 100,000: enough for one author's history or a feed's recent
	// notes; a mirror that syncs a whole relay raises it.
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
	// minQueuedBytes and maxQueuedBytes bound limits.max_queued_bytes:
	// below 64 KiB a client would be cut before the gate ever holds its
	// requests back (the library refuses it too, but reads 0 as its
	// default, which the file does not); past 1 GiB one client could hold
	// that much of the process.
	minQueuedBytes = 64 << 10
	maxQueuedBytes = 1 << 30
	// minFrameSize is the smallest limits.frame_size: a smaller number
	// bounds nothing a client sends (an AUTH is hundreds of bytes) and is
	// most likely a size meant in KiB.
	minFrameSize = 64
	// maxPubkeysFile bounds a tier's pubkeys_file: 64 MiB is about 800,000
	// npubs, past which a tier is a database, not a config.
	maxPubkeysFile = 64 << 20
)

// maxErrors bounds the problems validate lists: a file of a hundred
// thousand bad windows gets the first ones and a count, not a megabyte.
const maxErrors = 20

// checker collects the problems of one file, each named by its field's
// path and where the file sets it (or what set it: "SLUICE_LISTEN").
type checker struct {
	fc   *fileConfig
	errs []error
	more int
	// reported holds the path of every problem found so far, so that the
	// library is not asked to repeat one the binary has named.
	reported []string
}

func (v *checker) bad(path, format string, args ...any) {
	v.reported = append(v.reported, path)
	if len(v.errs) == maxErrors {
		v.more++
		return
	}
	msg := fmt.Sprintf(format, args...)
	where := path
	if src := v.fc.from[path]; src != "" {
		msg += " (set by " + src + ")"
	} else if at := v.fc.at[path]; at != "" {
		where += " (" + at + ")"
	}
	v.errs = append(v.errs, fmt.Errorf("%w: %s: %s", errConfig, where, msg))
}

// covered reports whether a problem at path, or inside it, or around it,
// was reported already.
func (v *checker) covered(path string) bool {
	for _, r := range v.reported {
		if r == path || within(r, path) || within(path, r) {
			return true
		}
	}
	return false
}

// within reports whether path lies inside outer ("a.b[0]" inside "a.b").
func within(path, outer string) bool {
	return strings.HasPrefix(path, outer) && len(path) > len(outer) && (path[len(outer)] == '.' || path[len(outer)] == '[')
}

// err returns the problems found, joined, or nil.
func (v *checker) err() error {
	errs := v.errs
	if v.more > 0 {
		errs = append(errs, fmt.Errorf("%w: and %d more", errConfig, v.more))
	}
	return errors.Join(errs...)
}

// validate checks every value and resolves the file into a config. It
// runs the binary's own checks (this file) while converting the file into
// the library's types (config_convert.go), then asks the library
// (relay.Options.Validate, which includes policy.Config.Validate) about the
// result and reports each of its FieldErrors at the file's path, as in
// "limits.message.EVENT[1] (line 3, column 7): ratelimit: invalid limit:
// rate 1 must be greater than cost 1".
func (fc *fileConfig) validate() (*config, error) {
	v := &checker{fc: fc}
	c, lp := v.convert()
	v.library(c, lp)
	if err := v.err(); err != nil {
		return nil, err
	}
	return c, nil
}

// checkBasics checks the fields outside limits and the policy: addresses,
// URLs, sizes, logging, info, the store.
func (v *checker) checkBasics(c *config) {
	fc := v.fc
	if err := checkHostPort(fc.Listen); err != nil {
		v.bad("listen", "%v", err)
	}
	if fc.MetricsListen != "" {
		if err := checkHostPort(fc.MetricsListen); err != nil {
			v.bad("metrics_listen", "%v (write \"\" to turn metrics off)", err)
		} else if sameListener(fc.Listen, fc.MetricsListen) {
			// Both are bound at start-up; the second would fail.
			v.bad("metrics_listen", "%q would bind the port of listen %q: give metrics a port of its own (or \"\" to turn metrics off)", fc.MetricsListen, fc.Listen)
		}
	}
	if fc.DataDir == "" {
		v.bad("data_dir", "must not be empty")
	}
	if fc.Database != "" {
		if err := checkDatabase(fc.Database); err != nil {
			v.bad("database", "%v", err)
		}
	}
	if fc.Upstream != "" {
		if err := checkUpstream(fc.Upstream); err != nil {
			v.bad("upstream", "%v", err)
		}
	}
	if fc.RelayURL != "" {
		if err := checkRelayURL(fc.RelayURL); err != nil {
			v.bad("relay_url", "%v", err)
		}
	}
	// The gate takes any read limit; below 1 KiB nothing but the smallest
	// frames would pass, above 64 MiB one client could hold that much of
	// the process per frame.
	if fc.ReadLimit < 1024 || fc.ReadLimit > maxReadLimit {
		v.bad("read_limit", "must be between 1024 and %d bytes, got %d", maxReadLimit, fc.ReadLimit)
	}
	if fc.MaxSyncEvents < 1 || fc.MaxSyncEvents > maxMaxSyncEvents {
		v.bad("max_sync_events", "must be between 1 and %d, got %d", maxMaxSyncEvents, fc.MaxSyncEvents)
	}
	switch fc.Log.Format {
	case "text", "json":
	default:
		v.bad("log.format", "must be text or json, got %q", fc.Log.Format)
	}
	switch fc.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		v.bad("log.level", "must be debug, info, warn or error, got %q", fc.Log.Level)
	}
	if fc.Info.Pubkey != "" {
		if pk, err := parsePubkey(fc.Info.Pubkey); err != nil {
			v.bad("info.pubkey", "%v", err)
		} else if b, err := hex.DecodeString(pk); err != nil || len(b) != 32 {
			v.bad("info.pubkey", "must be 64 hex digits or an npub, got %q", fc.Info.Pubkey)
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
			v.bad(f.path, "must be at most %d bytes", f.max)
		}
	}

	var redisReadTimeout time.Duration // the client's, when store.redis is good
	if fc.Store.Redis != "" {
		if rt, err := checkRedisURL(fc.Store.Redis); err != nil {
			v.bad("store.redis", "%v", err)
		} else {
			redisReadTimeout = rt
		}
	}
	switch {
	case fc.Store.Prefix == "":
		// The Redis store reads "" as its default prefix; say so rather
		// than let "no prefix" quietly mean "sluice:".
		v.bad("store.prefix", "must not be empty (the default is \"sluice:\")")
	case len(fc.Store.Prefix) > 64:
		// The store takes any length; a key prefix longer than this is a
		// value pasted into the wrong field.
		v.bad("store.prefix", "must be at most 64 bytes")
	default:
		if err := checkPrefix(fc.Store.Prefix); err != nil {
			v.bad("store.prefix", "%v", err)
		}
	}
	// The store takes any timeout (negative: none of its own); a decision
	// that may take longer than 10 s holds a client's frame that long.
	if d, err := parseDuration(fc.Store.Timeout); err != nil {
		v.bad("store.timeout", "%v", err)
	} else if d < time.Millisecond || d > maxTimeout {
		v.bad("store.timeout", "must be between 1ms and %v, got %v", maxTimeout, d)
	} else if redisReadTimeout > 0 && d > redisReadTimeout {
		// go-redis bounds each socket read by the earlier of the call's
		// deadline and its read timeout: a longer store.timeout would be
		// cut short there, silently.
		v.bad("store.timeout", "%v is longer than the Redis client's read timeout (%v), which bounds every call: set read_timeout=%v in store.redis, or store.timeout to at most %v", d, redisReadTimeout, d, redisReadTimeout)
	} else {
		c.StoreTimeout = d
	}
}

// checkCaps checks the per-client and per-connection caps under limits,
// which the gate takes any positive number for: the bounds are where a cap
// stops capping anything.
func (v *checker) checkCaps(c *config) {
	fc := v.fc
	for _, f := range []struct {
		path   string
		n      integer
		lo, hi int
		to     *int
	}{
		{"limits.max_filters", fc.Limits.MaxFilters, 1, maxFilters, &c.MaxFilters},
		{"limits.subscriptions", fc.Limits.Subscriptions, 1, maxSubscriptions, &c.Subscriptions},
		{"limits.max_connections", fc.Limits.MaxConnections, 1, maxConnections, &c.MaxConnections},
		{"limits.syncs", fc.Limits.Syncs, 1, maxSyncs, &c.Syncs},
		{"limits.max_filter_bytes", fc.Limits.MaxFilterBytes, 1, maxFilterBytes, &c.MaxFilterBytes},
		{"limits.max_queued_bytes", fc.Limits.MaxQueuedBytes, minQueuedBytes, maxQueuedBytes, &c.QueueBytes},
	} {
		if f.n < integer(f.lo) || f.n > integer(f.hi) {
			v.bad(f.path, "must be between %d and %d, got %d", f.lo, f.hi, f.n)
			continue
		}
		*f.to = int(f.n)
	}
}

// checkWindow applies the binary's bounds to a window the library takes.
func (v *checker) checkWindow(path string, l ratelimit.Limit) {
	switch {
	case l.Period > maxPeriod:
		v.bad(path+".period", "must be at most %v, got %v", maxPeriod, l.Period)
	case l.Rate > maxRate:
		v.bad(path+".rate", "must be at most %g, got %v", float64(maxRate), l.Rate)
	case l.Rate/l.EffectiveCost() > maxRate:
		v.bad(path, "rate/cost is %g; a burst can be at most %g messages", l.Rate/l.EffectiveCost(), float64(maxRate))
	case l.Interval() > 0 && l.Interval() < time.Microsecond:
		// Beyond this the math still works, but nothing real sends
		// that fast, and float rounding makes the interval 0.
		v.bad(path, "%s allows more than a million messages a second; lower rate or raise period", limitString(l))
	}
}

// quotaEventsProblem says, in the file's terms, what is wrong with a
// quota's events count ("" when nothing is). Below 1 the file has its own
// word (unlimitedKey turns the quota off); the upper bound is
// ratelimit.NewQuota's, asked rather than repeated.
func quotaEventsProblem(events int64, unlimitedKey string) string {
	if events < 1 {
		return fmt.Sprintf("must be at least 1, got %d (set %s: true to turn the quota off)", events, unlimitedKey)
	}
	if _, err := ratelimit.NewQuota(int(min(events, math.MaxInt)), time.Minute); err != nil {
		return err.Error()
	}
	return ""
}

// checkQuotaWindow reads a quota's window: the library takes any positive
// one; a window of less than a second counts nothing a person does, and
// one of more than a day keeps a pubkey's count for days.
func (v *checker) checkQuotaWindow(path, s string) (time.Duration, bool) {
	d, err := parseDuration(s)
	switch {
	case err != nil:
		v.bad(path, "%v", err)
	case d < time.Second || d > maxPeriod:
		v.bad(path, "must be between 1s and %v, got %v", maxPeriod, d)
	default:
		return d, true
	}
	return 0, false
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

// checkUpstream refuses an upstream that is not a ws:// or wss:// URL with
// a host (relay.Gate.Proxy refuses it at start-up; here the file is told
// before anything runs), and one holding a password, which a config file
// must not.
func checkUpstream(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "ws" && u.Scheme != "wss"):
		return fmt.Errorf("must be a ws:// or wss:// URL with a host, got %q", s)
	case u.User != nil:
		return errors.New("must not carry credentials")
	}
	return nil
}

// checkDatabase accepts a postgres:// or postgresql:// URL with a host
// (lib/pq's form) and names neither the URL nor its password when it does
// not: the value usually carries one.
func checkDatabase(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		return errors.New(`must be empty (events in badger under data_dir) or a postgres://user:password@host:port/db URL`)
	}
	return nil
}

// checkRelayURL refuses what no public relay URL has, though the gate
// takes it (relay.Options.Validate judges the scheme and the host): an
// AUTH relay tag is compared by host and path, so credentials, a query or
// a fragment could only be a mistake.
func checkRelayURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil // the library's to say
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

// readPubkeysFile calls add with every pubkey of the file at path: one a
// line, '#' starting a comment, blank lines skipped.
func readPubkeysFile(path string, add func(line int, s string)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// A FIFO or a device would hold start-up (or a reload) on a read that
	// may never end.
	if st, err := f.Stat(); err != nil {
		return err
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	sc := bufio.NewScanner(io.LimitReader(f, maxPubkeysFile+1))
	n, size := 0, 0
	for sc.Scan() {
		n++
		size += len(sc.Bytes()) + 1
		if size > maxPubkeysFile {
			return fmt.Errorf("%s is larger than %d bytes", path, maxPubkeysFile)
		}
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line != "" {
			add(n, line)
		}
	}
	return sc.Err()
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

// parseType maps a message type as the file names it onto a wire.Type; ok
// is false for an unknown one. It is case-sensitive, as NIP-01 labels are,
// and takes "OTHER" for the catch-all bucket.
func parseType(label string) (t wire.Type, ok bool) {
	for t := range wire.NumTypes {
		if t.String() == label {
			return t, true
		}
	}
	return wire.TypeOther, false
}

func knownTypes() string {
	return forwardedTypes() + ", " + wire.TypeOther.String()
}
