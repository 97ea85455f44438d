package scan

import (
	"bytes"
	"encoding/binary"
	"github.com/sluice-relay/sluice/relay/wire"
	"math/bits"
	"unicode/utf8"
)

// Facts is what Scan read of a client frame that is in canonical shape:
// everything the gate charges and checks before it forwards the frame,
// beside its type (Peek's).
type Facts struct {
	typ wire.Type // Peek's type of the frame
	// SubID is the subscription id of a REQ, COUNT, CLOSE or NEG-* frame
	// as its JSON literal, quotes included. A canonical id holds no
	// escapes, so the bytes between the quotes are the id itself.
	SubID []byte
	// Filters is the number of filter objects of a REQ, COUNT or NEG-OPEN.
	Filters int
	// Event is the event of an EVENT or AUTH frame.
	Event Event
	// neg is the negentropy payload of a NEG-OPEN or NEG-MSG frame: its hex
	// digits, without quotes, checked to be a well-formed NIP-77 message.
	neg []byte
	// shapes are the shapes of the first filters read (Shapes), so that
	// pricing a frame does not read it again.
	shapes [keptShapes]Filter
}

// keptShapes is how many filter shapes Facts keeps: wire's default
// MaxFilters, so that a REQ within the default bounds is read once.
const keptShapes = 10

// Event is what Scan read of the event inside an EVENT or AUTH frame.
type Event struct {
	ID, Pubkey Hex32
	// iDLit is the id's JSON literal, quotes included, for replies.
	iDLit     []byte
	Kind      int
	CreatedAt int64
	// Raw is the event object, braces included: what an AUTH's id and
	// signature are checked against.
	Raw []byte
	// Challenge and Relay are the values of an AUTH event's first
	// "challenge" and "relay" tags as JSON literals, quotes included; nil
	// when there is none (and always for EVENT). Decode them with Unquote.
	Challenge, Relay []byte
	// The literals the id is the hash of (idMatches): the pubkey's hex
	// digits, created_at's and kind's digits, the tags array and the
	// content string, quotes included.
	pubkeyLit, createdLit, kindLit, tagsLit, contentLit []byte
}

// kindAuth is the kind of a NIP-42 authentication event.
const kindAuth = 22242

// Reasons Scan gives for a frame it will not call canonical. Each is a
// NIP-01 "invalid:" reason, sent to the client as the refusal's reason.
const (
	reasonNotNostr    = "invalid: not a Nostr message"
	reasonUnknownType = "invalid: unknown message type"
	reasonNotUTF8     = "invalid: frame is not UTF-8"
	reasonShape       = "invalid: frame is not in NIP-01's exact shape"
	reasonEvent       = "invalid: event must have exactly the fields id, pubkey, created_at, kind, tags, content and sig, each once, in NIP-01's types"
	reasonAuthKind    = "invalid: AUTH event must be kind 22242"
	reasonEventKind   = "invalid: kind 22242 is sent with AUTH, not EVENT"
	reasonSubID       = "invalid: subscription id must be 1 to 64 characters, without escapes or control characters"
	reasonFilter      = "invalid: filter must be an object of NIP-01's fields (ids, authors, kinds, #<letter>, since, until, limit, search), each once, in their types"
	ReasonFilters     = "invalid: too many filters"
	reasonCountOne    = "invalid: COUNT takes exactly one filter"
	reasonNegentropy  = "invalid: negentropy message is malformed"
	// reasonTagEmpty refuses the tag []: a tag is its name and values,
	// and relays read a nameless one by position (tag[0]) without
	// checking, each in its own way.
	reasonTagEmpty = "invalid: a tag must have a name"
	// reasonTagNoValue refuses a tag named by one letter without a value,
	// such as ["d"]: relays index these tags by position and read tag[1]
	// (khatru's check of an addressable event panics on ["d"]).
	reasonTagNoValue = "invalid: a tag named by one letter must have a value"
	reasonTags       = "invalid: too many tags (max_event_tags)"
	reasonTagValue   = "invalid: a one-letter tag's value is too long (max_tag_value_bytes)"
	// reasonFilterValues and reasonFanout name the bound a filter passed:
	// what it would make the relay's store do.
	reasonFilterValues = "invalid: filter asks too much: too many values in one field (max_filter_values)"
	reasonFanout       = "invalid: filter asks too much: too many index scans, such as authors times kinds (max_filter_fanout)"
)

