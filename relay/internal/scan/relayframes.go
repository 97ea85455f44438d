package scan

import "bytes"

// This file reads the few relay frames the gate acts on. They come from
// the relay, not the client, but are read as strictly as client frames:
// a relay frame the gate misreads could bind a pubkey or charge a quota.

// ParseOK reads a relay frame ["OK",<id>,true|false,<reason>] and returns
// the id, whether the relay accepted the event, and whether the reason
// says it already had it ("duplicate:", NIP-01). isOK is false for every
// other frame. It is called on every relay frame, so it gives up on the
// first byte that does not fit.
func ParseOK(frame []byte) (id Hex32, accepted, duplicate, isOK bool) {
	s := scanner{b: frame}
	if !s.label(`"OK"`) {
		return id, false, false, false
	}
	lit, ok := s.hexLit(64)
	if !ok || !s.comma() {
		return id, false, false, false
	}
	id, _ = DecodeHex32(lit[1:65])
	switch {
	case s.literal("false"):
		return id, false, false, true
	case !s.literal("true"):
		return id, false, false, false
	}
	if s.comma() {
		const dup = `"duplicate:`
		duplicate = len(s.b)-s.i >= len(dup) && string(s.b[s.i:s.i+len(dup)]) == dup
	}
	return id, true, duplicate, true
}

// label consumes the start of a relay frame whose label is lit (quotes
// included): '[', the label and a comma, with whitespace anywhere between
// (relays write compact JSON, but a relay that does not must not have its
// OKs ignored).
func (s *scanner) label(lit string) bool {
	s.ws()
	if !s.eat('[') {
		return false
	}
	s.ws()
	if !s.literal(lit) {
		return false
	}
	return s.comma()
}

// literal consumes the bytes of lit.
func (s *scanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

// ReadRelay reads the start of a relay frame: its label, when it is one
// the gate acts on, and arg, the JSON literal (quotes included) of the
// string that follows the label. The labels are "EVENT", "EOSE", "CLOSED",
// "COUNT", "NEG-MSG" and "NEG-ERR", whose arg is a subscription id; "OK",
// whose arg is the event id (ParseOK reads the rest); and "AUTH" (NIP-42),
// whose arg is the challenge. go-nostr's nip77 writes, and so khatru sends,
// NEG-ERROR for NEG-ERR: either way the relay has ended that sync, and it
// is read as "NEG-ERR". label is "" for any other frame; arg is nil when
// the label is not followed by a whole string, and for an AUTH that does
// not end after it.
//
// The label needs only '[', the label and a comma, and arg is read only
// as far as its closing quote (an AUTH's to the frame's end), so the start
// of a frame is enough. It is called on every relay frame, so it gives up
// on the first byte that does not fit.
func ReadRelay(frame []byte) (label string, arg []byte) {
	s := scanner{b: frame}
	s.ws()
	if !s.eat('[') {
		return "", nil
	}
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return "", nil
	}
	rest := s.b[s.i+1:]
	n := bytes.IndexByte(rest[:min(len(rest), len("NEG-ERROR")+1)], '"')
	if n < 0 {
		return "", nil
	}
	if label = relayLabel(rest[:n]); label == "" {
		return "", nil
	}
	s.i += n + 2
	if !s.comma() {
		return "", nil
	}
	lit, _, ok := s.str()
	if !ok || label == "AUTH" && !s.end() {
		return label, nil
	}
	return label, lit
}

// relayLabel returns the label ReadRelay reports for the bytes between a
// relay frame's first two quotes; "" for one the gate does not act on.
func relayLabel(b []byte) string {
	switch string(b) {
	case "EVENT":
		return "EVENT"
	case "OK":
		return "OK"
	case "EOSE":
		return "EOSE"
	case "CLOSED":
		return "CLOSED"
	case "COUNT":
		return "COUNT"
	case "NEG-MSG":
		return "NEG-MSG"
	case "NEG-ERR", "NEG-ERROR":
		return "NEG-ERR"
	case "AUTH":
		return "AUTH"
	}
	return ""
}
