package charge

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-relay/sluice/relay/policy"
)

func mustPrefixes(t *testing.T, ss ...string) []netip.Prefix {
	t.Helper()
	var ps []netip.Prefix
	for _, s := range ss {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}

func TestIdentityClient(t *testing.T) {
	proxies := mustPrefixes(t, "10.0.0.0/8", "192.0.2.0/24", "2001:db8:ffff::/48")
	xff := &Identity{TrustedProxies: proxies}
	realIP := &Identity{TrustedProxies: proxies, Header: "X-Real-IP"}
	tests := []struct {
		name    string
		id      *Identity
		remote  string
		headers map[string][]string
		client  string
		addr    string // "" means the zero Addr
	}{
		{"ipv4 peer", nil, "203.0.113.7:4711", nil, "203.0.113.7", "203.0.113.7"},
		{"ipv4 peer zero identity", &Identity{}, "203.0.113.7:4711", nil, "203.0.113.7", "203.0.113.7"},
		{"ipv6 peer grouped by /64", nil, "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", nil, "2001:db8:1:2::/64", "2001:db8:1:2:aaaa:bbbb:cccc:dddd"},
		{"ipv6 neighbour shares the /64", nil, "[2001:db8:1:2::1]:443", nil, "2001:db8:1:2::/64", "2001:db8:1:2::1"},
		{"ipv6 /48", &Identity{IPv6Prefix: 48}, "[2001:db8:1:2::1]:443", nil, "2001:db8:1::/48", "2001:db8:1:2::1"},
		{"ipv6 /128", &Identity{IPv6Prefix: 128}, "[2001:db8:1:2::1]:443", nil, "2001:db8:1:2::1/128", "2001:db8:1:2::1"},
		{"ipv4-mapped peer", nil, "[::ffff:203.0.113.7]:80", nil, "203.0.113.7", "203.0.113.7"},
		{"zone dropped", nil, "[fe80::1%eth0]:80", nil, "fe80::/64", "fe80::1"},
		{"peer without port", nil, "203.0.113.7", nil, "203.0.113.7", "203.0.113.7"},
		{"garbage peer", nil, "pipe", nil, UnknownClient, ""},
		{"empty peer", nil, "", nil, UnknownClient, ""},
		{"unspecified peer", nil, "0.0.0.0:1", nil, UnknownClient, ""},

		{"spoofed XFF from untrusted peer", xff, "203.0.113.7:1",
			map[string][]string{"X-Forwarded-For": {"1.2.3.4"}}, "203.0.113.7", "203.0.113.7"},
		{"spoofed X-Real-IP from untrusted peer", realIP, "203.0.113.7:1",
			map[string][]string{"X-Real-Ip": {"1.2.3.4"}}, "203.0.113.7", "203.0.113.7"},
		{"no header configured to trust: XFF ignored", &Identity{}, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"1.2.3.4"}}, "10.0.0.1", "10.0.0.1"},
		{"one trusted proxy", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"198.51.100.9"}}, "198.51.100.9", "198.51.100.9"},
		{"client-written left entries ignored", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"6.6.6.6, 7.7.7.7, 198.51.100.9"}}, "198.51.100.9", "198.51.100.9"},
		{"garbage left of the client ignored", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"not an ip,, 198.51.100.9"}}, "198.51.100.9", "198.51.100.9"},
		{"chain of trusted proxies", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.9, 192.0.2.5, 10.9.9.9"}}, "198.51.100.9", "198.51.100.9"},
		{"chain across header lines", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.9", "192.0.2.5", "10.9.9.9"}}, "198.51.100.9", "198.51.100.9"},
		{"all trusted: left-most", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"10.1.1.1, 192.0.2.5, 10.9.9.9"}}, "10.1.1.1", "10.1.1.1"},
		{"ipv6 client through ipv6 proxy", xff, "[2001:db8:ffff::1]:1",
			map[string][]string{"X-Forwarded-For": {"2001:db8:5:6:7::8"}}, "2001:db8:5:6::/64", "2001:db8:5:6:7::8"},
		{"ipv6 client with brackets and port", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"[2001:db8:5:6::8]:5555"}}, "2001:db8:5:6::/64", "2001:db8:5:6::8"},
		{"ipv6 client in brackets", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"[2001:db8:5:6::8]"}}, "2001:db8:5:6::/64", "2001:db8:5:6::8"},
		{"ipv4 client with port", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {" 198.51.100.9:4711 "}}, "198.51.100.9", "198.51.100.9"},
		{"ipv4-mapped client", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"::ffff:198.51.100.9"}}, "198.51.100.9", "198.51.100.9"},
		{"ipv4-mapped trusted proxy", xff, "[::ffff:10.0.0.1]:1",
			map[string][]string{"X-Forwarded-For": {"198.51.100.9"}}, "198.51.100.9", "198.51.100.9"},
		{"zone in header dropped", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"fe80::1%eth0"}}, "fe80::/64", "fe80::1"},
		{"missing header from trusted proxy", xff, "10.0.0.1:1", nil, "10.0.0.1", "10.0.0.1"},
		{"empty header from trusted proxy", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {""}}, "10.0.0.1", "10.0.0.1"},
		{"garbage header from trusted proxy", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"unknown"}}, "10.0.0.1", "10.0.0.1"},
		{"garbage right of the client", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"198.51.100.9, bogus"}}, "10.0.0.1", "10.0.0.1"},
		{"empty entry right of the client", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"198.51.100.9,"}}, "10.0.0.1", "10.0.0.1"},
		{"unspecified entry", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"0.0.0.0"}}, "10.0.0.1", "10.0.0.1"},
		{"leading-zero ipv4 refused", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"010.1.1.1"}}, "10.0.0.1", "10.0.0.1"},
		{"overlong entry", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {strings.Repeat("1", 100)}}, "10.0.0.1", "10.0.0.1"},
		{"too many trusted hops", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {strings.Repeat("10.1.1.1,", 40) + "10.1.1.1"}}, "10.0.0.1", "10.0.0.1"},
		{"huge header, client right-most", xff, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {strings.Repeat("1.1.1.1,", 100000) + "198.51.100.9"}}, "198.51.100.9", "198.51.100.9"},
		{"X-Real-IP from trusted proxy", realIP, "10.0.0.1:1",
			map[string][]string{"X-Real-Ip": {"198.51.100.9"}, "X-Forwarded-For": {"6.6.6.6"}}, "198.51.100.9", "198.51.100.9"},
		{"X-Real-IP that is itself trusted", realIP, "10.0.0.1:1",
			map[string][]string{"X-Real-Ip": {"10.2.2.2"}}, "10.2.2.2", "10.2.2.2"},
		{"X-Real-IP list is garbage", realIP, "10.0.0.1:1",
			map[string][]string{"X-Real-Ip": {"1.1.1.1, 198.51.100.9"}}, "10.0.0.1", "10.0.0.1"},
		{"X-Real-IP twice is garbage", realIP, "10.0.0.1:1",
			map[string][]string{"X-Real-Ip": {"1.1.1.1", "198.51.100.9"}}, "10.0.0.1", "10.0.0.1"},
		{"X-Real-IP ignores XFF", realIP, "10.0.0.1:1",
			map[string][]string{"X-Forwarded-For": {"198.51.100.9"}}, "10.0.0.1", "10.0.0.1"},
		{"custom header", &Identity{TrustedProxies: proxies, Header: "cf-connecting-ip"}, "10.0.0.1:1",
			map[string][]string{"Cf-Connecting-Ip": {"198.51.100.9"}, "X-Forwarded-For": {"6.6.6.6"}}, "198.51.100.9", "198.51.100.9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tt.remote, Header: http.Header(tt.headers)}
			if r.Header == nil {
				r.Header = http.Header{}
			}
			client, addr := tt.id.Client(r)
			if client != tt.client {
				t.Errorf("client = %q, want %q", client, tt.client)
			}
			var want netip.Addr
			if tt.addr != "" {
				want = netip.MustParseAddr(tt.addr)
			}
			if addr != want {
				t.Errorf("addr = %v, want %v", addr, want)
			}
		})
	}
}

