package scan

import (
	"bytes"
	"github.com/sluice-relay/sluice/relay/wire"
	"unicode/utf16"
	"unicode/utf8"
)

// maxLabelLen is the length of the longest known label ("NEG-CLOSE"). A label
// that decodes to more bytes than this is TypeOther, and Peek stops reading it.
const maxLabelLen = 9

// maxSubIDLen bounds Frame.ID for REQ, COUNT and CLOSE: the raw JSON literal,
// quotes and escapes included, may be at most this many bytes. NIP-01 caps a
// subscription id at 64 characters; the bound is lenient (room for escapes
// and multi-byte characters) but finite, so a client can never make a reply
// large. A longer id is not used, and the reply falls back to NOTICE.
const maxSubIDLen = 256

// maxIDScan bounds the scan for an event's top-level "id" (EVENT, AUTH): at
// most this many bytes of the frame are looked at. It equals the gate's
// default read limit, so the id of a real event the gate accepts is found
// wherever the client's library put it (nostr-tools and NDK write it after
// the tags and content). The scan is linear, allocation-free, skips string
// bodies with bytes.IndexByte and stops at the id, so the usual cost is a
// few hundred bytes; a budget of structural bytes (see maxIDTokens) keeps a
// frame built to be expensive from costing a byte-by-byte walk of all of it.
const maxIDScan = 512 << 10

// maxIDTokens bounds the structural bytes (brackets, braces, commas,
// strings) the id scan acts on. Real events need few even when they are large
// (a contact list filling maxIDScan has under 45,000; a long article's content
// is one string, skipped at memchr speed); a frame made of nothing but
// "[]," would otherwise cost a byte-by-byte walk over all of maxIDScan.
const maxIDTokens = 1 << 16

// labelType maps a decoded wire label onto a Type; anything unknown
// (including the literal "OTHER") is TypeOther. It does not allocate: the
// compiler turns a switch on string(b) into comparisons without a copy.
func labelType(b []byte) wire.Type {
	switch string(b) {
	case "EVENT":
		return wire.TypeEVENT
	case "REQ":
		return wire.TypeREQ
	case "CLOSE":
		return wire.TypeCLOSE
	case "COUNT":
		return wire.TypeCOUNT
	case "AUTH":
		return wire.TypeAUTH
	case "NEG-OPEN":
		return wire.TypeNEGOPEN
	case "NEG-MSG":
		return wire.TypeNEGMSG
	case "NEG-CLOSE":
		return wire.TypeNEGCLOSE
	}
	return wire.TypeOther
}

// Frame is what the gate learns of a client frame without parsing it.
type Frame struct {
	Type wire.Type
	// ID is the raw JSON string literal, quotes and escapes included, of the
	// subscription id (REQ, COUNT, CLOSE, and the NIP-77 NEG-OPEN, NEG-MSG
	// and NEG-CLOSE) or the event id (EVENT, AUTH), as a
	// sub-slice of the frame; nil when there is none. A reply writes it
	// verbatim, so the client sees exactly the id it sent.
	ID []byte
}

// Peek classifies a text frame; Frame adds its id. It never allocates and
// never panics.
//
// The type is the first element of the JSON array, decoded as a real JSON
// string: whitespace, escapes ("\u0045VENT" is EVENT) and surrogates (which
// can never spell a label) give the type the relay's own JSON parser would
// read, so spelling a label differently cannot buy a different bucket. Labels are matched
// exactly and case-sensitively (NIP-01). Everything else is TypeOther: a
// frame that is not an array, whose first element is not a string, whose
// label is unknown or longer than the longest known label (Peek stops
// reading there), holds an invalid escape, a raw control character or
// non-ASCII text in its label, or ends before the label is closed and
// followed by ',' or ']'.
//
// Whitespace is skipped without a bound: the frame has already been read and
// unmasked whole, a linear skip costs the same order as that did, and a bound
// would let a client move its EVENTs into the catch-all bucket by padding
// them.
//
// Peek does not validate the rest of the frame. A frame that is malformed
// after a well-formed label keeps its label's type: it is charged to the
// bucket it claims, and the relay rejects it.
//
// The gate peeks binary WebSocket frames as it peeks text frames: some
// relays (khatru) read a binary frame as text, so its label must be charged
// as the relay will read it.
//
// Peeked.Frame finds the id, which a refusal alone needs (for an EVENT it
// is a scan of most of the event). For REQ, COUNT, CLOSE and the NEG-
// types it is the second element when that is a well-formed JSON string
// of valid UTF-8 of at most 256 raw bytes. For EVENT and AUTH it is the
// value of the event object's top-level "id" key (the key spelled without
// escapes; an "id" inside tags or content does not count), found by a
// bounded scan (at most maxIDScan bytes) that tracks string state and
// nesting depth and never decodes the event; it is used only when it is
// exactly 64 lowercase hex digits. Otherwise ID is nil.
func Peek(frame []byte) Peeked {
	t, rest, shaped := peekType(frame)
	return Peeked{Type: t, shaped: shaped, frame: frame, rest: rest}
}

