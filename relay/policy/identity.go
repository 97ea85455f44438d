package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/sluice-relay/sluice/relay/wire"
)

// Sentinel errors of identity and allow-list configuration. Test with
// errors.Is; the wrapping error names the offending field or entry.
var (
	// ErrIdentity is wrapped by Config.Validate for a bad Identity.
	ErrIdentity = errors.New("relay: invalid identity")
	// ErrAllowList is wrapped by NewAllowList.
	ErrAllowList = errors.New("relay: invalid allow-list entry")
)

// Identity says how a request becomes the client a budget belongs to, and
// who is allow-listed. The zero value is usable: the TCP peer is the
// client, IPv6 grouped by /64, no forwarding header believed, nothing
// allow-listed.
type Identity struct {
	// IPv6Prefix is the prefix length IPv6 clients are grouped by. 0 means
	// 64; 128 keys single addresses.
	IPv6Prefix int
	// TrustedProxies are the networks whose forwarding header is believed.
	// Nil means none: the TCP peer is always the client.
	TrustedProxies []netip.Prefix
	// Header is the forwarding header read from trusted proxies: "" means
	// X-Forwarded-For. "X-Real-IP" is read as one
	// address; any other header (X-Forwarded-For, CF-Connecting-IP, …) as
	// a comma-separated list, right-most entry appended last.
	Header string
	// Allow names the addresses and pubkeys charged nothing (see
	// AllowList for what each exempts from). Nil means nothing is
	// allow-listed.
	Allow *AllowList
}

// validate reports a configuration the gate cannot honour: a prefix length
// outside 0…128, an invalid or IPv4-mapped trusted-proxy prefix, or a
// header name that is not an HTTP token.
func (id *Identity) validate() error {
	if id.IPv6Prefix < 0 || id.IPv6Prefix > 128 {
		return fmt.Errorf("%w: ipv6_prefix %d must be 0 (the default, 64) or 1…128", ErrIdentity, id.IPv6Prefix)
	}
	for _, p := range id.TrustedProxies {
		if !p.IsValid() {
			return fmt.Errorf("%w: trusted_proxies: invalid prefix %v", ErrIdentity, p)
		}
		if p.Addr().Is4In6() || p.Addr().Zone() != "" {
			// Peers are compared unmapped and without zones, so such a
			// prefix would silently never match.
			return fmt.Errorf("%w: trusted_proxies: %v: write IPv4 networks as IPv4, without zones", ErrIdentity, p)
		}
	}
	if h := id.Header; h != "" && !isToken(h) {
		return fmt.Errorf("%w: header %q is not a valid header name", ErrIdentity, h)
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110), as a header name must be.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return s != ""
}

// AllowList names the clients charged nothing, by one rule that the gate
// and the hooks share:
//
//   - an address in IPs is charged nothing at all (connections, every
//     message type, the quota);
//   - a connection authenticated (NIP-42, verified) as one of Pubkeys is
//     charged nothing from then on;
//   - an EVENT whose author is one of Pubkeys, on a connection that has
//     not authenticated, is exempt from the actor quota only: it still pays
//     the EVENT windows, because its author is not proven when the windows
//     are charged (a gate does not check signatures), and exempting it
//     would let anyone write that pubkey on a flood. The quota counts only
//     events the relay accepted, so forging the author there buys nothing.
//
// Build it with NewAllowList, which validates every entry; a literal
// AllowList works too. A nil *AllowList allows nothing. It must not be
// changed once in use.
type AllowList struct {
	IPs     []netip.Prefix // IPv4 networks as IPv4: clients are compared unmapped
	Pubkeys []string       // 64 lowercase hex digits each
}

// NewAllowList builds an AllowList from config strings: ips holds addresses
// ("203.0.113.7", "2001:db8::1") and networks ("10.0.0.0/8",
// "2001:db8::/32"); pubkeys holds 64-digit hex pubkeys (either case; stored
// lowercase). An entry that is none of these, or a network with host bits
// set ("10.1.2.3/8", probably a typo), is an error wrapping ErrAllowList
// that names it.
func NewAllowList(ips []string, pubkeys []string) (*AllowList, error) {
	al := &AllowList{}
	for i, s := range ips {
		var p netip.Prefix
		if strings.Contains(s, "/") {
			var err error
			p, err = netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("%w: ips[%d] %q: %v", ErrAllowList, i, s, err)
			}
			if p.Addr().Zone() != "" {
				return nil, fmt.Errorf("%w: ips[%d] %q: zones are not allowed", ErrAllowList, i, s)
			}
			if p.Masked() != p {
				return nil, fmt.Errorf("%w: ips[%d] %q has host bits set (did you mean %v?)", ErrAllowList, i, s, p.Masked())
			}
		} else {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("%w: ips[%d] %q: %v", ErrAllowList, i, s, err)
			}
			if a.Zone() != "" {
				return nil, fmt.Errorf("%w: ips[%d] %q: zones are not allowed", ErrAllowList, i, s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Is4In6() {
			// Clients are compared unmapped, so keep the list unmapped too.
			if p.Bits() < 96 {
				return nil, fmt.Errorf("%w: ips[%d] %q: an IPv4-mapped network must be at least /96", ErrAllowList, i, s)
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		al.IPs = append(al.IPs, p)
	}
	for i, s := range pubkeys {
		if _, ok := wire.DecodeHex32(s); !ok {
			return nil, fmt.Errorf("%w: pubkeys[%d] %q is not 64 hex digits", ErrAllowList, i, s)
		}
		al.Pubkeys = append(al.Pubkeys, strings.ToLower(s))
	}
	return al, nil
}
