package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// Identity says how a request becomes the client a budget belongs to, and
// who is allow-listed. The zero value is usable: the TCP peer is the
// client, IPv6 grouped by /64, no forwarding header believed, nothing
// allow-listed.
//
// The allow-lists follow one rule, shared by the gate and the hooks:
//
//   - an address in AllowIPs is charged nothing at all (connections, every
//     message type, the quota);
//   - a connection authenticated (NIP-42, verified) as one of AllowPubkeys
//     is charged nothing from then on;
//   - an EVENT whose author is one of AllowPubkeys, on a connection that
//     has not authenticated, is exempt from the actor quota only: it still
//     pays the EVENT windows, because its author is not proven when the
//     windows are charged (a gate does not check signatures), and
//     exempting it would let anyone write that pubkey on a flood. The
//     quota counts only events the relay accepted, so forging the author
//     there buys nothing.
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
	// AllowIPs are the allow-listed networks (a single address is a /32 or
	// /128). Write IPv4 networks as IPv4: clients are compared unmapped.
	// Nil allows no address.
	AllowIPs []netip.Prefix
	// AllowPubkeys are the allow-listed pubkeys, 64 hex digits each
	// (either case). Nil allows no pubkey.
	AllowPubkeys []string
}

// validate adds to errs, under path, what the gate cannot honour: a prefix
// length outside 0…128, an invalid, IPv4-mapped or zoned network (peers
// are compared unmapped and without zones, so such a prefix would silently
// never match), a header name that is not an HTTP token, and an
// allow-listed pubkey that is not 64 hex digits.
func (id *Identity) validate(errs *fieldErrors) {
	if id.IPv6Prefix < 0 || id.IPv6Prefix > 128 {
		errs.addf("Identity.IPv6Prefix", "%d must be 0 (the default, 64) or 1…128", id.IPv6Prefix)
	}
	checkNets := func(field string, nets []netip.Prefix) {
		for i, p := range nets {
			path := fmt.Sprintf("Identity.%s[%d]", field, i)
			switch {
			case !p.IsValid():
				errs.addf(path, "invalid network %v", p)
			case p.Addr().Is4In6() || p.Addr().Zone() != "":
				errs.addf(path, "%v: write IPv4 networks as IPv4, without zones", p)
			case p.Masked() != p:
				errs.addf(path, "%q has host bits set (did you mean %v?)", p.String(), p.Masked())
			}
		}
	}
	checkNets("TrustedProxies", id.TrustedProxies)
	if h := id.Header; h != "" && !isToken(h) {
		errs.addf("Identity.Header", "%q is not a valid header name", h)
	}
	checkNets("AllowIPs", id.AllowIPs)
	for i, pk := range id.AllowPubkeys {
		if _, ok := scan.DecodeHex32(pk); !ok {
			errs.addf(fmt.Sprintf("Identity.AllowPubkeys[%d]", i), "must be 64 hex digits, got %q", pk)
		}
	}
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
