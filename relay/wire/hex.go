package wire

import "encoding/hex"

// Hex32 is an event id or a pubkey, decoded from its 64 hex digits.
type Hex32 [32]byte

// String returns the 64 lowercase hex digits of k.
func (k Hex32) String() string {
	var buf [64]byte
	hex.Encode(buf[:], k[:])
	return string(buf[:])
}

// DecodeHex32 decodes exactly 64 hex digits (either case) into a Hex32.
// It is the one hex decoder of sluice: ids and pubkeys on the wire, in
// allow-lists and in tiers all go through it.
func DecodeHex32[S ~string | ~[]byte](s S) (k Hex32, ok bool) {
	if len(s) != 64 {
		return k, false
	}
	for i := range k {
		hi, ok1 := hexNibble(s[2*i])
		lo, ok2 := hexNibble(s[2*i+1])
		if !ok1 || !ok2 {
			return k, false
		}
		k[i] = hi<<4 | lo
	}
	return k, true
}

// isLowerHex reports whether every byte of b is a lowercase hex digit, the
// only spelling NIP-01 gives ids, pubkeys and signatures.
func isLowerHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// hexNibble decodes one hex digit of either case.
func hexNibble(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