// prefixes holds the exact start of a canonical frame of every type:
// `["LABEL",`, the label spelled without escapes and the comma right after
// its quote. Relays find the label in different ways (go-nostr's parser
// takes the text between the first two quotes; khatru's negentropy parser
// the text from byte 2 to the first comma), and all of them agree on this
// spelling.
var prefixes = func() (p [wire.NumTypes][]byte) {
	for t := range p {
		p[t] = []byte(`["` + wire.Type(t).String() + `",`)
	}
	return p
}()

// Scan reads a whole client frame and reports whether it is canonical: a
// shape that leaves a relay no other reading than the one Scan made. It
// returns the frame's facts, and "" or the reason it is not canonical. The
// shapes are, with "sub" a subscription id of 1 to MaxSubIDBytes bytes
// without escapes or control characters:
//
//	["EVENT",{event}]                   one event, kind ≠ 22242
//	["AUTH",{event}]                    one event of kind 22242
//	["REQ","sub",{filter},…]            1 to MaxFilters filters
//	["COUNT","sub",{filter}]            one filter
//	["CLOSE","sub"]
//	["NEG-OPEN","sub",{filter},"hex"]   hex checked as a NIP-77 message
//	["NEG-MSG","sub","hex"]
//	["NEG-CLOSE","sub"]
//
// The frame starts with exactly `["LABEL",`; whitespace may follow each
// comma and precede the closing bracket. The whole frame is valid UTF-8
// and strict JSON (RFC 8259): every value is of the type its key calls
// for, so nothing nests deeper than an event's tag. An event has
// exactly the keys id, pubkey, created_at, kind, tags, content and sig,
// each once and spelled without escapes: id and pubkey 64 lowercase hex
// digits, sig 128, kind an integer 0…65535, created_at an integer 0…2^56-2
// (maxCreatedAt), tags an array of arrays of strings, content a string. A filter
// has only the keys ids, authors, kinds, since, until, limit, search and
// "#" followed by one ASCII letter, each at most once, unescaped, and of
// the type go-nostr reads them as (no nulls). Keys are matched exactly: a
// decoder that folds case (encoding/json) could otherwise read "ID" as the
// id.
//
// An event's id must be the SHA-256 of its NIP-01 serialization, computed
// from the literals Scan read ("invalid: event id does not match its
// content" otherwise, checked after the shape): a relay that stores an
// event under the id its frame carries would otherwise file it, and let
// the gate charge its author, under any id. The signature is not checked.
//
// Beyond the shape, Scan holds the frame to b (nil: every default): an
// event has at most MaxTags tags, none empty, and a tag named by one ASCII
// letter has a value of at most MaxTagValueBytes; a filter lists at most
// MaxFilterValues values in each field and asks for at most MaxFanout
// index scans. Scan allocates nothing and never panics.
//
// Frames that are not arrays led by a label get "invalid: not a Nostr
// message"; frames whose label is not one of the types above get
// "invalid: unknown message type".
func Scan(frame []byte, b *wire.Bounds) (f Facts, reason string) {
	return scan(frame, b, true)
}

