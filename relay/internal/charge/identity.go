package charge

import (
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"

	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
)

// Identity is a policy.Identity at work: it turns a request, or the address
// a hook is given, into the client a budget belongs to, and answers the
// allow-list. A nil *Identity is the zero policy.Identity's. It must not be
// changed once in use; it is then safe for concurrent use.
type Identity policy.Identity

// defaultIPv6Prefix groups IPv6 clients by /64, the block one subscriber
// usually holds: keying single IPv6 addresses would let a client rotate
// through 2^64 budgets. defaultForwardHeader is the forwarding header
// believed from trusted proxies when Identity.Header is empty.
const (
	defaultIPv6Prefix    = 64
	defaultForwardHeader = "X-Forwarded-For"
)

// UnknownClient is the client of a request or hook whose address cannot be
// read. Every such client shares this one budget: garbage never mints a key
// of its own.
const UnknownClient = "unknown"

// maxForwardHops bounds the entries of a forwarding header Client looks
// at; maxForwardEntry bounds one entry's length. Longer chains of trusted
// proxies than this do not exist in practice, so a header that needs more is
// treated as garbage and the TCP peer is the client.
const (
	maxForwardHops  = 32
	maxForwardEntry = 64 // "[" + 45-byte IPv6 + "]:65535", with room to spare
)

// Client returns the client of r as a key string and its address.
//
// The address is the TCP peer's (r.RemoteAddr), unless the peer is in
// TrustedProxies: then the forwarding header is read right to left and the
// first address that is not itself a trusted proxy is the client (when every
// entry is trusted, the left-most). Entries left of the client are never
// looked at, so whatever a client writes into the header itself cannot help
// it. A header that is missing, malformed where it is read, or longer than 32
// hops leaves the peer as the client: garbage is never believed.
//
// The key is the address rendered by ClientFromAddr: IPv4 whole, IPv6 as its
// IPv6Prefix network. An IPv4-mapped IPv6 address counts as IPv4 and zones
// are dropped. When even the peer cannot be read, client is UnknownClient
// and addr is the zero Addr.
func (id *Identity) Client(r *http.Request) (client string, addr netip.Addr) {
	addr = id.Addr(r)
	return id.ClientFromAddr(addr), addr
}

// Addr is Client without the key: the client's address, or the zero Addr
// when the peer cannot be read. It does not allocate.
func (id *Identity) Addr(r *http.Request) netip.Addr {
	peer, ok := parseHost(r.RemoteAddr)
	if !ok {
		return netip.Addr{}
	}
	if !id.trusted(peer) {
		return peer
	}
	header := defaultForwardHeader
	if id.Header != "" {
		header = id.Header
	}
	if strings.EqualFold(header, "X-Real-IP") {
		vals := r.Header["X-Real-Ip"]
		if len(vals) != 1 {
			return peer
		}
		if a, ok := parseForwarded(vals[0]); ok {
			return a
		}
		return peer
	}
	if a, ok := id.walkForwarded(r.Header[textproto.CanonicalMIMEHeaderKey(header)]); ok {
		return a
	}
	return peer
}

// walkForwarded reads a list-valued forwarding header (all its lines, in
// order, form one list) from the right and returns the first untrusted
// address, or the left-most one when all are trusted. ok is false for no
// entries, a malformed entry before the client is found, or too many hops.
func (id *Identity) walkForwarded(vals []string) (netip.Addr, bool) {
	var last netip.Addr
	hops := 0
	for v := len(vals) - 1; v >= 0; v-- {
		s := vals[v]
		for {
			hops++
			if hops > maxForwardHops {
				return netip.Addr{}, false
			}
			entry := s
			comma := strings.LastIndexByte(s, ',')
			if comma >= 0 {
				entry = s[comma+1:]
			}
			a, ok := parseForwarded(entry)
			if !ok {
				return netip.Addr{}, false
			}
			if !id.trusted(a) {
				return a, true
			}
			last = a
			if comma < 0 {
				break
			}
			s = s[:comma]
		}
	}
	return last, last.IsValid()
}

// trusted reports whether a is in TrustedProxies.
// FromTrustedProxy reports whether r's TCP peer is one of the trusted
// proxies, whose forwarding headers (X-Forwarded-Host too) are believed.
func (id *Identity) FromTrustedProxy(r *http.Request) bool {
	peer, ok := parseHost(r.RemoteAddr)
	return ok && id.trusted(peer)
}

