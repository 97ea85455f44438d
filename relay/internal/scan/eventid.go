package scan

import (
	"crypto/sha256"
	"hash"
	"sync"
	"unicode/utf8"
)

// An event's id is the SHA-256 of its NIP-01 serialization,
//
//	[0,"<pubkey>",<created_at>,<kind>,<tags>,"<content>"]
//
// written without whitespace, every string with exactly the escapes
// go-nostr's serializer writes (\" \\ \b \t \n \f \r, \u00xx in lowercase
// hex for the other control characters, nothing else escaped). Scan
// computes it from the literals it read, decoding and re-escaping only the
// strings that hold an escape: a relay that stores the event under the id
// the frame carries (not all check it) would otherwise file it, and charge
// its author, under any id a sender likes.

// reasonEventID refuses an event whose id is not the hash of its
// serialization.
const reasonEventID = "invalid: event id does not match its content"

// hashers reuses SHA-256 states: Scan allocates nothing per frame.
var hashers = sync.Pool{New: func() any { return new(idHasher) }}

// idHasher feeds a SHA-256 state through a buffer, so that the many
// small pieces of a serialization cost one block write each.
type idHasher struct {
	h   hash.Hash
	buf [1024]byte
	n   int
	sum [sha256.Size]byte // Sum's destination: a local would escape through h
}

func (w *idHasher) flush() {
	if w.n > 0 {
		w.h.Write(w.buf[:w.n])
		w.n = 0
	}
}

func (w *idHasher) write(p []byte) {
	if w.n+len(p) > len(w.buf) {
		w.flush()
		if len(p) >= len(w.buf) {
			w.h.Write(p)
			return
		}
	}
	w.n += copy(w.buf[w.n:], p)
}

func (w *idHasher) writeString(s string) {
	if w.n+len(s) > len(w.buf) {
		w.flush()
	}
	w.n += copy(w.buf[w.n:], s)
}

func (w *idHasher) byte1(c byte) {
	if w.n == len(w.buf) {
		w.flush()
	}
	w.buf[w.n] = c
	w.n++
}

// idMatches reports whether ev's id is the hash of its serialization. ev
// holds the literals of a canonical event (Scan's).
func (ev *Event) idMatches() bool {
	w := hashers.Get().(*idHasher)
	defer hashers.Put(w)
	if w.h == nil {
		w.h = sha256.New()
	}
	w.h.Reset()
	w.n = 0
	w.writeString(`[0,"`)
	w.write(ev.pubkeyLit)
	w.writeString(`",`)
	w.write(ev.createdLit)
	w.byte1(',')
	w.write(ev.kindLit)
	w.byte1(',')
	w.tags(ev.tagsLit)
	w.byte1(',')
	w.str(ev.contentLit)
	w.byte1(']')
	w.flush()
	return Hex32(w.h.Sum(w.sum[:0])) == ev.ID
}

// tags writes a canonical tags literal (an array of arrays of strings,
// whitespace allowed between tokens) without its whitespace.
func (w *idHasher) tags(lit []byte) {
	for i := 0; i < len(lit); {
		switch c := lit[i]; c {
		case '"':
			end := strEnd(lit, i)
			w.str(lit[i:end])
			i = end
		case ' ', '\t', '\n', '\r':
			i++
		default:
			w.byte1(c)
			i++
		}
	}
}

// strEnd returns the index just past the string literal starting at
// lit[i], which Scan has checked.
func strEnd(lit []byte, i int) int {
	for j := i + 1; j < len(lit); j++ {
		switch lit[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(lit)
}

// str writes a checked string literal as NIP-01 serializes its value: as
// it is when it holds no escape (it then holds no quote, backslash or
// control character either), else decoded as go-nostr's JSON reader
// decodes it (a lone surrogate becomes U+FFFD) and escaped again.
func (w *idHasher) str(lit []byte) {
	esc := -1
	for i := 1; i < len(lit)-1; i++ {
		if lit[i] == '\\' {
			esc = i
			break
		}
	}
	if esc < 0 {
		w.write(lit)
		return
	}
	w.write(lit[:esc])
	s := lit[:len(lit)-1]
	for i := esc; i < len(s); {
		c := s[i]
		if c != '\\' {
			w.byte1(c)
			i++
			continue
		}
		var r rune
		if s[i+1] != 'u' {
			b, k, _ := unescapeASCII(s, i)
			r = rune(b)
			i += k
		} else {
			var ok bool
			if r, i, ok = decodeU(s, i); !ok {
				i += 6 // not reached: the scanner read the literal
			}
		}
		w.escaped(r)
	}
	w.byte1('"')
}

// escaped writes r as go-nostr's serializer writes it inside a string.
func (w *idHasher) escaped(r rune) {
	switch {
	case r == '"':
		w.writeString(`\"`)
	case r == '\\':
		w.writeString(`\\`)
	case r >= 0x20:
		var b [utf8.UTFMax]byte
		w.write(b[:utf8.EncodeRune(b[:], r)])
	case r == '\b':
		w.writeString(`\b`)
	case r == '\t':
		w.writeString(`\t`)
	case r == '\n':
		w.writeString(`\n`)
	case r == '\f':
		w.writeString(`\f`)
	case r == '\r':
		w.writeString(`\r`)
	default:
		const digits = "0123456789abcdef"
		w.write([]byte{'\\', 'u', '0', '0', digits[r>>4], digits[r&15]})
	}
}