func TestIdentityClientFromString(t *testing.T) {
	id := &Identity{IPv6Prefix: 56}
	for in, want := range map[string]string{
		"203.0.113.7":               "203.0.113.7",
		" 203.0.113.7 ":             "203.0.113.7",
		"203.0.113.7:80":            "203.0.113.7",
		"::ffff:203.0.113.7":        "203.0.113.7",
		"2001:db8:1:2ff::1":         "2001:db8:1:200::/56",
		"[2001:db8:1:2ff::1]:9":     "2001:db8:1:200::/56",
		"[2001:db8:1:2ff::1]":       "2001:db8:1:200::/56",
		"fe80::1%lo":                "fe80::/56",
		"":                          UnknownClient,
		"localhost":                 UnknownClient,
		"[203.0.113.7]":             UnknownClient,
		"203.0.113.7, 198.51.100.9": UnknownClient,
		"::":                        UnknownClient,
	} {
		if got := id.clientFromString(in); got != want {
			t.Errorf("clientFromString(%q) = %q, want %q", in, got, want)
		}
	}
	var nilID *Identity
	if got := nilID.clientFromString("2001:db8:1:2:3::1"); got != "2001:db8:1:2::/64" {
		t.Errorf("nil Identity groups by %q, want the /64 default", got)
	}
}

