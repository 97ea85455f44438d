package redisstore

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterReadTimeout is the read timeout NewClient gives a cluster client
// whose URL sets none (go-redis's default is 3 s). A decision's own
// deadline is shorter and unaffected; what it bounds is the client's
// background slot-map reload, which asks the nodes one after another with
// no deadline of its own: one hung node asked first holds a reload, and so
// the decisions of a failed-over master's clients, for the whole read
// timeout. go-redis caps every call at the read timeout, so a Store
// Timeout above it needs read_timeout in the URL.
const clusterReadTimeout = time.Second

// errURL is wrapped by NewClient for a URL it cannot use.
var errURL = errors.New("redisstore: invalid redis URL")

// NewClient returns a go-redis client for rawURL, ready for New:
//
//	redis://[user:pass@]host:port[/db][?options]       standalone
//	rediss://…                                          standalone over TLS
//	unix://[user:pass@]/path/to/socket[?db=N]          standalone on a socket
//	redis+sentinel://[user:pass@]host:port[,host:port…]/mastername[/db][?options]
//	redis+cluster://[user:pass@]host:port[,host:port…][?options]
//
// rediss+sentinel and rediss+cluster use TLS. Options are go-redis's own
// URL query options (dial_timeout, pool_size, max_retries, …); unknown ones
// are refused. For sentinel the userinfo authenticates to the master and
// the replicas; sentinel_username and sentinel_password in the query
// authenticate to the sentinels themselves.
//
// Every client is built with ContextTimeoutEnabled, so the Store's per-call
// deadline bounds socket reads and writes. Retries (max_retries) are left to
// go-redis: the Store's script is idempotent, so a retried call never
// charges twice, and a retry carries a decision past a connection that died
// under it. max_retries=-1 turns them off: the Store then sends no request
// id (less work for Redis per call), and a lost reply or a reset fails its
// decision as unavailable.
//
// A cluster URL without read_timeout gets 1 s, so that
// a hung node cannot hold the client's slot-map reload for go-redis's 3 s.
//
// The error names what is wrong; the password is never
// part of it. The caller owns the client and closes it.
func NewClient(rawURL string) (redis.UniversalClient, error) {
	o, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return o.client(), nil
}

// clientOptions is a parsed URL: exactly one of the three is set.
type clientOptions struct {
	standalone *redis.Options
	failover   *redis.FailoverOptions
	cluster    *redis.ClusterOptions
}

// A slow Redis must not be an outage: every round trip a new connection
// spends before its first command comes out of the deadline of the
// decision that made it, and a call that times out costs its connection.
// So the clients NewClient builds speak RESP2, which every Redis speaks,
// without asking (the dialer answers go-redis's HELLO itself, see
// stallConn), send no CLIENT SETINFO, and keep warmIdle connections
// dialled ahead of need (per node on a cluster); a URL's protocol,
// min_idle_conns or a password (which HELLO then carries to Redis) keeps
// its own cost.
const warmIdle = 4

func (o clientOptions) client() redis.UniversalClient {
	switch {
	case o.failover != nil:
		o.failover.Protocol = cmp.Or(o.failover.Protocol, 2)
		o.failover.Dialer = healingDialer(o.failover.DialTimeout, o.failover.TLSConfig, o.failover.Protocol == 2)
		o.failover.DialerRetries = 1
		o.failover.DisableIdentity = true
		o.failover.MinIdleConns = cmp.Or(o.failover.MinIdleConns, warmIdle)
		return redis.NewFailoverClient(o.failover)
	case o.cluster != nil:
		o.cluster.Protocol = cmp.Or(o.cluster.Protocol, 2)
		o.cluster.Dialer = healingDialer(o.cluster.DialTimeout, o.cluster.TLSConfig, o.cluster.Protocol == 2)
		o.cluster.DialerRetries = 1
		o.cluster.DisableIdentity = true
		o.cluster.MinIdleConns = cmp.Or(o.cluster.MinIdleConns, warmIdle)
		// With its command routing policies on, go-redis's cluster client
		// asks a random node for COMMAND before the first call it routes,
		// holding every other routed call meanwhile: a hung master picked
		// there held the decisions of clients on healthy masters for as
		// long as its timeout. A decision routes by its one key, as without
		// the policies.
		o.cluster.DisableRoutingPolicies = true
		return redis.NewClusterClient(o.cluster)
	}
	o.standalone.Protocol = cmp.Or(o.standalone.Protocol, 2)
	if o.standalone.Network != "unix" {
		o.standalone.Dialer = healingDialer(o.standalone.DialTimeout, o.standalone.TLSConfig, o.standalone.Protocol == 2)
	}
	o.standalone.DialerRetries = 1
	o.standalone.DisableIdentity = true
	o.standalone.MinIdleConns = cmp.Or(o.standalone.MinIdleConns, warmIdle)
	return redis.NewClient(o.standalone)
}