// scan is Scan, with the check of an event's id when checkID; the tests
// of the shape alone leave it out.
func scan(frame []byte, b *wire.Bounds, checkID bool) (f Facts, reason string) {
	p := Peek(frame)
	f.typ = p.Type
	switch {
	case !p.shaped:
		return f, reasonNotNostr
	case p.Type == wire.TypeOther:
		return f, reasonUnknownType
	}
	if !bytes.HasPrefix(frame, prefixes[f.typ]) {
		return f, reasonShape
	}
	if !utf8.Valid(frame) {
		return f, reasonNotUTF8
	}
	s := scanner{b: frame, i: len(prefixes[f.typ]), lim: resolve(b)}
	s.ws()
	switch f.typ {
	case wire.TypeEVENT, wire.TypeAUTH:
		if r := s.event(&f.Event, f.typ == wire.TypeAUTH); r != "" {
			return f, r
		}
		switch {
		case f.typ == wire.TypeAUTH && f.Event.Kind != kindAuth:
			return f, reasonAuthKind
		case f.typ == wire.TypeEVENT && f.Event.Kind == kindAuth:
			return f, reasonEventKind
		}
	case wire.TypeREQ, wire.TypeCOUNT:
		if f.SubID, reason = s.subID(); reason != "" {
			return f, reason
		}
		for {
			s.ws()
			if !s.eat(',') {
				break
			}
			s.ws()
			if r := s.filter(); r != "" {
				return f, r
			}
			f.Filters++
			if f.Filters > s.lim.MaxFilters {
				return f, ReasonFilters
			}
			if f.Filters <= len(f.shapes) {
				f.shapes[f.Filters-1] = s.shape
			}
		}
		if f.Filters == 0 {
			return f, reasonShape
		}
		if f.typ == wire.TypeCOUNT && f.Filters != 1 {
			// go-nostr reads every filter of a COUNT into one (the last
			// field wins), so a relay on it would count something else.
			return f, reasonCountOne
		}
	case wire.TypeCLOSE, wire.TypeNEGCLOSE:
		if f.SubID, reason = s.subID(); reason != "" {
			return f, reason
		}
	case wire.TypeNEGOPEN, wire.TypeNEGMSG:
		if f.SubID, reason = s.subID(); reason != "" {
			return f, reason
		}
		if f.typ == wire.TypeNEGOPEN {
			if !s.comma() {
				return f, reasonShape
			}
			if r := s.filter(); r != "" {
				return f, r
			}
			f.Filters = 1
			f.shapes[0] = s.shape
		}
		if !s.comma() {
			return f, reasonShape
		}
		lit, ok := s.plainStr()
		if !ok {
			return f, reasonNegentropy
		}
		f.neg = lit[1 : len(lit)-1]
		if !checkNegentropy(f.neg) {
			return f, reasonNegentropy
		}
	}
	if !s.end() {
		return f, reasonShape
	}
	// Last: the shape's reasons say more, and a refused shape costs no hash.
	if checkID && (f.typ == wire.TypeEVENT || f.typ == wire.TypeAUTH) && !f.Event.idMatches() {
		return f, reasonEventID
	}
	return f, ""
}

// scanner walks strict JSON without building anything. Every method stops
// at the end of the input; a truncated frame is simply not ok.
type scanner struct {
	b   []byte
	i   int
	lim wire.Bounds
	// why is the reason a bound refused the frame, set where it was
	// found; the object or array around it then simply fails.
	why string
	// shape is what filter read of the last filter it consumed.
	shape Filter
}

// refuse records why and fails the walk.
func (s *scanner) refuse(why string) bool {
	s.why = why
	return false
}

func (s *scanner) ws() { s.i = skipWS(s.b, s.i) }

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// comma consumes whitespace, a comma and whitespace.
func (s *scanner) comma() bool {
	s.ws()
	if !s.eat(',') {
		return false
	}
	s.ws()
	return true
}

// end consumes the closing bracket of the frame and trailing whitespace,
// and reports whether that was all of it.
func (s *scanner) end() bool {
	s.ws()
	if !s.eat(']') {
		return false
	}
	s.ws()
	return s.i == len(s.b)
}

// strClass marks the bytes that end the fast part of a string walk.
var strClass = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// Bytes of eight, one per byte lane, for strSpecial and lowerHex8.
const (
	lanes01 = 0x0101010101010101
	lanes80 = 0x8080808080808080
)

// strSpecial returns a mask whose lowest set bit is the top bit of the
// first byte of w (little-endian: w's lowest byte first) that strClass
// marks — a control character, a quote or a backslash — or 0 when there
// is none. Bits above the lowest may be set for bytes that are not marked
// (a borrow runs upward from a marked byte), so only the lowest is read.
func strSpecial(w uint64) uint64 {
	quote := w ^ (lanes01 * '"')
	slash := w ^ (lanes01 * '\\')
	return ((w-lanes01*0x20) & ^w | (quote-lanes01) & ^quote | (slash-lanes01) & ^slash) & lanes80
}

// str consumes a strict JSON string (valid escapes, no raw control
// characters; UTF-8 is checked once for the whole frame) and returns its
// literal, quotes included, and whether it holds an escape.
func (s *scanner) str() (lit []byte, escaped, ok bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false, false
	}
	start := s.i
	i := s.i + 1
	for i < len(s.b) {
		if i+8 <= len(s.b) {
			// Eight bytes at a time up to the first that ends the fast
			// part (strSpecial finds it exactly).
			m := strSpecial(binary.LittleEndian.Uint64(s.b[i:]))
			if m == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(m) >> 3
		}
		c := s.b[i]
		if !strClass[c] {
			i++
			continue
		}
		switch {
		case c == '"':
			s.i = i + 1
			return s.b[start:s.i], escaped, true
		case c < 0x20:
			return nil, false, false
		}
		// A backslash: one of JSON's escapes.
		escaped = true
		if i+1 >= len(s.b) {
			return nil, false, false
		}
		switch s.b[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			if _, ok := hex4(s.b, i+2); !ok {
				return nil, false, false
			}
			i += 6
		default:
			return nil, false, false
		}
	}
	return nil, false, false
}