// Peeked is a frame as Peek classified it, its id not yet looked for.
type Peeked struct {
	Type wire.Type
	// shaped reports whether the frame is shaped as a Nostr message at
	// all: an array whose first element is a complete JSON string without
	// a comma (any label, known or not) followed by ',' or ']'.
	shaped bool
	frame  []byte
	rest   int // index of the second element, or -1
}

// Frame returns the frame's type and id (Frame.ID).
func (p Peeked) Frame() Frame {
	return Frame{Type: p.Type, ID: frameID(p.Type, p.frame, p.rest)}
}

// peekType is Peek without the id: the frame's type and the index of its
// second element (after whitespace), or -1 when it has none. The gate needs
// the id only to answer a refusal, so it looks for it (frameID) only then:
// for an EVENT that is a scan of most of the event, which an admitted
// frame does not need.
//
// shaped reports whether the frame is shaped as a Nostr message at all: an
// array whose first element is a complete JSON string without a comma (any
// label, known or not) followed by ',' or ']'. Relays disagree about frames that are not:
// go-nostr's parser, and so khatru, takes the text between a frame's first
// two quotes as its label wherever they are, reading [0,"EVENT",{…}] as an
// EVENT. The gate does not forward them.
func peekType(frame []byte) (t wire.Type, rest int, shaped bool) {
	i := skipWS(frame, 0)
	if i >= len(frame) || frame[i] != '[' {
		return wire.TypeOther, -1, false
	}
	i = skipWS(frame, i+1)
	if i >= len(frame) || frame[i] != '"' {
		return wire.TypeOther, -1, false
	}
	var buf [maxLabelLen]byte
	n, end, ok := decodeLabel(frame, i+1, &buf)
	t = wire.TypeOther
	if ok {
		t = labelType(buf[:n])
	} else if end = skipString(frame, i+1); end < 0 {
		return wire.TypeOther, -1, false // the label never ends
	}
	if t == wire.TypeOther && bytes.IndexByte(frame[i+1:end-1], ',') >= 0 {
		// No label holds a comma, and khatru's negentropy parser reads the
		// label as the bytes before the frame's first comma: it would read
		// ["NEG-OPENx,…"…] as a NEG-OPEN, and panics on [",",…].
		return wire.TypeOther, -1, false
	}
	// The label must be followed by ',' or ']': a frame cut after its label
	// is truncated and cannot be classified.
	j := skipWS(frame, end)
	if j >= len(frame) {
		return wire.TypeOther, -1, false
	}
	switch frame[j] {
	case ']':
		return t, -1, true
	case ',':
		if t == wire.TypeOther {
			return wire.TypeOther, -1, true
		}
		return t, skipWS(frame, j+1), true
	}
	return wire.TypeOther, -1, false
}

// frameID is Frame.ID of a frame of type t whose second element starts at
// rest, as peekType returned them.
func frameID(t wire.Type, frame []byte, rest int) []byte {
	if rest < 0 {
		return nil
	}
	switch t {
	case wire.TypeREQ, wire.TypeCOUNT, wire.TypeCLOSE, wire.TypeNEGOPEN, wire.TypeNEGMSG, wire.TypeNEGCLOSE:
		return subID(frame, rest)
	case wire.TypeEVENT, wire.TypeAUTH:
		return eventID(frame, rest)
	}
	return nil
}

// isWS reports whether c is JSON whitespace (RFC 8259: space, tab, LF, CR).
func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipWS returns the index of the first non-whitespace byte at or after i.
func skipWS(b []byte, i int) int {
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

// decodeLabel decodes the JSON string whose body starts at b[i] (just after
// the opening quote) into buf. It reports ok=false as soon as the string
// cannot be a known label: longer than buf, a non-ASCII character (every
// label is ASCII, so a surrogate pair or a lone surrogate, which JSON
// decoders turn into U+FFFD, can never match), a raw control character, an
// invalid escape, or the end of input. end is the index after the closing
// quote.
func decodeLabel(b []byte, i int, buf *[maxLabelLen]byte) (n, end int, ok bool) {
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			return n, i + 1, true
		case c < 0x20 || c >= 0x80:
			return 0, 0, false
		case c == '\\':
			var n2 int
			if c, n2, ok = unescapeASCII(b, i); !ok {
				return 0, 0, false
			}
			i += n2
		default:
			i++
		}
		if n == maxLabelLen {
			return 0, 0, false
		}
		buf[n] = c
		n++
	}
	return 0, 0, false
}

// unescapeASCII decodes the JSON escape at b[i] (a backslash) and returns
// the byte it stands for and the escape's length (2, or 6 for \uXXXX). ok is
// false for an invalid or truncated escape and for a \u escape outside
// ASCII: every label and key the gate looks for is ASCII, so such an
// escape can never spell one.
func unescapeASCII(b []byte, i int) (c byte, n int, ok bool) {
	if i+1 >= len(b) {
		return 0, 0, false
	}
	switch c = b[i+1]; c {
	case '"', '\\', '/':
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'u':
		r, ok := hex4(b, i+2)
		if !ok || r >= 0x80 {
			return 0, 0, false
		}
		return byte(r), 6, true
	default:
		return 0, 0, false
	}
	return c, 2, true
}