// healingDialer dials like go-redis's own dialer (TCP, keep-alive, TLS
// when configured), but a failed dial comes back to the pool as a
// connection whose first read or write fails with the dial's error. The
// caller sees the same error; the pool does not count a dial failure.
// go-redis's pool, after PoolSize failed dials, refuses every new dial
// until a background probe (one a second) succeeds: after an outage,
// decisions were held back for up to a second after Redis answered again.
// The Store's breaker already bounds how often an outage dials, so the
// pool's second breaker only delayed healing.
//
// Every connection is a stallConn: a read that times out after the gate
// itself did not run is given that time back (see stallMeter). With resp2
// (the client speaks RESP2) it also answers go-redis's handshake itself,
// which then costs no round trip.
func healingDialer(timeout time.Duration, tlsConf *tls.Config, resp2 bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if timeout == 0 {
		timeout = 5 * time.Second // go-redis's default DialTimeout
	}
	nd := &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		var err error
		if tlsConf != nil {
			td := &tls.Dialer{NetDialer: nd, Config: tlsConf}
			c, err = td.DialContext(ctx, network, addr)
		} else {
			c, err = nd.DialContext(ctx, network, addr)
		}
		if err != nil {
			return failedConn{err}, nil
		}
		sc := stallConn{Conn: c, hello: resp2}
		if _, ok := c.(syscall.Conn); ok {
			return &stallSysConn{sc}, nil
		}
		return &sc, nil
	}
}

// stallConn is a connection to Redis as NewClient's clients dial it.
//
// With hello, its first command, when it is go-redis's bare protocol
// handshake ("HELLO 2" or "HELLO 3": no password, no name), is answered
// here, without a round trip, as a Redis without HELLO would answer it: an
// error, after which go-redis speaks RESP2 on the connection (and sends a
// password, if any, with AUTH).
//
// A read that times out when the gate did not run for part of its wait
// (stalls) reads on for that long past go-redis's deadline, once per wait:
// the reply may be in the socket already, or on its way from a Redis
// paused with the gate. Every other byte goes to Redis and back untouched.
type stallConn struct {
	net.Conn
	hello  bool      // answer a bare HELLO
	wrote  bool      // the first write has been seen
	reply  []byte    // the handshake's answer, still to be read
	sent   time.Time // the latest write: a reply's wait starts there
	rd     time.Time // the read deadline go-redis set
	graced bool      // the wait since sent was given its time back
}

// helloReply is what a Redis that does not know HELLO answers it.
const helloReply = "-ERR unknown command 'HELLO'\r\n"

func (c *stallConn) Write(b []byte) (int, error) {
	if !c.wrote {
		c.wrote = true
		if c.hello && isBareHello(b) {
			c.reply = []byte(helloReply)
			return len(b), nil
		}
	}
	c.sent, c.graced = time.Now(), false
	return c.Conn.Write(b)
}

