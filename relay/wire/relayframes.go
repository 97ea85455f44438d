package wire

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

// ParseAuthChallenge reads a relay frame ["AUTH",<challenge>] (NIP-42)
// and returns the challenge as its JSON literal, quotes included.
func ParseAuthChallenge(frame []byte) (challenge []byte, ok bool) {
	s := scanner{b: frame}
	if !s.label(`"AUTH"`) {
		return nil, false
	}
	lit, _, ok := s.str()
	if !ok || !s.end() {
		return nil, false
	}
	return lit, true
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

// IsEvent reports whether a relay frame is an ["EVENT",…]: most of what a
// relay sends, and nothing the gate acts on, so the relay reader tells it
// apart first, with one look at its label.
func IsEvent(frame []byte) bool {
	s := scanner{b: frame}
	return s.label(`"EVENT"`)
}

// ParseAddressed reads the subscription id of a relay frame
// ["EVENT",<sub id>,…] or ["EOSE",<sub id>] as its JSON literal, quotes
// included: what a relay sends under a subscription. It reads only as far
// as the literal, so the start of a frame is enough.
func ParseAddressed(frame []byte) (sub []byte, ok bool) {
	return subFrame(frame, `"EVENT"`, `"EOSE"`)
}

// ParseClosed reads a relay frame ["CLOSED",<sub id>,<reason>] and returns
// the subscription id as its JSON literal, quotes included.
func ParseClosed(frame []byte) (sub []byte, ok bool) { return subFrame(frame, `"CLOSED"`) }

// subFrame reads the subscription id literal that follows label, the first
// of labels that frame starts with.
func subFrame(frame []byte, labels ...string) (sub []byte, ok bool) {
	for _, label := range labels {
		s := scanner{b: frame}
		if !s.label(label) {
			continue
		}
		lit, _, ok := s.str()
		if !ok {
			return nil, false
		}
		return lit, true
	}
	return nil, false
}

// answerLabels are the labels of the relay frames that answer a client's
// request: OK (EVENT, AUTH), EOSE and CLOSED (REQ), COUNT and CLOSED
// (COUNT), NEG-MSG and NEG-ERR (NEG-OPEN, NEG-MSG; go-nostr writes
// NEG-ERROR).
var answerLabels = [...]string{`"OK"`, `"EOSE"`, `"CLOSED"`, `"COUNT"`, `"NEG-MSG"`, `"NEG-ERR"`, `"NEG-ERROR"`}

// IsAnswer reports whether a relay frame answers a client's request (see
// answerLabels), reading only its label.
func IsAnswer(frame []byte) bool {
	for _, l := range answerLabels {
		s := scanner{b: frame}
		if s.label(l) {
			return true
		}
	}
	return false
}

// ParseCountReply reads a relay frame ["COUNT",<sub id>,{…}] (NIP-45's
// answer) and returns the subscription id as its JSON literal, quotes
// included.
func ParseCountReply(frame []byte) (sub []byte, ok bool) { return subFrame(frame, `"COUNT"`) }

// ParseEOSE reads a relay frame ["EOSE",<sub id>] and returns the
// subscription id as its JSON literal, quotes included.
func ParseEOSE(frame []byte) (sub []byte, ok bool) { return subFrame(frame, `"EOSE"`) }

// ParseNegErr reads a relay frame ["NEG-ERR",<sub id>,<reason>] (NIP-77)
// and returns the subscription id as its JSON literal, quotes included.
// The label go-nostr's nip77 writes, and so khatru sends, NEG-ERROR, is
// read too: either way the relay has ended that sync.
func ParseNegErr(frame []byte) (sub []byte, ok bool) {
	return subFrame(frame, `"NEG-ERR"`, `"NEG-ERROR"`)
}
