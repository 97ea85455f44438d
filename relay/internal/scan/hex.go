package scan

import (
	"encoding/binary"
	"encoding/hex"
)

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
		hi, lo := nibbles[s[2*i]], nibbles[s[2*i+1]]
		if hi|lo > 0x0f {
			return k, false
		}
		k[i] = hi<<4 | lo
	}
	return k, true
}

// isLowerHex reports whether every byte of b is a lowercase hex digit, the
// only spelling NIP-01 gives ids, pubkeys and signatures. Eight bytes at a
// time (lowerHex8), the tail one by one.
func isLowerHex(b []byte) bool {
	for len(b) >= 8 {
		if !lowerHex8(binary.LittleEndian.Uint64(b)) {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// lowerHex8 reports whether each of the eight bytes of w is a lowercase
// hex digit. Past the first check every byte is below 0x80, so adding a
// constant below 0x80 to each carries into no other byte, and the top bit
// of each sum says whether that byte is at least 0x80 less the constant.
func lowerHex8(w uint64) bool {
	if w&lanes80 != 0 {
		return false
	}
	digit := (w + lanes01*(0x80-'0')) &^ (w + lanes01*(0x80-'9'-1)) // '0' <= c <= '9'
	alpha := (w + lanes01*(0x80-'a')) &^ (w + lanes01*(0x80-'f'-1)) // 'a' <= c <= 'f'
	return (digit|alpha)&lanes80 == lanes80
}

// nibbles holds each hex digit's value (either case), and 0xff for every
// other byte.
var nibbles = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c - '0'
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = c - 'a' + 10
		t[c-'a'+'A'] = c - 'a' + 10
	}
	return t
}()

// hexNibble decodes one hex digit of either case.
func hexNibble(c byte) (byte, bool) {
	v := nibbles[c]
	return v, v <= 0x0f
}
