package relay

import "sync"

// This file holds what the gate needs for the actor quota: the event id
// and pubkey of an EVENT or AUTH frame, read by a bounded structural scan
// (no allocation, no decoding of tags or content), the relay's OK answers,
// and a bounded per-connection table of forwarded event ids.

// hex32 is an event id or a pubkey, decoded from its 64 hex digits.
type hex32 [32]byte

// eventScan is what the gate learned of the event inside an EVENT or AUTH
// frame.
type eventScan uint8

const (
	// scanOK: exactly one "id" and one "pubkey", both 64 hex digits.
	scanOK eventScan = iota
	// scanBad: the frame is not ["LABEL", {…}], or the event has no
	// readable id or pubkey, or has either twice. A relay could decode such
	// a frame differently from the gate (which duplicate wins, say), so the
	// gate cannot know whom an OK for it charges.
	scanBad
)

// eventFields scans frame, an EVENT or AUTH client frame, for the event's
// id and pubkey. Keys and values are JSON-decoded (escapes included), so
// "\u0070ubkey" is the pubkey as the relay sees it. The scan walks the
// frame once and never allocates; tags and content are skipped, not read.
func eventFields(frame []byte) (id, pubkey hex32, res eventScan) {
	s := scanner{b: frame}
	s.ws()
	if !s.eat('[') {
		return id, pubkey, scanBad
	}
	s.ws()
	if _, ok := s.str(); !ok { // the label, already classified by Peek
		return id, pubkey, scanBad
	}
	s.ws()
	if !s.eat(',') {
		return id, pubkey, scanBad
	}
	s.ws()
	if !s.eat('{') {
		return id, pubkey, scanBad
	}
	var haveID, havePK bool
	s.ws()
	if s.eat('}') {
		return id, pubkey, scanBad
	}
	for {
		s.ws()
		key, ok := s.str()
		if !ok {
			return id, pubkey, scanBad
		}
		s.ws()
		if !s.eat(':') {
			return id, pubkey, scanBad
		}
		s.ws()
		var k [8]byte
		kn, kok := unquote(key, k[:])
		switch {
		case kok && kn == 2 && string(k[:2]) == "id":
			if haveID || !s.hexValue(&id) {
				return id, pubkey, scanBad
			}
			haveID = true
		case kok && kn == 6 && string(k[:6]) == "pubkey":
			if havePK || !s.hexValue(&pubkey) {
				return id, pubkey, scanBad
			}
			havePK = true
		default:
			if !s.value() {
				return id, pubkey, scanBad
			}
		}
		s.ws()
		if s.eat('}') {
			break
		}
		if !s.eat(',') {
			return id, pubkey, scanBad
		}
	}
	if !haveID || !havePK {
		return id, pubkey, scanBad
	}
	return id, pubkey, scanOK
}

// relayOK reads a relay frame ["OK", <id>, true|false, <reason>] and
// returns the id, whether the relay accepted the event, and whether the
// reason says it already had it ("duplicate:", NIP-01): such an event adds
// nothing to the relay. isOK is false for every other frame. It is called
// on every relay frame, so it gives up on the first byte that does not fit.
func relayOK(frame []byte) (id hex32, accepted, duplicate, isOK bool) {
	s := scanner{b: frame}
	s.ws()
	if !s.eat('[') {
		return id, false, false, false
	}
	s.ws()
	label, ok := s.str()
	if !ok || string(label) != `"OK"` {
		return id, false, false, false
	}
	s.ws()
	if !s.eat(',') {
		return id, false, false, false
	}
	s.ws()
	if !s.hexValue(&id) {
		return id, false, false, false
	}
	s.ws()
	if !s.eat(',') {
		return id, false, false, false
	}
	s.ws()
	rest := s.b[s.i:]
	switch {
	case len(rest) >= 5 && string(rest[:5]) == "false":
		return id, false, false, true
	case len(rest) < 4 || string(rest[:4]) != "true":
		return id, false, false, false
	}
	s.i += 4
	s.ws()
	if s.eat(',') {
		s.ws()
		const dup = `"duplicate:`
		rest = s.b[s.i:]
		duplicate = len(rest) >= len(dup) && string(rest[:len(dup)]) == dup
	}
	return id, true, duplicate, true
}