// Read reads on, once per wait (since the latest write), for the time the
// gate lost in it when its deadline passed: the socket's deadline moves
// that much later for every read until go-redis sets its next one, so the
// whole wait is bounded by go-redis's deadline plus the time lost.
func (c *stallConn) Read(b []byte) (int, error) {
	if len(c.reply) > 0 {
		n := copy(b, c.reply)
		c.reply = c.reply[n:]
		return n, nil
	}
	n, err := c.Conn.Read(b)
	if n == 0 && !c.graced && !c.rd.IsZero() && errors.Is(err, os.ErrDeadlineExceeded) {
		if lost := stalls.since(c.sent); lost > 0 {
			c.graced = true
			if c.Conn.SetReadDeadline(c.rd.Add(lost)) == nil {
				n, err = c.Conn.Read(b)
				if n > 0 {
					stallGraces.Add(1)
				}
			}
		}
	}
	return n, err
}

func (c *stallConn) SetDeadline(t time.Time) error {
	c.rd = t
	return c.Conn.SetDeadline(t)
}

func (c *stallConn) SetReadDeadline(t time.Time) error {
	c.rd = t
	return c.Conn.SetReadDeadline(t)
}

// stallGraces counts the replies read in the time given back (Stats.Stalls).
var stallGraces atomic.Uint64

// stallSysConn is a stallConn over a socket go-redis's pool can check,
// idle, for a peer that closed it, as it does a plain one (a TLS
// connection it checks no deeper than its wrapper).
type stallSysConn struct{ stallConn }

func (c *stallSysConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// isBareHello reports whether b is exactly the command HELLO with one
// argument, the protocol version, in RESP ("*2\r\n$5\r\nhello\r\n$1\r\n3\r\n").
func isBareHello(b []byte) bool {
	const head, tail = "*2\r\n$5\r\n", "\r\n$1\r\n"
	if len(b) != len(head)+5+len(tail)+3 || string(b[:len(head)]) != head {
		return false
	}
	rest := b[len(head):]
	return strings.EqualFold(string(rest[:5]), "hello") && string(rest[5:5+len(tail)]) == tail &&
		(rest[5+len(tail)] == '2' || rest[5+len(tail)] == '3') && string(rest[6+len(tail):]) == "\r\n"
}

// failedConn is a dial that failed, as a connection: every read and write
// returns the dial's error.
type failedConn struct{ err error }

func (f failedConn) Read([]byte) (int, error)         { return 0, f.err }
func (f failedConn) Write([]byte) (int, error)        { return 0, f.err }
func (f failedConn) Close() error                     { return nil }
func (f failedConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (f failedConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (f failedConn) SetDeadline(time.Time) error      { return nil }
func (f failedConn) SetReadDeadline(time.Time) error  { return nil }
func (f failedConn) SetWriteDeadline(time.Time) error { return nil }

// SyscallConn fails, so that go-redis's pool, checking an idle connection
// before it hands it out, drops a failed dial made ahead of need (warmIdle)
// and dials again rather than fail a decision with a stale error.
func (f failedConn) SyscallConn() (syscall.RawConn, error) { return nil, f.err }

func parseURL(rawURL string) (clientOptions, error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return clientOptions{}, fmt.Errorf("%w: %q has no scheme (want redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://)", errURL, RedactURL(rawURL))
	}
	// A password with a raw '/', '?' or '#' (base64 passwords have '/')
	// makes every URL parser cut it in two and echo the pieces as a host or
	// a path; say what is wrong instead.
	if at := strings.LastIndexByte(rest, '@'); at >= 0 && strings.ContainsAny(rest[:at], "/?#") {
		return clientOptions{}, fmt.Errorf("%w: %s: '/', '?' or '#' before the last '@': percent-escape them in the user name and password (%%2F, %%3F, %%23; '@' is %%40)", errURL, RedactURL(rawURL))
	}
	switch s := strings.ToLower(scheme); s {
	case "redis", "rediss", "unix":
		o, err := redis.ParseURL(s + "://" + rest)
		if err != nil {
			return clientOptions{}, fmt.Errorf("%w: %s: %s", errURL, RedactURL(rawURL), redactErr(err, rawURL))
		}
		o.ContextTimeoutEnabled = true
		return clientOptions{standalone: o}, nil
	case "redis+sentinel", "rediss+sentinel":
		o, err := parseSentinel(strings.TrimSuffix(s, "+sentinel"), rest, rawURL)
		return clientOptions{failover: o}, err
	case "redis+cluster", "rediss+cluster":
		o, err := parseCluster(strings.TrimSuffix(s, "+cluster"), rest, rawURL)
		return clientOptions{cluster: o}, err
	}
	return clientOptions{}, fmt.Errorf("%w: unknown scheme %q (want redis, rediss, unix, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster)", errURL, RedactURL(scheme))
}

// splitHosts parses "[userinfo@]h:p[,h:p…][/path][?query]" into its parts.
// The host list is taken apart by hand because net/url refuses a comma
// separated host list with ports.
func splitHosts(rest, rawURL string) (user *url.Userinfo, hosts []string, path, query string, err error) {
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		return nil, nil, "", "", fmt.Errorf("%w: %s: a fragment (#…) means nothing here", errURL, RedactURL(rawURL))
	}
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		rest, query = rest[:i], rest[i+1:]
	}
	authority := rest
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		authority, path = rest[:i], rest[i:]
	}
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		// Let net/url decode the userinfo (percent escapes) on a dummy host.
		u, perr := url.Parse("redis://" + authority[:i+1] + "h")
		if perr != nil || u.User == nil {
			return nil, nil, "", "", fmt.Errorf("%w: %s: unreadable user:password part", errURL, RedactURL(rawURL))
		}
		user, authority = u.User, authority[i+1:]
	}
	if authority == "" {
		return nil, nil, "", "", fmt.Errorf("%w: %s: no host:port", errURL, RedactURL(rawURL))
	}
	for _, h := range strings.Split(authority, ",") {
		host, port, serr := net.SplitHostPort(h)
		if serr != nil || host == "" || port == "" {
			return nil, nil, "", "", fmt.Errorf("%w: %s: %q is not host:port", errURL, RedactURL(rawURL), h)
		}
		hosts = append(hosts, net.JoinHostPort(host, port))
	}
	return user, hosts, path, query, nil
}