// plainStr consumes a string without escapes and returns its literal.
func (s *scanner) plainStr() ([]byte, bool) {
	lit, escaped, ok := s.str()
	return lit, ok && !escaped
}

// subID consumes a canonical subscription id.
func (s *scanner) subID() ([]byte, string) {
	lit, ok := s.plainStr()
	if !ok || len(lit) < 3 || len(lit) > wire.MaxSubIDBytes+2 {
		return nil, reasonSubID
	}
	return lit, ""
}

// uint consumes a JSON integer of at most maxDigits digits, without sign,
// fraction, exponent or leading zeros.
func (s *scanner) uint(maxDigits int) (int64, bool) {
	start := s.i
	var v int64
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		v = v*10 + int64(s.b[s.i]-'0')
		s.i++
	}
	n := s.i - start
	if n == 0 || n > maxDigits || (n > 1 && s.b[start] == '0') {
		return 0, false
	}
	// A fraction or exponent would make it a number the relay might read
	// as another integer, or refuse.
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return 0, false
	}
	return v, true
}

// array consumes an array whose every element elem consumes. elem is
// called with the element's index; it must consume exactly the element.
func (s *scanner) array(elem func(i int) bool) bool {
	if !s.eat('[') {
		return false
	}
	s.ws()
	if s.eat(']') {
		return true
	}
	for i := 0; ; i++ {
		if !elem(i) {
			return false
		}
		s.ws()
		if s.eat(']') {
			return true
		}
		if !s.eat(',') {
			return false
		}
		s.ws()
	}
}

// object consumes an object, calling field for each key (a literal
// without escapes; an escaped key fails the object) with the scanner at
// the value, which field must consume.
func (s *scanner) object(field func(key []byte) bool) bool {
	if !s.eat('{') {
		return false
	}
	s.ws()
	if s.eat('}') {
		return true
	}
	for {
		lit, ok := s.plainStr()
		if !ok {
			return false
		}
		s.ws()
		if !s.eat(':') {
			return false
		}
		s.ws()
		if !field(lit[1 : len(lit)-1]) {
			return false
		}
		s.ws()
		if s.eat('}') {
			return true
		}
		if !s.eat(',') {
			return false
		}
		s.ws()
	}
}

// hexLit consumes a string of exactly n lowercase hex digits and returns
// its literal.
func (s *scanner) hexLit(n int) ([]byte, bool) {
	lit, ok := s.plainStr()
	if !ok || len(lit) != n+2 || !isLowerHex(lit[1:n+1]) {
		return nil, false
	}
	return lit, true
}

// maxCreatedAt is the latest created_at Scan accepts, 2^56-2: the latest
// timestamp go-nostr's negentropy can write back (see negMaxFinite). A
// go-nostr relay whose store kept a later event would panic, and end,
// answering an honest NEG-OPEN whose range splits at it. No clock is
// anywhere near it (it is two billion years away).
const maxCreatedAt = negMaxFinite

// The fields of an event, as bits.
const (
	evID uint8 = 1 << iota
	evPubkey
	evCreatedAt
	evKind
	evTags
	evContent
	evSig
	evAll = evID | evPubkey | evCreatedAt | evKind | evTags | evContent | evSig
)

