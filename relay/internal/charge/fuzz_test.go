package charge

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// FuzzClient checks Identity.Client on arbitrary peers and forwarding
// headers: it never panics, the key always matches the address, garbage is
// never believed, and an untrusted peer is always the client itself.
func FuzzClient(f *testing.F) {
	f.Add("10.0.0.1:1", "6.6.6.6, 198.51.100.9, 10.9.9.9", false)
	f.Add("203.0.113.7:1", "1.2.3.4", false)
	f.Add("[2001:db8::1]:1", "[2001:db8:5::1]:80", true)
	f.Add("[fe80::1%eth0]:1", "fe80::2%lo", false)
	f.Add("10.0.0.1:1", ",,,", false)
	f.Add("pipe", "1.2.3.4", true)
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	f.Fuzz(func(t *testing.T, remote, header string, realIP bool) {
		id := &Identity{TrustedProxies: trusted}
		name := "X-Forwarded-For"
		if realIP {
			id.Header, name = "X-Real-IP", "X-Real-Ip"
		}
		r := &http.Request{RemoteAddr: remote, Header: http.Header{name: strings.Split(header, "\n")}}
		client, addr := id.Client(r)
		peer, peerOK := parseHost(remote)
		if !addr.IsValid() {
			if client != UnknownClient || peerOK {
				t.Fatalf("no address but client %q (peer %v ok=%v)", client, peer, peerOK)
			}
			return
		}
		if addr.Zone() != "" || addr.Is4In6() || addr.IsUnspecified() {
			t.Fatalf("address %v not normalised", addr)
		}
		if !peerOK {
			t.Fatalf("address %v from an unreadable peer %q", addr, remote)
		}
		if !id.trusted(peer) && addr != peer {
			t.Fatalf("untrusted peer %v, but client address %v (header %q)", peer, addr, header)
		}
		if addr != peer {
			// The address came from the header: one of its entries reads as it.
			found := false
			for _, e := range strings.FieldsFunc(header, func(r rune) bool { return r == ',' || r == '\n' }) {
				if a, ok := parseForwarded(e); ok && a == addr {
					found = true
				}
			}
			if !found {
				t.Fatalf("client address %v is neither the peer nor in the header %q", addr, header)
			}
		}
		if client != id.ClientFromAddr(addr) {
			t.Fatalf("client %q != ClientFromAddr(%v)", client, addr)
		}
		if addr.Is4() {
			if client != addr.String() {
				t.Fatalf("IPv4 client %q for %v", client, addr)
			}
		} else if p, err := netip.ParsePrefix(client); err != nil || p.Bits() != defaultIPv6Prefix || !p.Contains(addr) {
			t.Fatalf("IPv6 client %q for %v: %v", client, addr, err)
		}
	})
}