// goRedisURL rebuilds a URL that go-redis's own parsers accept: the first
// host in the authority, the others as addr= query parameters.
func goRedisURL(scheme string, user *url.Userinfo, hosts []string, path string, q url.Values) string {
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	u := url.URL{Scheme: scheme, User: user, Host: hosts[0], Path: path, RawQuery: q.Encode()}
	return u.String()
}

func parseSentinel(scheme, rest, rawURL string) (*redis.FailoverOptions, error) {
	user, hosts, path, query, err := splitHosts(rest, rawURL)
	if err != nil {
		return nil, err
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: query: %v", errURL, RedactURL(rawURL), err)
	}
	parts := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	if len(parts) == 0 || len(parts) > 2 {
		return nil, fmt.Errorf("%w: %s: want /mastername[/db] after the sentinel addresses", errURL, RedactURL(rawURL))
	}
	master, err := url.PathUnescape(parts[0])
	if err != nil || master == "" {
		return nil, fmt.Errorf("%w: %s: unreadable master name", errURL, RedactURL(rawURL))
	}
	if q.Has("master_name") {
		return nil, fmt.Errorf("%w: %s: the master name goes in the path, not in master_name=", errURL, RedactURL(rawURL))
	}
	q.Set("master_name", master)
	sentUser, sentPass := q.Get("sentinel_username"), q.Get("sentinel_password")
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	dbPath := ""
	if len(parts) == 2 {
		dbPath = "/" + parts[1]
	}
	// ParseFailoverURL reads the userinfo as the sentinels' credentials; we
	// pass none there and set the data nodes' credentials ourselves.
	native := goRedisURL(scheme, nil, hosts, dbPath, q)
	o, err := redis.ParseFailoverURL(native)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", errURL, RedactURL(rawURL), redactErr(err, rawURL))
	}
	if user != nil {
		o.Username = user.Username()
		o.Password, _ = user.Password()
	}
	o.SentinelUsername, o.SentinelPassword = sentUser, sentPass
	o.ContextTimeoutEnabled = true
	return o, nil
}