// decodeU reads the \uXXXX escape at s[i] as encoding/json does: a
// surrogate pair is two escapes, and a surrogate not followed by its pair
// is U+FFFD with what follows read on its own. It returns the rune and the
// index after what it read; ok is false when the escape has no four hex
// digits.
func decodeU(s []byte, i int) (r rune, next int, ok bool) {
	r, ok = hex4(s, i+2)
	if !ok {
		return 0, i, false
	}
	i += 6
	if utf16.IsSurrogate(r) {
		r2 := rune(-1)
		if i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
			r2, _ = hex4(s, i+2)
		}
		if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
			return d, i + 6, true
		}
		return utf8.RuneError, i, true
	}
	return r, i, true
}

// hex4 decodes the four hex digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		d, ok := hexNibble(c)
		if !ok {
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

// subID returns the JSON string literal starting at b[i] when it is
// well-formed, valid UTF-8 and at most maxSubIDLen bytes raw; nil otherwise.
func subID(b []byte, i int) []byte {
	if i >= len(b) || b[i] != '"' {
		return nil
	}
	limit := min(len(b), i+maxSubIDLen)
	j := i + 1
	for j < limit {
		c := b[j]
		switch {
		case c == '"':
			return b[i : j+1 : j+1]
		case c < 0x20:
			return nil
		case c == '\\':
			if j+1 >= limit {
				return nil
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if _, ok := hex4(b[:limit], j+2); !ok {
					return nil
				}
				j += 6
			default:
				return nil
			}
		case c < 0x80:
			j++
		default:
			r, size := utf8.DecodeRune(b[j:limit])
			if r == utf8.RuneError && size <= 1 {
				return nil
			}
			j += size
		}
	}
	return nil
}

// eventID scans the object starting at b[i] for its top-level "id" key and
// returns the value's literal when it is 64 lowercase hex digits. The first
// top-level "id" decides: a later duplicate is not looked for. The scan
// tracks string state and nesting depth, so keys and values inside nested
// objects, arrays and strings never count, and it gives up (nil) at the end
// of the object, at the end of input, after maxIDScan bytes or after
// maxIDTokens structural bytes.
func eventID(b []byte, i int) []byte {
	if i >= len(b) || b[i] != '{' {
		return nil
	}
	b = b[:min(len(b), i+maxIDScan)]
	depth := 1
	expectKey := true // at depth 1, the next string is a key
	tokens := 0
	for j := i + 1; j < len(b); j++ {
		class := scanClass[b[j]]
		if class == scanOther {
			continue // numbers, literals, ':' and whitespace change nothing here
		}
		if tokens++; tokens > maxIDTokens {
			return nil
		}
		switch class {
		case scanOpen:
			depth++
		case scanClose:
			depth--
			if depth == 0 {
				return nil
			}
		case scanComma:
			if depth == 1 {
				expectKey = true
			}
		case scanQuote:
			end := skipString(b, j+1)
			if end < 0 {
				return nil
			}
			if depth == 1 && expectKey {
				if end-j == 4 && b[j+1] == 'i' && b[j+2] == 'd' {
					return idValue(b, end)
				}
				expectKey = false
			}
			j = end - 1
		}
	}
	return nil
}

// skipString returns the index after the closing quote of the JSON string
// whose body starts at b[i], or -1 when the input ends first. Only quotes and
// backslashes matter here. Short strings (keys, tag values) are walked byte
// by byte; past the first 32 bytes the rest is skipped with bytes.IndexByte,
// a quote being closing when an even number of backslashes precede it. Each
// byte is looked at a bounded number of times, so the work stays linear.
func skipString(b []byte, i int) int {
	for end := min(len(b), i+32); i < end; {
		switch b[i] {
		case '"':
			return i + 1
		case '\\':
			i += 2 // an escape pair is consumed whole, so i never stops inside one
		default:
			i++
		}
	}
	start := i
	for i < len(b) {
		k := bytes.IndexByte(b[i:], '"')
		if k < 0 {
			return -1
		}
		q := i + k
		n := 0
		for p := q - 1; p >= start && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		i = q + 1
		start = q + 1
	}
	return -1
}

// The classes of bytes eventID acts on outside strings.
const (
	scanOther uint8 = iota
	scanOpen
	scanClose
	scanComma
	scanQuote
)

// scanClass maps a byte onto its class for eventID.
var scanClass = [256]uint8{'{': scanOpen, '[': scanOpen, '}': scanClose, ']': scanClose, ',': scanComma, '"': scanQuote}

// idValue returns the 64-lowercase-hex string literal that follows the key
// ending at b[i] (whitespace, ':', whitespace), or nil.
func idValue(b []byte, i int) []byte {
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		return nil
	}
	i = skipWS(b, i+1)
	const lit = 64 + 2
	if i+lit > len(b) || b[i] != '"' || b[i+lit-1] != '"' {
		return nil
	}
	for _, c := range b[i+1 : i+lit-1] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return nil
		}
	}
	return b[i : i+lit : i+lit]
}