func TestIdentityValidate(t *testing.T) {
	for _, bad := range []*Identity{
		{IPv6Prefix: -1},
		{IPv6Prefix: 129},
		{TrustedProxies: []netip.Prefix{{}}},
		{TrustedProxies: mustPrefixes(t, "::ffff:10.0.0.0/104")},
		{Header: "X Forwarded For"},
		{Header: "X-Forwarded-For:"},
	} {
		var fe *policy.FieldError
		if err := (&policy.Config{Identity: policy.Identity(*bad)}).Validate(); !errors.As(err, &fe) || !strings.HasPrefix(fe.Path, "Identity.") {
			t.Errorf("Validate(%+v) = %v, want a FieldError under Identity", bad, err)
		}
	}
	for _, good := range []*Identity{{}, {IPv6Prefix: 128, Header: "X-Real-IP", TrustedProxies: mustPrefixes(t, "10.0.0.0/8")}} {
		if err := (&policy.Config{Identity: policy.Identity(*good)}).Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", good, err)
		}
	}
}

const (
	pkA = "6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93"
	pkB = "82341f882b6eabcd2ba7f1ef90aad961cf074af15b9ef44a09f9d2a8fbfbe6a2"
)

func TestAllowList(t *testing.T) {
	ips := mustPrefixes(t, "203.0.113.7/32", "10.0.0.0/8", "2001:db8::/32", "192.0.2.0/24")
	pubkeys := []string{pkA, strings.ToUpper(pkB)}
	for addr, want := range map[string]bool{
		"203.0.113.7":       true,
		"203.0.113.8":       false,
		"10.255.0.1":        true,
		"11.0.0.1":          false,
		"::ffff:10.1.2.3":   true,
		"2001:db8:1::1":     true,
		"2001:db9::1":       false,
		"fe80::1%eth0":      false,
		"192.0.2.77":        true,
		"::ffff:192.0.2.77": true,
	} {
		if got := allowsAddr(ips, netip.MustParseAddr(addr)); got != want {
			t.Errorf("AllowsAddr(%s) = %v, want %v", addr, got, want)
		}
	}
	if allowsAddr(ips, netip.Addr{}) {
		t.Error("the zero Addr is allowed")
	}
	for pk, want := range map[string]bool{
		pkA:                     true,
		strings.ToUpper(pkA):    true,
		pkB:                     true,
		pkA[:63] + "0":          pkA[63] == '0',
		pkA[:63]:                false,
		pkA + "00":              false,
		"":                      false,
		strings.Repeat("g", 64): false,
	} {
		if got := allowsPubkey(pubkeys, pk); got != want {
			t.Errorf("AllowsPubkey(%q) = %v, want %v", pk, got, want)
		}
	}
	if allowsAddr(nil, netip.MustParseAddr("10.0.0.1")) || allowsPubkey(nil, pkA) {
		t.Error("a nil allow-list allows something")
	}
	var noID *Identity
	if noID.AllowsAddr(netip.MustParseAddr("10.0.0.1")) || noID.AllowsPubkey(pkA) {
		t.Error("nil Identity allows something")
	}
	id := &Identity{AllowIPs: ips, AllowPubkeys: pubkeys}
	if !id.AllowsPubkey(pkA) || !id.AllowsAddr(netip.MustParseAddr("10.0.0.1")) {
		t.Error("Identity does not look in AllowIPs and AllowPubkeys")
	}
}

