package relay

import (
	"sync"

	"github.com/sluice-relay/sluice/relay/wire"
)

// DefaultMaxSubscriptions caps the subscriptions one connection holds open
// at the relay (NIP-11's max_subscriptions; NIP-11's example document and
// nostr.land's, quoted there, give 20). Clients keep one open per feed,
// thread or profile they show, and close them as the view changes: tens at
// most on one relay. 50 leaves them room over 20 and keeps what one
// connection makes a relay hold (a listener and its filters per
// subscription) small.
const DefaultMaxSubscriptions = 50

// DefaultMaxConnections caps the connections one client (an IPv4 address,
// an IPv6 prefix) holds open at once, in one gate process. A household or
// office behind one NAT runs a few clients with a connection to this relay
// each; 64 leaves a large NAT room while 5,000 idle sockets from one
// address (322 MB on the relay side) are out of reach.
const DefaultMaxConnections = 64

// subTable is the set of subscriptions a connection has open at the relay:
// opened by a forwarded REQ, closed by a forwarded CLOSE or by the relay's
// CLOSED. Ids are canonical (wire.Scan: no escapes), so the bytes between
// a literal's quotes are the id. Safe for concurrent use (the client
// reader opens and closes, the relay reader closes).
type subTable struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

// open opens id unless it is not open yet and limit are: a REQ reusing an
// open id replaces that subscription and takes no new place. It reports
// whether id is open now.
func (s *subTable) open(id []byte, limit int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ids[string(id)]; ok {
		return true
	}
	if len(s.ids) >= limit {
		return false
	}
	if s.ids == nil {
		s.ids = make(map[string]struct{})
	}
	s.ids[string(id)] = struct{}{}
	return true
}

// remove closes id and reports whether it was open.
func (s *subTable) remove(id []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[string(id)]
	delete(s.ids, string(id))
	return ok
}

// subID returns the decoded id of a subscription id literal (Peek's or
// Scan's); ok is false when it does not decode (an escape outside ASCII),
// and then names no subscription the gate opened.
func subID(buf *[wire.MaxSubIDBytes]byte, lit []byte) ([]byte, bool) {
	id, ok := wire.Unquote(buf[:0], lit)
	return id, ok && len(id) > 0
}
