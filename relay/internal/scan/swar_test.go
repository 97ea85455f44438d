package scan

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
)

// firstSpecial is strSpecial's definition byte by byte: the index of the
// first byte of b that strClass marks, or -1.
func firstSpecial(b []byte) int {
	for i, c := range b {
		if strClass[c] {
			return i
		}
	}
	return -1
}

// lowerHexByBytes is isLowerHex's definition byte by byte.
func lowerHexByBytes(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// words yields eight-byte inputs that reach every lane with every byte
// value: each value at each position in a word of plain bytes, in a word
// of other special bytes after it (a borrow from below must not hide or
// fake the first), and random words, half of them from an alphabet of
// boundary bytes.
func words(t *testing.T, yield func(b []byte)) {
	t.Helper()
	plain := []byte("abcdefgh")
	for pos := range 8 {
		for v := range 256 {
			b := bytes.Clone(plain)
			b[pos] = byte(v)
			yield(b)
			for _, after := range []byte{0, 0x1f, '"', '\\', 0x20, 0x80, 0xff, '0', '9', 'a', 'f', 'g', '/', ':', '`'} {
				c := bytes.Clone(b)
				for j := pos + 1; j < 8; j++ {
					c[j] = after
				}
				yield(c)
				for j := range pos {
					c[j] = after
				}
				yield(c)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	edges := []byte{0, 1, 0x1f, 0x20, 0x21, '"', '#', '[', '\\', ']', '/', '0', '9', ':', '`', 'a', 'f', 'g', 0x7f, 0x80, 0xa2, 0xdc, 0xff}
	b := make([]byte, 8)
	for i := range 200000 {
		for j := range b {
			if i%2 == 0 {
				b[j] = byte(r.Uint32())
			} else {
				b[j] = edges[r.IntN(len(edges))]
			}
		}
		yield(b)
	}
}

// strSpecial's lowest set bit is exactly the first byte a byte-by-byte
// walk stops at, and it is 0 when there is none.
func TestStrSpecialFindsTheFirstMarkedByte(t *testing.T) {
	n := 0
	words(t, func(b []byte) {
		n++
		m := strSpecial(binary.LittleEndian.Uint64(b))
		want := firstSpecial(b)
		got := -1
		if m != 0 {
			got = bits.TrailingZeros64(m) >> 3
		}
		if got != want {
			t.Fatalf("% x: strSpecial says byte %d, want %d (mask %#x)", b, got, want, m)
		}
	})
	if n < 100000 {
		t.Fatalf("only %d words tried", n)
	}
}

// lowerHex8 agrees with the byte-by-byte check on every word, and
// isLowerHex on every length (the tail is checked byte by byte).
func TestLowerHex8AgreesByteByByte(t *testing.T) {
	words(t, func(b []byte) {
		if got, want := lowerHex8(binary.LittleEndian.Uint64(b)), lowerHexByBytes(b); got != want {
			t.Fatalf("% x: lowerHex8 %v, want %v", b, got, want)
		}
	})
	hex := []byte("0123456789abcdef0123456789abcdef0123456789")
	for n := range len(hex) {
		for i := range n {
			for _, bad := range []byte{'g', 'A', 'F', '/', ':', '`', 0, 0x80, 0xe0} {
				b := bytes.Clone(hex[:n])
				b[i] = bad
				if isLowerHex(b) {
					t.Fatalf("isLowerHex(%q) true", b)
				}
			}
		}
		if !isLowerHex(hex[:n]) {
			t.Fatalf("isLowerHex(%q) false", hex[:n])
		}
	}
}

// The nibble table decodes what the arithmetic did, both cases, and
// refuses every other byte.
func TestNibbles(t *testing.T) {
	for c := range 256 {
		var want byte
		ok := true
		switch {
		case '0' <= c && c <= '9':
			want = byte(c - '0')
		case 'a' <= c && c <= 'f':
			want = byte(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			want = byte(c - 'A' + 10)
		default:
			ok = false
		}
		got, gotOK := hexNibble(byte(c))
		if gotOK != ok || (ok && got != want) {
			t.Fatalf("hexNibble(%#x) = %d, %v; want %d, %v", c, got, gotOK, want, ok)
		}
	}
	id := "0123456789abcdefABCDEF0123456789abcdefABCDEF0123456789abcdef0123"
	k, ok := DecodeHex32(id)
	if !ok || !bytes.EqualFold([]byte(k.String()), []byte(id)) {
		t.Fatalf("DecodeHex32(%s) = %s, %v", id, k, ok)
	}
	for i := range id {
		for _, bad := range []byte{'g', 'G', '/', ':', '@', '`', 0, 0xff} {
			b := []byte(id)
			b[i] = bad
			if _, ok := DecodeHex32(b); ok {
				t.Fatalf("DecodeHex32(%q) ok", b)
			}
		}
	}
}

// Scan reads a content string the same wherever in an eight-byte lane its
// special bytes fall: a raw control byte, a lone backslash or a bad escape
// after 0 to 40 plain bytes is refused, a valid escape or a quote
// accepted, and an unterminated string refused (str's word-at-a-time walk
// must stop exactly at the first byte it cannot skip).
func TestScanContentAtEveryLaneOffset(t *testing.T) {
	for n := range 41 {
		plain := strings.Repeat("a", n)
		for _, tc := range []struct {
			content string
			ok      bool
		}{
			{plain, true},
			{plain + `\"`, true},
			{plain + `\\` + plain, true},
			{plain + `\u00e9` + plain, true},
			{plain + "\x01" + plain, false},
			{plain + "\x1f", false},
			{plain + `\x`, false},
			{plain + `\u12`, false},
			{plain + "é" + plain, true},
		} {
			frame := `["EVENT",` + evWith("content", `"content":"`+tc.content+`"`) + `]`
			if _, reason := scanShape([]byte(frame), scanBounds); (reason == "") != tc.ok {
				t.Fatalf("content %q after %d plain bytes: reason %q, want ok %v", tc.content, n, reason, tc.ok)
			}
		}
		frame := `["EVENT",` + evWith("content", `"content":"`+plain) // no closing quote, no end
		if _, reason := scanShape([]byte(frame), scanBounds); reason == "" {
			t.Fatalf("an unterminated content of %d bytes accepted", n)
		}
	}
}
