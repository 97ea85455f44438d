package redisstore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseURLStandalone(t *testing.T) {
	o, err := parseURL("redis://127.0.0.1:6379/3")
	if err != nil {
		t.Fatal(err)
	}
	if s := o.standalone; s == nil || s.Addr != "127.0.0.1:6379" || s.DB != 3 || !s.ContextTimeoutEnabled || s.TLSConfig != nil {
		t.Fatalf("%+v", o.standalone)
	}
	o, err = parseURL("rediss://user:p%40ss@localhost:6380/0?dial_timeout=2s&max_retries=1")
	if err != nil {
		t.Fatal(err)
	}
	if s := o.standalone; s.Username != "user" || s.Password != "p@ss" || s.TLSConfig == nil || s.DialTimeout != 2*time.Second || s.MaxRetries != 1 {
		t.Fatalf("%+v", s)
	}
	o, err = parseURL("unix:///run/redis.sock?db=2")
	if err != nil {
		t.Fatal(err)
	}
	if s := o.standalone; s.Network != "unix" || s.Addr != "/run/redis.sock" || s.DB != 2 {
		t.Fatalf("%+v", s)
	}
}

func TestParseURLSentinel(t *testing.T) {
	o, err := parseURL("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380,[::1]:26381/mymaster/2?sentinel_password=sp&dial_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	f := o.failover
	if f == nil {
		t.Fatalf("not a failover: %+v", o)
	}
	want := []string{"10.0.0.1:26379", "10.0.0.2:26380", "[::1]:26381"}
	if strings.Join(f.SentinelAddrs, " ") != strings.Join(want, " ") {
		t.Errorf("sentinels %v, want %v", f.SentinelAddrs, want)
	}
	if f.MasterName != "mymaster" || f.DB != 2 || f.Password != "s3cret" || f.SentinelPassword != "sp" ||
		f.DialTimeout != time.Second || !f.ContextTimeoutEnabled || f.TLSConfig != nil {
		t.Errorf("%+v", f)
	}
	o, err = parseURL("rediss+sentinel://h:1/m")
	if err != nil || o.failover.TLSConfig == nil || o.failover.DB != 0 || o.failover.MasterName != "m" {
		t.Errorf("rediss+sentinel: %+v %v", o.failover, err)
	}
}

func TestParseURLCluster(t *testing.T) {
	o, err := parseURL("redis+cluster://u:pw@127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002?read_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	c := o.cluster
	if c == nil {
		t.Fatalf("not a cluster: %+v", o)
	}
	if strings.Join(c.Addrs, " ") != "127.0.0.1:7000 127.0.0.1:7001 127.0.0.1:7002" || c.Username != "u" || c.Password != "pw" ||
		c.ReadTimeout != time.Second || !c.ContextTimeoutEnabled || c.TLSConfig != nil {
		t.Errorf("%+v", c)
	}
	o, err = parseURL("REDISS+CLUSTER://h:1/")
	if err != nil || o.cluster.TLSConfig == nil {
		t.Errorf("rediss+cluster: %+v %v", o.cluster, err)
	}
	// No read_timeout: clusterReadTimeout, not go-redis's 3 s; one given
	// in the URL is kept, -1 (none) included.
	if o.cluster.ReadTimeout != clusterReadTimeout {
		t.Errorf("cluster read timeout %v without read_timeout, want %v", o.cluster.ReadTimeout, clusterReadTimeout)
	}
	for q, want := range map[string]time.Duration{"read_timeout=5s": 5 * time.Second, "read_timeout=-1": -1} {
		o, err = parseURL("redis+cluster://h:1?" + q)
		if err != nil || o.cluster.ReadTimeout != want {
			t.Errorf("%s: read timeout %v (%v), want %v", q, o.cluster.ReadTimeout, err, want)
		}
	}
}

// TestNewClientTypes: each form builds the right client, and New accepts it.
func TestNewClientTypes(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://127.0.0.1:1/0":               "*redis.Client",
		"redis+sentinel://127.0.0.1:1/m":      "*redis.Client",
		"redis+cluster://127.0.0.1:1,[::1]:2": "*redis.ClusterClient",
	} {
		c, err := NewClient(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		switch c.(type) {
		case *redis.Client:
			if want != "*redis.Client" {
				t.Errorf("%s: %T", raw, c)
			}
		case *redis.ClusterClient:
			if want != "*redis.ClusterClient" {
				t.Errorf("%s: %T", raw, c)
			}
		}
		if _, err := New(c, Options{}); err != nil {
			t.Errorf("%s: New refused NewClient's client: %v", raw, err)
		}
		_ = c.Close()
	}
}

// TestNewClientHostile: URLs that are wrong in every way fail with errURL,
// never panic, and never echo the password.
func TestNewClientHostile(t *testing.T) {
	for _, raw := range []string{
		"",
		"://",
		"127.0.0.1:6379",
		"redis",
		"http://sekrit@127.0.0.1:6379",
		"redis://user:sekrit@127.0.0.1:6379/notadb",
		"redis://user:sekrit@127.0.0.1:6379/0?bogus=1",
		"redis://:sekrit@[::1",
		"redis+sentinel://",
		"redis+sentinel://:sekrit@",
		"redis+sentinel://:sekrit@127.0.0.1:26379",
		"redis+sentinel://:sekrit@127.0.0.1:26379/",
		"redis+sentinel://:sekrit@127.0.0.1:26379/m/x",
		"redis+sentinel://:sekrit@127.0.0.1:26379/m/1/2",
		"redis+sentinel://:sekrit@127.0.0.1:26379/m?master_name=n",
		"redis+sentinel://:sekrit@127.0.0.1:26379/m?bogus=1",
		"redis+sentinel://:sekrit@127.0.0.1:26379/m?%zz",
		"redis+sentinel://:sekrit@127.0.0.1/m",
		"redis+sentinel://:sekrit@:26379/m",
		"redis+sentinel://:sekrit@h:1,,h:2/m",
		"redis+sentinel://:sekrit@h:1/%zz",
		"redis+cluster://",
		"redis+cluster://:sekrit@",
		"redis+cluster://:sekrit@127.0.0.1",
		"redis+cluster://:sekrit@127.0.0.1:7000/0",
		"redis+cluster://:sekrit@127.0.0.1:7000,",
		"redis+cluster://:sekrit@,",
		"redis+cluster://:sekrit@127.0.0.1:7000?bogus=1",
		"redis+cluster://:sekrit@127.0.0.1:7000#frag",
		"redis+cluster://%zz:sekrit@127.0.0.1:7000",
		"redis+cluster://:sekrit@h:1:2",
		"redis+cluster://:sekrit@[::1]",
		"redis+cluster://:@:",
		"redis+cluster://:sekrit@\x00:1",
		"redis+bogus://:sekrit@127.0.0.1:1",
		"redis+cluster://:sekrit@" + strings.Repeat("h:1,", 10000) + "x",
		strings.Repeat("redis://", 1000),
		// Passwords with unescaped '/', '?', '#' (base64 ones have '/'),
		// and passwords in the query.
		"redis://:sekrit/sekrit@127.0.0.1:1",
		"redis://u:sekrit?sekrit@127.0.0.1:1/0",
		"redis://u:sekrit#sekrit@127.0.0.1:1/0",
		"rediss://u:sekrit/sekrit@127.0.0.1:1/0",
		"redis+cluster://u:sekrit/sekrit@127.0.0.1:1",
		"redis+cluster://u:sekrit?sekrit@127.0.0.1:1",
		"redis+sentinel://:sekrit/sekrit@127.0.0.1:1/m",
		"redis+sentinel://:sekrit#sekrit@127.0.0.1:1/m",
		"redis+sentinel://127.0.0.1:26379/m?sentinel_password=sekrit&bogus=1",
		"redis+sentinel://127.0.0.1:26379/m?sentinel_password=sekrit#frag",
		"redis://127.0.0.1:6379/0?password=sekrit&bogus=1",
		"redis+cluster://127.0.0.1:7000?password=sekrit&bogus=1",
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%.60q: panic: %v", raw, r)
				}
			}()
			c, err := NewClient(raw)
			if err == nil {
				_ = c.Close()
				t.Errorf("%.60q: no error", raw)
				return
			}
			if !errors.Is(err, errURL) {
				t.Errorf("%.60q: %v does not wrap errURL", raw, err)
			}
			if strings.Contains(err.Error(), "sekrit") {
				t.Errorf("%.60q: the error shows the password: %v", raw, err)
			}
			if len(err.Error()) > 600 {
				t.Errorf("%.60q: a %d-byte error", raw, len(err.Error()))
			}
		}()
	}
}