func parseCluster(scheme, rest, rawURL string) (*redis.ClusterOptions, error) {
	user, hosts, path, query, err := splitHosts(rest, rawURL)
	if err != nil {
		return nil, err
	}
	if path != "" && path != "/" {
		return nil, fmt.Errorf("%w: %s: a cluster URL has no path (Redis Cluster has only database 0)", errURL, RedactURL(rawURL))
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: query: %v", errURL, RedactURL(rawURL), err)
	}
	explicit := q.Has("read_timeout")
	o, err := redis.ParseClusterURL(goRedisURL(scheme, user, hosts, "", q))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", errURL, RedactURL(rawURL), redactErr(err, rawURL))
	}
	if !explicit {
		o.ReadTimeout = clusterReadTimeout
	}
	o.ContextTimeoutEnabled = true
	return o, nil
}

// secrets returns the passwords in rawURL, longest first, as written and
// unescaped: the one in user:password@ and the values of query keys that
// name a password (password=, sentinel_password=).
func secrets(rawURL string) []string {
	var out []string
	add := func(v string) {
		if v == "" {
			return
		}
		out = append(out, v)
		if u, err := url.QueryUnescape(v); err == nil && u != v && u != "" {
			out = append(out, u)
		}
	}
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		rest = rawURL
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if _, pass, ok := strings.Cut(rest[:at], ":"); ok {
			add(pass)
		}
	}
	if _, q, ok := strings.Cut(rest, "?"); ok {
		q, _, _ = strings.Cut(q, "#")
		for kv := range strings.SplitSeq(q, "&") {
			if k, v, _ := strings.Cut(kv, "="); strings.Contains(strings.ToLower(k), "password") {
				add(v)
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// RedactURL returns rawURL, as given to NewClient, with every password in
// it (user:password@ and query keys naming a password, written raw or
// escaped) replaced by "xxxxx", and cut to 200 bytes: for logs and status
// pages. It is what NewClient's errors show of a URL.
//
// The passwords are replaced where they stand, not wherever their text
// recurs: a short password such as "0" or "redis" replaced throughout made
// "redis://:0@127.0.0.1:6379/0" read "redis://:xxxxx@127.xxxxx.xxxxx.1:6379/xxxxx",
// a host and database the operator never wrote. Everything between the
// first ':' of the user part and the last '@' is the password, as secrets
// reads it, so a password with a raw '/', '?' or '#' is hidden whole.
func RedactURL(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return hide(rawURL, rawURL, 200)
	}
	var b strings.Builder
	b.WriteString(scheme)
	b.WriteString("://")
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if user, _, hasPass := strings.Cut(rest[:at], ":"); hasPass {
			b.WriteString(user)
			b.WriteString(":xxxxx@")
		} else {
			b.WriteString(rest[:at+1])
		}
		rest = rest[at+1:]
	}
	base, query, hasQuery := strings.Cut(rest, "?")
	b.WriteString(base)
	if hasQuery {
		query, frag, hasFrag := strings.Cut(query, "#")
		b.WriteByte('?')
		for i, kv := range strings.Split(query, "&") {
			if i > 0 {
				b.WriteByte('&')
			}
			if k, _, _ := strings.Cut(kv, "="); strings.Contains(strings.ToLower(k), "password") {
				kv = k + "=xxxxx"
			}
			b.WriteString(kv)
		}
		if hasFrag {
			b.WriteByte('#')
			b.WriteString(frag)
		}
	}
	msg := b.String()
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return msg
}

// redactErr renders err with any password from rawURL replaced.
func redactErr(err error, rawURL string) string {
	return hide(err.Error(), rawURL, 300)
}

func hide(msg, rawURL string, max int) string {
	for _, v := range secrets(rawURL) {
		msg = strings.ReplaceAll(msg, v, "xxxxx")
	}
	if len(msg) > max {
		msg = msg[:max] + "…"
	}
	return msg
}