// scanner walks JSON without building anything. Every method stops at the
// end of the input; a truncated frame is simply not ok.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() { s.i = skipWS(s.b, s.i) }

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str consumes a JSON string and returns its literal, quotes included.
// Only its quotes and backslashes are looked at (skipString, the one Peek
// uses): a long content string costs a memchr, not a byte-by-byte walk.
func (s *scanner) str() ([]byte, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	end := skipString(s.b, s.i+1)
	if end < 0 {
		return nil, false
	}
	lit := s.b[s.i:end]
	s.i = end
	return lit, true
}

// hexValue consumes a JSON string that decodes to 64 hex digits.
func (s *scanner) hexValue(dst *hex32) bool {
	lit, ok := s.str()
	if !ok {
		return false
	}
	var buf [64]byte
	n, ok := unquote(lit, buf[:])
	if !ok || n != 64 {
		return false
	}
	for i := range dst {
		hi, ok1 := hexNibble(buf[2*i])
		lo, ok2 := hexNibble(buf[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

// value consumes any JSON value. Containers are skipped by depth, strings
// by their escapes; scalars are checked only for their first byte, which
// is all the structure needs.
func (s *scanner) value() bool {
	if s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '"':
		_, ok := s.str()
		return ok
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if _, ok := s.str(); !ok {
					return false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return true
				}
			}
			s.i++
		}
		return false
	default:
		start := s.i
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return s.i > start
			}
			s.i++
		}
		return false
	}
}

// unquote decodes the JSON string literal lit into dst and returns the
// decoded length; ok is false when lit is malformed, decodes to more than
// len(dst) bytes, or holds a \u escape outside ASCII (which no id, pubkey
// or key the gate looks for contains).
func unquote(lit, dst []byte) (n int, ok bool) {
	if len(lit) < 2 {
		return 0, false
	}
	lit = lit[1 : len(lit)-1]
	for i := 0; i < len(lit); i++ {
		c := lit[i]
		if c == '\\' {
			var k int
			if c, k, ok = unescapeASCII(lit, i); !ok {
				return 0, false
			}
			i += k - 1
		}
		if n >= len(dst) {
			return 0, false
		}
		dst[n] = c
		n++
	}
	return n, true
}

// DefaultPending is how many forwarded EVENTs per connection the gate
// remembers while it waits for the relay's OK. A client that has more in
// flight than this loses the oldest entries: those events, if accepted,
// are not charged to the quota. 256 covers any honest client (relays
// answer in milliseconds) and bounds the table at ~25 KiB per connection.
const DefaultPending = 256

// pending is a bounded table of forwarded event ids and the actor each
// one will be charged to. The client reader adds, the relay reader takes;
// it is safe for concurrent use.
type pending struct {
	mu   sync.Mutex
	byID map[hex32]pendingEntry
	// ring is allocated by the first add: most connections only read,
	// and 8 KiB each would add up.
	ring *[DefaultPending]hex32
	next int // the ring slot written next, and evicted first
	full bool
}

type pendingEntry struct {
	actor string
	slot  int // the ring slot that holds this id, so eviction spares a re-added id
}

// add remembers id → actor, evicting the oldest entry when full.
func (p *pending) add(id hex32, actor string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byID == nil {
		p.byID = make(map[hex32]pendingEntry, 16)
		p.ring = new([DefaultPending]hex32)
	}
	if p.full {
		old := p.ring[p.next]
		if e, ok := p.byID[old]; ok && e.slot == p.next {
			delete(p.byID, old)
		}
	}
	p.ring[p.next] = id
	p.byID[id] = pendingEntry{actor: actor, slot: p.next}
	p.next++
	if p.next == len(p.ring) {
		p.next, p.full = 0, true
	}
}

// take returns and forgets the actor for id.
func (p *pending) take(id hex32) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byID[id]
	if ok {
		delete(p.byID, id)
	}
	return e.actor, ok
}

// len returns the number of ids awaiting an answer.
func (p *pending) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byID)
}