func TestIdentityKey(t *testing.T) {
	id := &Identity{AllowIPs: mustPrefixes(t, "10.0.0.0/8")}
	for _, tt := range []struct {
		ip     string
		key    string
		charge bool
	}{
		{"10.1.2.3", "10.1.2.3", false},
		{"203.0.113.7", "203.0.113.7", true},
		{"2001:db8::1", "2001:db8::/64", true},
		{"garbage", UnknownClient, true},
	} {
		key, charge := id.Key(tt.ip)
		if key != tt.key || charge != tt.charge {
			t.Errorf("Key(%q) = %q, %v; want %q, %v", tt.ip, key, charge, tt.key, tt.charge)
		}
	}
}

func TestIdentityAllocs(t *testing.T) {
	id := &Identity{TrustedProxies: mustPrefixes(t, "10.0.0.0/8")}
	r := &http.Request{RemoteAddr: "10.0.0.1:5", Header: http.Header{"X-Forwarded-For": {"6.6.6.6, 2001:db8::1, 10.9.9.9"}}}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = id.appendClient(buf[:0], id.Addr(r)) }); n != 0 {
		t.Errorf("Addr+appendClient allocates %v times", n)
	}
	ips, pubkeys := mustPrefixes(t, "10.0.0.0/8"), []string{pkA}
	a := netip.MustParseAddr("10.1.1.1")
	if n := testing.AllocsPerRun(100, func() { _ = allowsAddr(ips, a) || allowsPubkey(pubkeys, pkA) }); n != 0 {
		t.Errorf("allow-list lookups allocate %v times", n)
	}
}

func BenchmarkIdentity(b *testing.B) {
	id := &Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.0/24")}}
	direct := &http.Request{RemoteAddr: "203.0.113.7:4711", Header: http.Header{}}
	direct6 := &http.Request{RemoteAddr: "[2001:db8:1:2::7]:4711", Header: http.Header{}}
	chain := &http.Request{RemoteAddr: "10.0.0.1:4711", Header: http.Header{"X-Forwarded-For": {"6.6.6.6, 2001:db8:1:2::7, 192.0.2.9, 10.9.9.9"}}}
	for _, bm := range []struct {
		name string
		r    *http.Request
	}{{"ipv4-peer", direct}, {"ipv6-peer", direct6}, {"xff-chain", chain}} {
		b.Run(bm.name+"/Addr+appendClient", func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 64)
			for b.Loop() {
				buf = id.appendClient(buf[:0], id.Addr(bm.r))
			}
		})
		b.Run(bm.name+"/Client", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = id.Client(bm.r)
			}
		})
	}
	ips, pubkeys := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}, []string{pkA, pkB}
	a := netip.MustParseAddr("203.0.113.7")
	b.Run("AllowList", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = allowsAddr(ips, a) || allowsPubkey(pubkeys, pkB)
		}
	})
}
