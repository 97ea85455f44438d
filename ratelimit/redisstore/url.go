package redisstore

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrURL is wrapped by NewClient for a URL it cannot use.
var ErrURL = errors.New("redisstore: invalid redis URL")

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
// with a Redis restart.
//
// The error, wrapping ErrURL, names what is wrong; the password is never
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

func (o clientOptions) client() redis.UniversalClient {
	switch {
	case o.failover != nil:
		return redis.NewFailoverClient(o.failover)
	case o.cluster != nil:
		return redis.NewClusterClient(o.cluster)
	}
	return redis.NewClient(o.standalone)
}

func parseURL(rawURL string) (clientOptions, error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return clientOptions{}, fmt.Errorf("%w: %q has no scheme (want redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://)", ErrURL, redact(rawURL))
	}
	switch s := strings.ToLower(scheme); s {
	case "redis", "rediss", "unix":
		o, err := redis.ParseURL(s + "://" + rest)
		if err != nil {
			return clientOptions{}, fmt.Errorf("%w: %s: %s", ErrURL, redact(rawURL), redactErr(err, rawURL))
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
	return clientOptions{}, fmt.Errorf("%w: unknown scheme %q (want redis, rediss, unix, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster)", ErrURL, redact(scheme))
}

// splitHosts parses "[userinfo@]h:p[,h:p…][/path][?query]" into its parts.
// The host list is taken apart by hand because net/url refuses a comma
// separated host list with ports.
func splitHosts(rest, rawURL string) (user *url.Userinfo, hosts []string, path, query string, err error) {
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		return nil, nil, "", "", fmt.Errorf("%w: %s: a fragment (#…) means nothing here", ErrURL, redact(rawURL))
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
			return nil, nil, "", "", fmt.Errorf("%w: %s: unreadable user:password part", ErrURL, redact(rawURL))
		}
		user, authority = u.User, authority[i+1:]
	}
	if authority == "" {
		return nil, nil, "", "", fmt.Errorf("%w: %s: no host:port", ErrURL, redact(rawURL))
	}
	for _, h := range strings.Split(authority, ",") {
		host, port, serr := net.SplitHostPort(h)
		if serr != nil || host == "" || port == "" {
			return nil, nil, "", "", fmt.Errorf("%w: %s: %q is not host:port", ErrURL, redact(rawURL), h)
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
		return nil, fmt.Errorf("%w: %s: query: %v", ErrURL, redact(rawURL), err)
	}
	parts := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	if len(parts) == 0 || len(parts) > 2 {
		return nil, fmt.Errorf("%w: %s: want /mastername[/db] after the sentinel addresses", ErrURL, redact(rawURL))
	}
	master, err := url.PathUnescape(parts[0])
	if err != nil || master == "" {
		return nil, fmt.Errorf("%w: %s: unreadable master name", ErrURL, redact(rawURL))
	}
	if q.Has("master_name") {
		return nil, fmt.Errorf("%w: %s: the master name goes in the path, not in master_name=", ErrURL, redact(rawURL))
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
		return nil, fmt.Errorf("%w: %s: %s", ErrURL, redact(rawURL), redactErr(err, rawURL))
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
		return nil, fmt.Errorf("%w: %s: a cluster URL has no path (Redis Cluster has only database 0)", ErrURL, redact(rawURL))
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: query: %v", ErrURL, redact(rawURL), err)
	}
	o, err := redis.ParseClusterURL(goRedisURL(scheme, user, hosts, "", q))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrURL, redact(rawURL), redactErr(err, rawURL))
	}
	o.ContextTimeoutEnabled = true
	return o, nil
}

// redact replaces the password in a URL-ish string with "xxxxx", and cuts
// it short, so errors and logs can name the URL.
func redact(raw string) string {
	out := raw
	if scheme, rest, ok := strings.Cut(raw, "://"); ok {
		auth := rest
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			auth = rest[:i]
		}
		if at := strings.LastIndexByte(auth, '@'); at >= 0 {
			userinfo := auth[:at]
			if c := strings.IndexByte(userinfo, ':'); c >= 0 {
				userinfo = userinfo[:c+1] + "xxxxx"
			}
			out = scheme + "://" + userinfo + rest[at:]
		}
	}
	if len(out) > 200 {
		out = out[:200] + "…"
	}
	return out
}

// redactErr renders err with any password from rawURL replaced.
func redactErr(err error, rawURL string) string {
	msg := err.Error()
	_, rest, _ := strings.Cut(rawURL, "://")
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if c := strings.IndexByte(rest[:at], ':'); c >= 0 && c+1 < at {
			pass := rest[c+1 : at]
			msg = strings.ReplaceAll(msg, pass, "xxxxx")
			if dec, derr := url.PathUnescape(pass); derr == nil && dec != "" {
				msg = strings.ReplaceAll(msg, dec, "xxxxx")
			}
		}
	}
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return msg
}