// event consumes a canonical event object into ev. auth asks for the
// challenge and relay tags.
func (s *scanner) event(ev *Event, auth bool) string {
	start := s.i
	var seen uint8
	ok := s.object(func(key []byte) bool {
		var bit uint8
		switch string(key) {
		case "id":
			bit = evID
			lit, ok := s.hexLit(64)
			if !ok {
				return false
			}
			ev.iDLit = lit
			ev.ID, _ = DecodeHex32(lit[1:65])
		case "pubkey":
			bit = evPubkey
			lit, ok := s.hexLit(64)
			if !ok {
				return false
			}
			ev.pubkeyLit = lit[1:65]
			ev.Pubkey, _ = DecodeHex32(lit[1:65])
		case "sig":
			bit = evSig
			if _, ok := s.hexLit(128); !ok {
				return false
			}
		case "kind":
			bit = evKind
			at := s.i
			k, ok := s.uint(5)
			if !ok || k > 65535 {
				return false
			}
			ev.Kind = int(k)
			ev.kindLit = s.b[at:s.i]
		case "created_at":
			bit = evCreatedAt
			at := s.i
			t, ok := s.uint(17)
			if !ok || t > maxCreatedAt {
				return false
			}
			ev.CreatedAt = t
			ev.createdLit = s.b[at:s.i]
		case "content":
			bit = evContent
			lit, _, ok := s.str()
			if !ok {
				return false
			}
			ev.contentLit = lit
		case "tags":
			bit = evTags
			at := s.i
			if !s.tags(ev, auth) {
				return false
			}
			ev.tagsLit = s.b[at:s.i]
		default:
			return false
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
	if s.why != "" {
		return s.why
	}
	if !ok || seen != evAll {
		return reasonEvent
	}
	ev.Raw = s.b[start:s.i]
	return ""
}

// tags consumes an event's tags: an array of at most MaxTags arrays of
// strings, none empty, where a tag named by one ASCII letter has a value
// of at most MaxTagValueBytes. With auth it records the first "challenge"
// and "relay" tag values in ev, the tag names compared decoded: a relay
// reads ["\u0072elay",…] as a relay tag, so the first relay tag is the
// first whatever its spelling.
func (s *scanner) tags(ev *Event, auth bool) bool {
	return s.array(func(n int) bool {
		if n >= s.lim.MaxTags {
			return s.refuse(reasonTags)
		}
		var name authTag
		letter := false
		elems := 0
		if !s.array(func(i int) bool {
			elems = i + 1
			lit, escaped, ok := s.str()
			if !ok {
				return false
			}
			switch {
			case i == 0:
				letter = letterName(lit, escaped)
				if auth {
					name = authTagName(lit, escaped)
				}
			case i == 1 && letter && len(lit)-2 > s.lim.MaxTagValueBytes:
				return s.refuse(reasonTagValue)
			}
			switch {
			case !auth:
			case i == 1 && name == authTagChallenge && ev.Challenge == nil:
				ev.Challenge = lit
			case i == 1 && name == authTagRelay && ev.Relay == nil:
				ev.Relay = lit
			}
			return true
		}) {
			return false
		}
		switch {
		case elems == 0:
			return s.refuse(reasonTagEmpty)
		case elems == 1 && letter:
			return s.refuse(reasonTagNoValue)
		}
		return true
	})
}

// letterName reports whether the tag name literal lit decodes to one ASCII
// letter: a name relays index by position. Other one-character names
// (NIP-70's ["-"]) stand alone.
func letterName(lit []byte, escaped bool) bool {
	if !escaped {
		return len(lit) == 3 && isLetter(lit[1])
	}
	var buf [1]byte
	n, ok := unquote(lit, buf[:])
	return ok && n == 1 && isLetter(buf[0])
}

// authTag names the tags of an AUTH event that Scan records.
type authTag uint8

const (
	authTagOther authTag = iota
	authTagChallenge
	authTagRelay
)

// authTagName reads the tag name literal lit, decoding its escapes when
// it has any.
func authTagName(lit []byte, escaped bool) authTag {
	name := lit[1 : len(lit)-1]
	var buf [len("challenge")]byte
	if escaped {
		n, ok := unquote(lit, buf[:])
		if !ok {
			return authTagOther // longer than either name
		}
		name = buf[:n]
	}
	switch string(name) {
	case "challenge":
		return authTagChallenge
	case "relay":
		return authTagRelay
	}
	return authTagOther
}

// The fields of a filter, as bits; tag filters have a bit per letter.
const (
	fIDs uint16 = 1 << iota
	fAuthors
	fKinds
	fSince
	fUntil
	fLimit
	fSearch
)

// filter consumes one canonical filter object, at most MaxFilterValues
// values in each field and MaxFanout index scans.
func (s *scanner) filter() string {
	var seen uint16
	var tags uint64 // one bit per tag letter
	var c filterCounts
	s.shape = Filter{Limit: -1, Since: -1, Until: -1}
	// values consumes an array whose elements elem consumes, and returns
	// how many there were; more than MaxFilterValues fails it.
	values := func(elem func() bool) (int, bool) {
		n := 0
		ok := s.array(func(i int) bool {
			if i >= s.lim.MaxFilterValues {
				return s.refuse(reasonFilterValues)
			}
			n = i + 1
			return elem()
		})
		return n, ok
	}
	str := func() bool { _, _, ok := s.str(); return ok }
	kind := func() bool { k, ok := s.uint(5); return ok && k <= 65535 }
	ok := s.object(func(key []byte) bool {
		var bit uint16
		var ok bool
		switch string(key) {
		case "ids":
			bit = fIDs
			if c.ids, ok = values(str); !ok {
				return false
			}
		case "authors":
			bit = fAuthors
			if c.authors, ok = values(str); !ok {
				return false
			}
		case "kinds":
			bit = fKinds
			if c.kinds, ok = values(kind); !ok {
				return false
			}
		case "since", "until":
			bit = fSince
			if key[0] == 'u' {
				bit = fUntil
			}
			v, ok := s.uint(18)
			if !ok {
				return false
			}
			if bit == fSince {
				s.shape.Since = v
			} else {
				s.shape.Until = v
			}
		case "limit":
			bit = fLimit
			v, ok := s.uint(9)
			if !ok {
				return false
			}
			s.shape.Limit = v
		case "search":
			bit = fSearch
			if _, _, ok := s.str(); !ok {
				return false
			}
		default:
			if len(key) != 2 || key[0] != '#' || !isLetter(key[1]) {
				return false
			}
			tb := uint64(1) << tagBit(key[1])
			if tags&tb != 0 {
				return false
			}
			n, ok := values(str)
			if !ok {
				return false
			}
			tags |= tb
			c.tags = true
			c.tagMax = max(c.tagMax, n)
			if narrowTag(key[1]) {
				c.narrow = true
				c.narrowMax = max(c.narrowMax, n)
			}
			return true
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
	switch {
	case s.why != "":
		return s.why
	case !ok:
		return reasonFilter
	case c.fanout() > s.lim.MaxFanout:
		return reasonFanout
	}
	// An empty list narrows nothing (eventstore reads it as absent).
	s.shape.IDs, s.shape.Authors, s.shape.Tags = c.ids > 0, c.authors > 0, c.tagMax > 0
	return ""
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// tagBit numbers the 52 tag letters.
func tagBit(c byte) uint {
	if c >= 'a' {
		return uint(c - 'a')
	}
	return 26 + uint(c-'A')
}

// Unquote decodes the JSON string literal lit (quotes included, as Facts
// and the relay's frames hold them) into dst and returns the decoded bytes,
// exactly as encoding/json reads the literal into a string: every escape,
// \uXXXX of any code point and surrogate pairs to UTF-8, a lone surrogate
// and an invalid UTF-8 byte to U+FFFD. ok is false when encoding/json would
// not read lit as a string (a raw control character or quote, a bad
// escape, missing quotes) or when it decodes to more than cap(dst) bytes.
// Relays escape what they write back (khatru writes U+2028 as \u2028), so
// the gate must read every escape to match a subscription id.
func Unquote(dst, lit []byte) ([]byte, bool) {
	n, ok := unquote(lit, dst[:cap(dst)])
	if !ok {
		return nil, false
	}
	return dst[:n], true
}

// unquote decodes the JSON string literal lit into dst as Unquote does and
// returns the decoded length; ok is false when lit is malformed or decodes
// to more than len(dst) bytes.
func unquote(lit, dst []byte) (n int, ok bool) {
	if len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
		return 0, false
	}
	s := lit[1 : len(lit)-1]
	put := func(r rune) bool {
		if n+utf8.RuneLen(r) > len(dst) {
			return false
		}
		n += utf8.EncodeRune(dst[n:], r)
		return true
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			if i+1 >= len(s) {
				return 0, false
			}
			if s[i+1] != 'u' {
				b, k, ok := unescapeASCII(s, i)
				if !ok || n >= len(dst) {
					return 0, false
				}
				dst[n] = b
				n++
				i += k
				continue
			}
			r, next, ok := decodeU(s, i)
			if !ok {
				return 0, false
			}
			i = next
			if !put(r) {
				return 0, false
			}
		case c == '"' || c < 0x20:
			return 0, false
		case c < utf8.RuneSelf:
			if n >= len(dst) {
				return 0, false
			}
			dst[n] = c
			n++
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				if !put(r) {
					return 0, false
				}
			} else {
				if n+size > len(dst) {
					return 0, false
				}
				n += copy(dst[n:], s[i:i+size])
			}
			i += size
		}
	}
	return n, true
}