func (id *Identity) trusted(a netip.Addr) bool {
	if id == nil {
		return false
	}
	for _, p := range id.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseForwarded reads one forwarding-header entry: an address, optionally
// with a port ("203.0.113.7:4711", "[2001:db8::1]:4711") or in brackets,
// surrounded by optional whitespace. Unspecified addresses are garbage.
func parseForwarded(s string) (netip.Addr, bool) {
	s = strings.Trim(s, " \t")
	if len(s) > maxForwardEntry {
		return netip.Addr{}, false
	}
	return parseHost(s)
}

// parseHost reads "ip", "ip:port", "[ip]" or "[ip]:port" and normalises the
// address: IPv4-mapped IPv6 becomes IPv4, a zone is dropped. Unspecified and
// invalid addresses are refused.
func parseHost(s string) (netip.Addr, bool) {
	// The form is chosen by syntax first: the netip parsers allocate an
	// error for every input they refuse, and Client must not allocate.
	host := s
	if len(s) > 0 && s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 || !validPort(s[end+1:], true) {
			return netip.Addr{}, false
		}
		host = s[1:end]
		if strings.IndexByte(host, ':') < 0 {
			return netip.Addr{}, false // brackets are for IPv6 only
		}
	} else if c := strings.Count(s, ":"); c == 1 {
		colon := strings.IndexByte(s, ':')
		if !validPort(s[colon:], false) {
			return netip.Addr{}, false
		}
		host = s[:colon]
	}
	if host == "" {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	a = a.WithZone("").Unmap()
	if !a.IsValid() || a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a, true
}

// validPort reports whether s is ":" followed by 1–5 digits, or, when empty
// is true, the empty string.
func validPort(s string, empty bool) bool {
	if s == "" {
		return empty
	}
	if s[0] != ':' || len(s) < 2 || len(s) > 6 {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ClientFromAddr renders addr as a client key: IPv4 whole ("203.0.113.7"),
// IPv6 as its IPv6Prefix network ("2001:db8:1:2::/64"), IPv4-mapped IPv6 as
// IPv4, zones dropped; UnknownClient for the zero Addr.
func (id *Identity) ClientFromAddr(addr netip.Addr) string {
	var buf [64]byte
	return string(id.appendClient(buf[:0], addr))
}

// appendClient appends ClientFromAddr(addr) to dst without allocating.
func (id *Identity) appendClient(dst []byte, addr netip.Addr) []byte {
	addr = addr.WithZone("").Unmap()
	if !addr.IsValid() {
		return append(dst, UnknownClient...)
	}
	if addr.Is4() {
		return addr.AppendTo(dst)
	}
	p, _ := addr.Prefix(id.PrefixBits())
	return p.AppendTo(dst)
}

// clientFromString is ClientFromAddr for an address held as a string, as
// hook users get it (khatru.GetIP, rely's Client.IP): "ip", "ip:port",
// "[ip]" and "[ip]:port" are read; anything else is UnknownClient. The
// string is not a forwarding header: it is taken as the client's address
// as it is, so the caller must know where it came from.
func (id *Identity) clientFromString(ip string) string {
	a, _ := parseHost(strings.TrimSpace(ip))
	return id.ClientFromAddr(a)
}

// ClientOf maps an address string, as hooks get it, onto its client key,
// the address read (the zero Addr when unreadable) and whether it is
// allow-listed; see Key.
func (id *Identity) ClientOf(ip string) (key string, addr netip.Addr, free bool) {
	a, _ := parseHost(strings.TrimSpace(ip))
	return id.ClientFromAddr(a), a, id.AllowsAddr(a)
}

// Key maps an address string onto a client key for the hooks: key is
// clientFromString(ip), and charge is false when the address is in
// AllowIPs (an allow-listed client is never charged). An unreadable address
// is charged to UnknownClient.
func (id *Identity) Key(ip string) (key string, charge bool) {
	a, _ := parseHost(strings.TrimSpace(ip))
	if id.AllowsAddr(a) {
		return id.ClientFromAddr(a), false
	}
	return id.ClientFromAddr(a), true
}

// allowsAddr reports whether addr is in one of the allow-listed networks.
// IPv4-mapped addresses are compared as IPv4, zones are ignored. It does not
// allocate.
func allowsAddr(nets []netip.Prefix, addr netip.Addr) bool {
	if !addr.IsValid() {
		return false
	}
	addr = addr.WithZone("").Unmap()
	for _, p := range nets {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// allowsPubkey reports whether pubkeyHex (64 hex digits, either case) is
// in pubkeys, by a linear scan. It does not allocate.
func allowsPubkey(pubkeys []string, pubkeyHex string) bool {
	k, ok := scan.DecodeHex32(pubkeyHex)
	if !ok {
		return false
	}
	for _, p := range pubkeys {
		if q, ok := scan.DecodeHex32(p); ok && q == k {
			return true
		}
	}
	return false
}

// AllowsAddr reports whether AllowIPs lists addr; false for a nil Identity.
func (id *Identity) AllowsAddr(addr netip.Addr) bool {
	return id != nil && allowsAddr(id.AllowIPs, addr)
}

// AllowsPubkey reports whether AllowPubkeys lists pubkeyHex; false for a
// nil Identity.
func (id *Identity) AllowsPubkey(pubkeyHex string) bool {
	return id != nil && allowsPubkey(id.AllowPubkeys, pubkeyHex)
}

// PrefixBits returns the prefix length IPv6 clients are grouped by.
func (id *Identity) PrefixBits() int {
	if id != nil && id.IPv6Prefix > 0 && id.IPv6Prefix <= 128 {
		return id.IPv6Prefix
	}
	return defaultIPv6Prefix
}