// FuzzNewClient: no input panics, a failure wraps errURL, and a password
// never shows in an error.
func FuzzNewClient(f *testing.F) {
	for _, s := range []string{
		"redis://127.0.0.1:6379/0", "rediss://u:p@h:1/2?dial_timeout=1s", "unix:///s?db=1",
		"redis+sentinel://:p@h:1,h:2/m/1", "redis+cluster://u:p@h:1,[::1]:2?read_timeout=1s",
		"redis+cluster://%zz@h:1", "redis+sentinel://h:1/m?master_name=x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		o, err := parseURL(raw)
		if err != nil {
			if !errors.Is(err, errURL) {
				t.Fatalf("%q: %v does not wrap errURL", raw, err)
			}
			return
		}
		_ = o
	})
}

func TestRedactURL(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://127.0.0.1:6379/0":                              "redis://127.0.0.1:6379/0",
		"redis://u:sekrit@127.0.0.1:6379/0":                     "redis://u:xxxxx@127.0.0.1:6379/0",
		"redis://:se/krit@127.0.0.1:6379":                       "redis://:xxxxx@127.0.0.1:6379",
		"redis://:se%2Fkrit@h:1":                                "redis://:xxxxx@h:1",
		"redis+sentinel://h:1/m?sentinel_password=sekrit&db=1":  "redis+sentinel://h:1/m?sentinel_password=xxxxx&db=1",
		"redis+cluster://u:p%40ss@h:1,h:2?password=sekrit#frag": "redis+cluster://u:xxxxx@h:1,h:2?password=xxxxx#frag",
		// A short password is replaced where it stands, not in the host,
		// the database, the scheme or a key's name.
		"redis://default:0@127.0.0.1:6379/0":                   "redis://default:xxxxx@127.0.0.1:6379/0",
		"redis://:redis@127.0.0.1:6379/0":                      "redis://:xxxxx@127.0.0.1:6379/0",
		"redis+sentinel://:p@h:1/m/0?sentinel_password=s&db=1": "redis+sentinel://:xxxxx@h:1/m/0?sentinel_password=xxxxx&db=1",
		"redis://u@h:1/0":                                      "redis://u@h:1/0",
		"redis://:se?cr#et@h:1/0":                              "redis://:xxxxx@h:1/0",
	} {
		if got := RedactURL(raw); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// TestBareHello: only go-redis's bare handshake is answered by the dialer;
// one that carries a password or a name goes to Redis.
func TestBareHello(t *testing.T) {
	for cmd, want := range map[string]bool{
		"*2\r\n$5\r\nhello\r\n$1\r\n3\r\n":                                            true,
		"*2\r\n$5\r\nHELLO\r\n$1\r\n2\r\n":                                            true,
		"*2\r\n$5\r\nhello\r\n$1\r\n4\r\n":                                            false,
		"*5\r\n$5\r\nhello\r\n$1\r\n2\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$2\r\npw\r\n": false,
		"*2\r\n$5\r\nhello\r\n$1\r\n3\r\n*1\r\n$4\r\nPING\r\n":                        false,
		"*1\r\n$4\r\nPING\r\n":                                                        false,
	} {
		if got := isBareHello([]byte(cmd)); got != want {
			t.Errorf("isBareHello(%q) = %v, want %v", cmd, got, want)
		}
	}
}
