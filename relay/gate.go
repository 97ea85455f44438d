package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/charge"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// errUpstream is wrapped by Proxy for an upstream URL it cannot use. Test
// with errors.Is.
var errUpstream = errors.New("relay: bad upstream")

// errNoRelayURL is the RelayURL error of a policy that grants budgets by
// NIP-42 pubkey (member tiers, allow-listed pubkeys) on a gate without
// Options.RelayURL. Without it an AUTH's relay tag is checked against the
// host the client claims to have connected to, so an AUTH a member's
// client signed for another relay (one that passed on this relay's
// challenge) could be replayed here, with the member's budget or
// exemption.
var errNoRelayURL = errors.New("must be the relay's public ws:// or wss:// URL when member tiers or allow-listed pubkeys grant budgets by NIP-42 pubkey: without it an AUTH signed for another relay could be replayed here")

// minQueueBytes is the smallest Options.QueueBytes: a client counts as
// behind (its requests wait in its socket) past backlogLow, so a smaller
// bound would cut it before it is ever held back.
const minQueueBytes = 64 << 10

// Defaults for the zero values of Options.
const (
	// defaultReadLimit is the largest client frame the gate reads: 512 KiB,
	// a little above khatru's own 512,000-byte limit.
	defaultReadLimit = 512 << 10
	// defaultPingInterval is how often the gate pings each client; a
	// client that answers nothing for two intervals is disconnected.
	defaultPingInterval = 30 * time.Second
	// defaultWriteTimeout bounds one write to either side.
	defaultWriteTimeout = 10 * time.Second
	// defaultFilterFrameSize is the largest REQ or COUNT the gate
	// forwards: 64 KiB holds a filter of ~900 authors, far more than any
	// client asks for in one REQ, and keeps what a REQ can make the relay
	// hold small.
	defaultFilterFrameSize = 64 << 10
	// defaultAuthFrameSize is the largest AUTH the gate forwards; an AUTH
	// event has two short tags.
	defaultAuthFrameSize = 16 << 10
	// defaultCloseFrameSize is the largest CLOSE or NEG-CLOSE: a label
	// and a subscription id.
	defaultCloseFrameSize = 1 << 10
	// plainBodyLimit is the largest body of a plain HTTP request the gate
	// passes to the relay: a NIP-86 management call is a JSON method and
	// a few parameters, and a NIP-11 or page GET has none.
	plainBodyLimit = 64 << 10
)

// defaultFrameSize returns the largest frame of type t the gate forwards
// when Options.FrameSize leaves it 0: defaultFilterFrameSize for REQ and
// COUNT, defaultAuthFrameSize for AUTH, defaultCloseFrameSize for CLOSE
// and NEG-CLOSE, and the read limit for EVENT, NEG-OPEN and NEG-MSG
// (whose events and negentropy messages are as large as clients make
// them).
func defaultFrameSize(t wire.Type, readLimit int64) int {
	switch t {
	case wire.TypeREQ, wire.TypeCOUNT:
		return defaultFilterFrameSize
	case wire.TypeAUTH:
		return defaultAuthFrameSize
	case wire.TypeCLOSE, wire.TypeNEGCLOSE:
		return defaultCloseFrameSize
	}
	return int(readLimit)
}

// Options configures a Gate. The zero value is usable: the default
// policy (policy.Config's zero value: policy.DefaultLimits, no actor
// quota, no allow-lists) over an in-process memory store.
type Options struct {
	// Limiter decides every charge, and its clock is the gate's (the
	// quota's windows, the offenders' view). If nil, a Limiter over a
	// fresh ratelimit.MemoryStore of the default size (one process only)
	// on the real clock is used.
	Limiter *ratelimit.Limiter
	// Policy is what the gate charges: limits per connection and per
	// message type, kind classes, tiers, aggregates, shadow mode, the
	// actor quota, the identity and allow-lists, and the frame bounds
	// (filters per REQ among them). Its zero value is the defaults (see
	// policy.Config); &policy.Limits{} in Policy.Limits limits nothing.
	// Reload replaces it while the gate runs.
	//
	// With an actor quota (Policy.Quota), the quota is checked after the
	// EVENT message limits, which charge every EVENT whatever the quota
	// then decides; a quota that cannot decide fails closed (the EVENT is
	// answered "error: rate limiter unavailable"). The actor of an EVENT
	// is the pubkey the connection authenticated as (NIP-42, learnt from
	// the relay's OK true to the client's AUTH), or else the event's
	// author. An actor over its quota has its EVENTs answered OK false
	// "rate-limited: …; retry in Ns" (the rest of the window). The gate
	// remembers up to 256 forwarded event ids per connection and charges
	// the actor when the relay answers OK true for one: events the relay
	// refuses, or answers "duplicate:" (it had them already), cost
	// nothing. Events in flight are not yet charged, so an actor can
	// exceed its quota by what it has in flight at the moment it crosses
	// it (at most 256 per connection). The id and pubkey are the ones
	// the gate read of a canonical EVENT (one event, each field once): a
	// relay reads the same, so its OK charges the author the gate saw. An
	// id the relay accepts again on the same connection within the window
	// (a re-send, which khatru answers OK true without "duplicate:") is
	// charged once.
	//
	// An allow-listed address (Policy.Identity) is charged nothing; an
	// allow-listed pubkey is charged nothing once the connection has
	// authenticated as it (NIP-42), and is exempt from the quota as an
	// event's author.
	Policy policy.Config
	// ReadLimit is the largest client frame in bytes; a larger one closes
	// the connection (1009). If 0, 512 KiB (a little
	// above khatru's own 512,000-byte limit).
	ReadLimit int64
	// FrameSize bounds the frames of each type the gate forwards, in
	// bytes; a larger one is charged and answered "invalid: …", never
	// forwarded. A 0 entry means the type's default: 64 KiB for REQ and
	// COUNT, 16 KiB for AUTH, 1 KiB for CLOSE and NEG-CLOSE, the read
	// limit for the rest (events and negentropy messages are as large as
	// clients make them).
	FrameSize [wire.NumTypes]int
	// MaxSubscriptions caps the subscriptions one connection holds open
	// at the relay (a place per forwarded REQ, a reused id included;
	// freed by a CLOSE, or by the relay's CLOSED once the gate has sent
	// the relay a CLOSE for it, or when the relay has sent nothing under
	// its id for 30 seconds without answering it: the client is then told
	// CLOSED "error: …"); a REQ past it is answered CLOSED "blocked: …"
	// and not forwarded. If 0 or less, 50.
	MaxSubscriptions int
	// MaxConnections caps the connections one client (its key, as
	// Policy.Identity makes it) holds open at once, counted by Guard (this
	// process's own, or every instance's on one Redis); an upgrade past it
	// is refused with HTTP 429 and a Retry-After of 5 seconds, during which
	// the gate refuses that client's upgrades without asking (a cap has no
	// wait of its own: a connection closing frees a place at any time). If
	// 0, 64; negative means no cap. Allow-listed
	// addresses are not counted.
	MaxConnections int
	// MaxSyncs caps the NIP-77 syncs (NEG-OPEN) one client holds open at
	// once through this gate, across its connections; a NEG-OPEN past it
	// is answered NEG-ERR ("blocked: …") and not forwarded. The count is
	// this process's own. If 0, 4; negative means no cap. Allow-listed clients are not counted.
	MaxSyncs int
	// MaxFilterBytes caps the bytes of the REQs whose subscriptions one
	// client holds open at the relay, across its connections through this
	// gate: the relay keeps every such filter as a listener, and matches
	// every new event against all of them. A REQ that would take the
	// client past it is answered CLOSED ("blocked: …") and not forwarded.
	// The count is this process's own. If 0, 512 KiB; negative
	// means no cap. Allow-listed clients are not counted.
	MaxFilterBytes int
	// Stored, when set, reports whether the relay stored the event with
	// this id (32 bytes, as in the event's "id") since Stored was last
	// asked about it: the first answer for a stored event is true, any
	// later one false. The actor quota is then charged only for an
	// accepted event the relay did store: khatru answers an event it
	// already has with OK true and no "duplicate:" prefix, and one it
	// keeps a newer replacement of with OK true too, so without Stored
	// anyone could spend any pubkey's quota by sending its public events
	// again. With Stored, an event whose OK the gate has not seen one to
	// two seconds after forwarding it, or when its connection ends, is
	// charged if the relay stored it. sluice relay sets it from its event
	// store.
	//
	// If nil, every accepted event but a "duplicate:" one is charged on
	// its OK; behind Proxy the relay's answers are read on for a while
	// after a client has gone with events awaiting theirs, while in Wrap
	// mode the OKs a client kept from the gate are lost with it, uncharged
	// (set Stored there). Either way an actor from one client (its
	// address) has at most 64 events awaiting their OK through this gate
	// process, and a connection at most 256; an event whose OK has not
	// come 5 seconds after it was forwarded (a relay that refuses by
	// NOTICE, answers OK with another id or none, or says nothing) stops
	// waiting within a second more, uncharged.
	Stored func(id [32]byte) bool
	// UpstreamVerifies declares that the relay verifies every event's
	// signature before it answers OK true (khatru, strfry and
	// nostr-rs-relay do). If false, the gate verifies the signature of
	// every EVENT the actor quota would charge (its author is not
	// allow-listed, the policy has a quota) before forwarding it, and
	// answers an invalid one OK false "invalid: signature is invalid":
	// the quota never charges an event whose signature nobody verified.
	// That costs one BIP-340 verification per such EVENT (see
	// docs/BENCHMARKS.md). Either way the gate checks every event's id
	// against its hash.
	UpstreamVerifies bool
	// GateAuth makes the gate do NIP-42 itself behind Proxy, for a relay
	// that does not: it sends every connection a challenge of its own as
	// it opens, and answers a client's AUTH itself (OK true once it has
	// verified it, as for a relay's challenge; "invalid: …" otherwise),
	// without forwarding it. Tiers and allow-listed pubkeys then apply
	// behind any relay. Leave it false for a relay that sends its own
	// challenges: the gate passes those on. Wrap ignores it (sluice
	// relay's khatru does NIP-42).
	GateAuth bool
	// Supports, when set, reports whether the relay does NIP nip (as its
	// NIP-11 document's supported_nips lists it). The gate asks it of
	// NIP-45 for every COUNT and of NIP-77 for every NEG-OPEN it would
	// forward, and answers one of a NIP the relay does not do itself,
	// CLOSED or NEG-ERR "unsupported: …", without forwarding it: a relay
	// that does not know the frame answers with a NOTICE or nothing, and
	// the client would wait on. It is called on every connection's reader,
	// so it must be quick and safe for concurrent use. If nil, the relay
	// does both: every COUNT and NEG-OPEN the gate admits is forwarded.
	Supports func(nip int) bool
	// RelayURL is the public URL of the relay, which a NIP-42 AUTH
	// event's relay tag must name (host and, when RelayURL has one, path).
	// If "", the tag's host must be the host the client connected to (its
	// Host header, or X-Forwarded-Host from a trusted proxy): any host the
	// client names. That is enough for the actor quota, but not for a
	// policy that grants by pubkey, which New and Reload refuse without it
	// (see Options.Validate).
	RelayURL string
	// QueueBytes bounds a client's backlog: the relay's frames and the
	// gate's replies its socket has not taken yet, queued or being
	// written. Writes toward a client never wait, in either mode: a write
	// that would take the backlog past the bound cuts the client (1008),
	// however recently it read, so one slow reader never holds up the
	// relay or anyone else. While the client is behind (its backlog over
	// 64 KiB) or has requests the relay has not answered, the gate stops
	// reading it. A client whose socket takes nothing at all for
	// WriteTimeout is closed (1008) as a slow reader. If 0,
	// 4 MiB; otherwise it must be at least
	// 64 KiB.
	QueueBytes int
	// PingInterval is the keepalive period towards clients and relays
	// behind Proxy; a side that sends nothing, not even a pong, for two
	// intervals is closed. If 0, 30 seconds. In Wrap mode the keepalive
	// is the relay's own (khatru pings every 30 s).
	PingInterval time.Duration
	// WriteTimeout bounds how long a write to a client may make no
	// progress at all (no byte taken and, on Linux, none acknowledged),
	// and one write to the relay; a side that stays blocked longer is
	// closed. If 0, 10 seconds.
	WriteTimeout time.Duration
	// PlainMethods are the methods of plain HTTP requests (anything but a
	// WebSocket upgrade as wire.IsUpgrade reads it) that Wrap and Proxy
	// pass to the relay besides GET, HEAD and OPTIONS (NIP-11, pages, CORS
	// preflights), which always pass: for example "POST" for a relay that
	// serves NIP-86 management. A request of any other method is answered
	// 405 with an Allow header, and not a byte of its body is read. If
	// nil, none: POST is refused, since a relay's NIP-86 handler may read
	// the whole body before it checks the caller (khatru's does).
	//
	// The body of a plain request passed to the relay, whatever its
	// method, is bounded at 64 KiB (a NIP-86 call is a JSON method and a
	// few parameters): one that declares a longer Content-Length is
	// answered 413 unread, and a longer one sent without (chunked) fails
	// the relay's read past the bound (http.MaxBytesReader; the server
	// then closes the connection, and Proxy answers 413).
	PlainMethods []string
	// Guard counts each client's open connections against MaxConnections
	// and keeps the penalty box's records (Policy.Penalty):
	// redisstore.NewGuard shares both across every instance on one Redis
	// (the cap then holds across instances, and a ban refuses the client's
	// upgrades on all of them). If nil, both are this process's own
	// (ratelimit.NewMemoryGuard on the Limiter's clock). A Guard set here
	// is asked at an upgrade alongside the connection's budget, not after
	// it: a place taken by an upgrade the budget refuses is given back. The
	// gate does not close it.
	Guard ratelimit.Guard
	// Observer receives decisions, for metrics. If nil, none.
	Observer *policy.Observer
	// Logger receives connection-level events (upstream failures, slow
	// clients). If nil, slog.Default() is used.
	Logger *slog.Logger
}

// Gate is the rate-limit gate: an http.Handler factory (Wrap, Proxy) that
// charges every client frame to its budget before forwarding it. A Gate
// is safe for concurrent use; one Gate may front several upstreams.
//
// Per WebSocket upgrade the gate charges the connection limit (refused:
// HTTP 429 with Retry-After; store down: HTTP 503 with the body
// "error: rate limiter unavailable"), opens the upstream connection, and
// only then upgrades the client. Per client frame it charges the frame's
// type (read from a bounded prefix, binary frames included, since khatru
// reads those as text): a refusal is answered by the gate in NIP-01's
// shape for its type (OK false, CLOSED, NOTICE; NEG-ERR for NIP-77) and
// never reaches the relay. An admitted frame is forwarded, byte for byte
// as a text frame, only when the gate finds it canonical;
// any other frame (unknown labels, frames not shaped as a Nostr message,
// extra elements, duplicate or escaped keys, malformed negentropy
// payloads, frames over their type's bound) is charged and answered with
// an "invalid:" reason: relays disagree about such frames (khatru reads
// [0,"EVENT",{…}] as an EVENT, stores B of ["EVENT",A,B], and panics on
// some negentropy payloads). Relay frames return unchanged.
//
// Shaping: a frame a message limit refuses with a wait no longer than the
// policy's Limits.MaxDelay is held instead (the defaults hold for up to
// 3 s), and decided again when the wait is over: forwarded, in order, if
// its budget admits it then, refused with the wait otherwise. While a
// frame is held its connection's reading stops (it holds one frame at a
// time; at most 64 KiB is held, and at most 32 MiB over the gate, past
// which frames are refused as without shaping). The delay counts from the
// first of a run of held frames, so a client over its budget for longer
// than MaxDelay is refused as without shaping. Observer.Held hears of
// each held frame.
//
// The relay learns the client's address from X-Forwarded-For and
// X-Real-IP, which the gate sets (replacing the client's own) on the
// upstream handshake, and, in Wrap mode, from r.RemoteAddr as well. A
// relay behind Proxy must believe those headers from the gate's address
// and from nowhere else (khatru's GetIPFromRequest believes
// X-Forwarded-For from anyone, which is safe only while the relay port is
// reachable solely through the gate).
type Gate struct {
	limiter      *ratelimit.Limiter
	pol          atomic.Pointer[gatePolicy] // the running policy; Reload swaps it
	now          func() time.Time
	readLimit    int64
	frameSize    [wire.NumTypes]int
	tooLarge     [wire.NumTypes]string // the refusal of a frame over frameSize
	maxSubs      int
	tooManySubs  string                 // the refusal of a REQ past maxSubs
	connCounts   clientCounts           // open connections per client key
	stored       func(id [32]byte) bool // Options.Stored
	verifySigs   bool                   // !Options.UpstreamVerifies
	gateAuth     bool                   // Options.GateAuth
	supports     func(nip int) bool     // Options.Supports
	syncCounts   clientCounts           // open NIP-77 syncs per client key
	tooManySyncs string
	filterBytes  clientCounts // bytes of REQs held open at the relay per client key
	reads        readMeter    // what the relay sent each payer, owed to its read budget
	tooManyBytes string
	relayURL     *url.URL
	queueBytes   int
	pingInterval time.Duration
	writeTimeout time.Duration
	obs          *charge.Observer
	log          *slog.Logger
	cutLog       cutLog // bounds the log lines of cut connections
	upgrader     websocket.Upgrader
	plainMethods map[string]bool // Options.PlainMethods, GET, HEAD and OPTIONS
	plainAllow   string          // the Allow header of a 405

	guard       ratelimit.Guard // Options.Guard, or this process's
	sharedGuard bool            // guard is Options.Guard: asked alongside the connection's budget (askHold)
	deny        denyCache       // clients refused at the upgrade, until when
	pending     pendingPoints   // penalty points not yet sent to guard

	mu      sync.Mutex
	closed  bool
	stopped chan struct{} // closed by Shutdown
	drained chan struct{} // closed once Shutdown has waited for every goroutine
	conns   map[*conn]struct{}
	wg      sync.WaitGroup

	// inflight counts, per actor and client, the events forwarded on
	// every connection and not yet settled (answered, charged as stored
	// by settleAged, or charged or given up after the connection ended by
	// settlePending); only with Stored.
	inflightMu sync.Mutex
	inflight   map[string]int

	// The frames held by every connection (shaping: hold.go) and their
	// buffers' bytes, bounded by maxHeldBytes.
	heldFrames, heldBytes atomic.Int64
}

// Validate reports everything wrong with o that New refuses, as
// errors.Join of *policy.FieldError: what policy.Config.Validate refuses
// in Policy (each path prefixed "Policy."), a RelayURL that is not a
// ws:// or wss:// URL with a host, or that is missing while the policy
// grants budgets by NIP-42 pubkey (tiers, allow-listed pubkeys; see
// Options.RelayURL), a FrameSize entry that is negative or past the read
// limit ("FrameSize[EVENT]"), and a QueueBytes that is negative or below
// 64 KiB. It returns nil for a valid o.
func (o *Options) Validate() error {
	var errs []error
	add := func(path string, err error) { errs = append(errs, &policy.FieldError{Path: path, Err: err}) }
	if err := o.Policy.Validate(); err != nil {
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			if fe, ok := e.(*policy.FieldError); ok {
				add("Policy."+fe.Path, fe.Err)
			}
		}
	}
	if o.RelayURL != "" {
		if _, err := parseRelayURL(o.RelayURL); err != nil {
			add("RelayURL", err)
		}
	} else if grantsByPubkey(&o.Policy) {
		add("RelayURL", errNoRelayURL)
	}
	readLimit := o.ReadLimit
	if readLimit <= 0 {
		readLimit = defaultReadLimit
	}
	for t, n := range o.FrameSize {
		if n < 0 || int64(n) > readLimit {
			add(fmt.Sprintf("FrameSize[%v]", wire.Type(t)), fmt.Errorf("%d bytes, want 0 (the default) to the read limit %d", n, readLimit))
		}
	}
	if o.QueueBytes < 0 || (o.QueueBytes > 0 && o.QueueBytes < minQueueBytes) {
		add("QueueBytes", fmt.Errorf("must be 0 (the default, %d) or at least %d, got %d", defaultQueueBytes, minQueueBytes, o.QueueBytes))
	}
	return errors.Join(errs...)
}

// parseRelayURL reads Options.RelayURL: a ws:// or wss:// URL with a host.
func parseRelayURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "ws" && u.Scheme != "wss") {
		return nil, fmt.Errorf("must be a ws:// or wss:// URL with a host, got %q", s)
	}
	return u, nil
}

// grantsByPubkey reports whether cfg grants budgets by NIP-42 pubkey: a
// member tier or an allow-listed pubkey, which only a gate that knows its
// public URL can check an AUTH for.
func grantsByPubkey(cfg *policy.Config) bool {
	return len(cfg.Tiers) > 0 || len(cfg.Identity.AllowPubkeys) > 0
}

// Resolved returns o with every zero size, cap and interval at the value
// New uses for it: what a Gate built on o enforces, for `sluice check` and
// NIP-11. A negative cap (no cap) is kept.
func (o Options) Resolved() Options {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = defaultReadLimit
	}
	for t := range o.FrameSize {
		if o.FrameSize[t] == 0 {
			o.FrameSize[t] = defaultFrameSize(wire.Type(t), o.ReadLimit)
		}
	}
	if o.MaxSubscriptions <= 0 {
		o.MaxSubscriptions = defaultMaxSubscriptions
	}
	def(&o.MaxConnections, defaultMaxConnections)
	def(&o.MaxSyncs, defaultMaxSyncs)
	def(&o.MaxFilterBytes, defaultMaxFilterBytes)
	def(&o.QueueBytes, defaultQueueBytes)
	if o.PingInterval <= 0 {
		o.PingInterval = defaultPingInterval
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = defaultWriteTimeout
	}
	return o
}

// New returns a Gate. It refuses what Options.Validate refuses, with its
// error.
func New(opts Options) (*Gate, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.Resolved()
	g := &Gate{
		limiter:      opts.Limiter,
		readLimit:    opts.ReadLimit,
		queueBytes:   opts.QueueBytes,
		pingInterval: opts.PingInterval,
		writeTimeout: opts.WriteTimeout,
		obs:          (*charge.Observer)(opts.Observer),
		log:          opts.Logger,
		conns:        make(map[*conn]struct{}),
		stored:       opts.Stored,
		verifySigs:   !opts.UpstreamVerifies,
		gateAuth:     opts.GateAuth,
		supports:     opts.Supports,
		stopped:      make(chan struct{}),
		drained:      make(chan struct{}),
		inflight:     make(map[string]int),
	}
	if opts.RelayURL != "" {
		g.relayURL, _ = parseRelayURL(opts.RelayURL) // Validate has read it
	}
	if err := g.Reload(opts.Policy); err != nil {
		return nil, err
	}
	if g.limiter == nil {
		g.limiter = ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), nil)
	}
	g.now = g.limiter.Now
	g.guard, g.sharedGuard = opts.Guard, opts.Guard != nil
	if g.guard == nil {
		g.guard = ratelimit.NewMemoryGuard(g.limiter.Now)
	}
	for t := range g.frameSize {
		g.frameSize[t] = opts.FrameSize[t] // Validate has bounded it
		g.tooLarge[t] = fmt.Sprintf("invalid: %v frame is larger than %d bytes", wire.Type(t), g.frameSize[t])
	}
	g.maxSubs = opts.MaxSubscriptions
	g.tooManySubs = fmt.Sprintf("blocked: too many open subscriptions (at most %d); close one first", g.maxSubs)
	g.connCounts.init(opts.MaxConnections)
	g.syncCounts.init(opts.MaxSyncs)
	g.tooManySyncs = fmt.Sprintf("blocked: too many open syncs (at most %d); send NEG-CLOSE for one first", g.syncCounts.max)
	g.filterBytes.init(opts.MaxFilterBytes)
	g.tooManyBytes = fmt.Sprintf("blocked: the subscriptions open from your address hold too many filter bytes (at most %d); close one first", g.filterBytes.max)
	if g.log == nil {
		g.log = slog.Default()
	}
	g.plainMethods = map[string]bool{http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true}
	allow := []string{http.MethodGet, http.MethodHead, http.MethodOptions}
	for _, m := range opts.PlainMethods {
		if !g.plainMethods[m] {
			g.plainMethods[m] = true
			allow = append(allow, m)
		}
	}
	g.plainAllow = strings.Join(allow, ", ")
	g.upgrader = websocket.Upgrader{
		// Nostr clients are web pages on any origin; a relay is public.
		CheckOrigin:      func(*http.Request) bool { return true },
		HandshakeTimeout: 10 * time.Second,
		// A buffer of its own makes the upgrader read through the
		// metered connection (control.go), not the server's reader.
		// 1 KiB: frame headers and small frames; a large frame's payload
		// is read straight into the frame buffer past it.
		ReadBufferSize:  1024,
		WriteBufferPool: writeBuffers,
	}
	return g, nil
}

// releaseConn gives back the place of one connection of client that
// holdUpgrade took.
func (g *Gate) releaseConn(client string) {
	g.guard.Release(client)
	g.deny.lift(client)
}

// holdSync counts one more open NIP-77 sync for client, unless it holds
// the most it may already.
func (g *Gate) holdSync(client string) bool { return g.syncCounts.hold(client) }

// releaseSyncs counts n syncs of client closed.
func (g *Gate) releaseSyncs(client string, n int) { g.syncCounts.release(client, n) }

// clientCounts counts what each client (its key) holds open through this
// gate process, against a cap: an entry only while something is held.
// With no cap (max 0) nothing is counted. Safe for concurrent use.
type clientCounts struct {
	max  int
	mu   sync.Mutex
	open map[string]int
}

// init sets the cap from a resolved Options cap per client: negative
// means no cap.
func (c *clientCounts) init(n int) {
	c.max, c.open = max(n, 0), make(map[string]int)
}

// hold counts one more for client unless it holds max already.
func (c *clientCounts) hold(client string) bool { return c.holdN(client, 1) }

// holdN counts n more for client unless that would make it hold more
// than max.
func (c *clientCounts) holdN(client string, n int) bool {
	if c.max == 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[client]+n > c.max {
		return false
	}
	c.open[client] += n
	return true
}

// release counts n of client's released.
func (c *clientCounts) release(client string, n int) {
	if c.max == 0 || n == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[client] -= n; c.open[client] <= 0 {
		delete(c.open, client)
	}
}

// gatePolicy is a compiled policy with what the gate derives from it once.
type gatePolicy struct {
	p *charge.Policy
	// watchOK: the relay's OKs matter (a quota to charge, tiers or
	// allow-listed pubkeys a connection may authenticate as), so AUTHs and
	// OKs are read.
	watchOK        bool
	tooManyFilters string        // the refusal of a REQ with more filters
	maxDelay       time.Duration // the longest hold (policy.Limits.MaxDelay); 0: none
	// penalty is the policy's penalty box with its defaults; nil: none.
	penalty *ratelimit.Penalty
}

// current returns the running policy.
func (g *Gate) current() *gatePolicy { return g.pol.Load() }

// Reload compiles cfg and makes it the gate's policy: limits, kind classes,
// tiers, aggregates, shadow mode, quota, identity and allow-lists change
// for every frame from now on, on open connections too (each rebuilds its
// budget keys at its next frame), and the limiter forgets the clients it
// refused (ratelimit.Limiter.Forget), so a loosened limit admits at once;
// the budgets themselves, kept by the store, carry over. Nothing is
// dropped. An invalid cfg is refused, with policy.Config.Validate's error
// (or a FieldError for "RelayURL" when cfg grants budgets by pubkey and
// the gate has no Options.RelayURL), and the running policy is kept.
// A gate that did not watch AUTHs and OKs when a connection opened (no
// quota, no tiers, no allow-listed pubkeys) does not learn that
// connection's NIP-42 pubkey later.
func (g *Gate) Reload(cfg policy.Config) error {
	p, err := charge.Compile(cfg)
	if err != nil {
		return err
	}
	byPubkey := grantsByPubkey(&cfg)
	if byPubkey && g.relayURL == nil {
		return &policy.FieldError{Path: "RelayURL", Err: errNoRelayURL}
	}
	gp := &gatePolicy{p: p, tooManyFilters: fmt.Sprintf("%s (at most %d)", scan.ReasonFilters, p.MaxFilters())}
	gp.watchOK = p.HasQuota() || byPubkey
	if cfg.Limits == nil {
		gp.maxDelay = policy.DefaultLimits().MaxDelay
	} else {
		gp.maxDelay = cfg.Limits.MaxDelay
	}
	if cfg.Penalty != nil && !cfg.Shadow {
		pen := cfg.Penalty.WithDefaults()
		gp.penalty = &pen
	}
	g.pol.Store(gp)
	if g.limiter != nil {
		g.limiter.Forget() // waits told under the old policy need not hold
	}
	return nil
}

// Wrap returns a handler that serves h behind the gate in-process. A
// WebSocket upgrade (wire.IsUpgrade) is gated, then h is called with it and
// upgrades the client itself on the client's own connection, which the
// gate taps (see tapConn): h reads only the frames the gate forwards, and
// the gate reads what h writes. The request h gets is the gate's: the
// client's path, query, Host and handshake key, no extension offered, and
// a context that ends with the connection.
//
// Every other request is plain HTTP (NIP-11, web pages) and goes to h
// ungated, on GET, HEAD, OPTIONS and Options.PlainMethods only, with its
// body bounded at 64 KiB and without its Connection and
// Upgrade headers (so h cannot read it as an upgrade); any other method is
// answered 405 without reading the body (see Options.PlainMethods).
//
// h sees every request with X-Forwarded-For and X-Real-IP set to the
// client's address and every other client-address header (Forwarded,
// True-Client-IP, CF-Connecting-IP, …) removed, so whichever one h
// believes, it is the gate's word; upgrade requests also have RemoteAddr
// set to the client's address. Shutdown waits for h's calls to return.
func (g *Gate) Wrap(h http.Handler) http.Handler {
	up := &upstream{local: h}
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, addr, _, _ := g.client(r)
		setForwarded(r.Header, r, addr, g.fromTrustedProxy(r))
		h.ServeHTTP(w, r)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !wire.IsUpgrade(r) {
			g.servePlain(w, r, plain)
			return
		}
		g.serveWS(w, r, up)
	})
}

// Proxy returns a handler that gates WebSocket upgrades (wire.IsUpgrade) and
// forwards them to the relay at upstream, a ws:// or wss:// URL. The
// client's path and query are appended to upstream's path. Every other
// request is plain HTTP (NIP-11, web pages) and is reverse-proxied
// ungated to the same host over http:// or https://, on the methods and
// with the body bound that Wrap passes (Options.PlainMethods, 64 KiB),
// and never as an upgrade: the Connection and
// Upgrade headers are removed, so no plain request can open an ungated
// tunnel to the relay.
//
// Upstream requests carry X-Forwarded-For and X-Real-IP set to the
// client's address; every client-address header the client sent
// (Forwarded, True-Client-IP, CF-Connecting-IP, …) is removed. Configure
// the relay to trust them from the gate's address only.
func (g *Gate) Proxy(upstream string) (http.Handler, error) {
	up, u, err := newURLUpstream(upstream)
	if err != nil {
		return nil, err
	}
	plain := g.httpProxy(u)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !wire.IsUpgrade(r) {
			g.servePlain(w, r, plain)
			return
		}
		g.serveWS(w, r, up)
	}), nil
}

// servePlain hands a plain HTTP request to h when its method is one the
// gate passes, on a copy of r without the Connection and Upgrade headers
// and with its body bounded by the plain body limit; otherwise it answers
// 405 or 413 itself, before anything reads the body (the server discards
// a bounded part of what was sent and then closes the connection).
func (g *Gate) servePlain(w http.ResponseWriter, r *http.Request, h http.Handler) {
	if !g.plainMethods[r.Method] {
		w.Header().Set("Allow", g.plainAllow)
		http.Error(w, "sluice: method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.ContentLength > plainBodyLimit {
		http.Error(w, "sluice: request body too large", http.StatusRequestEntityTooLarge)
		return
	}
	r = r.Clone(r.Context())
	r.Header.Del("Connection")
	r.Header.Del("Upgrade")
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, plainBodyLimit)
	}
	h.ServeHTTP(w, r)
}

// serveWS gates one upgrade: the connection limit, then the upstream
// handshake (so a relay that refuses is answered before the client is
// upgraded), then the client upgrade, then the bridge until either side
// closes.
func (g *Gate) serveWS(w http.ResponseWriter, r *http.Request, up *upstream) {
	gp := g.current()
	client, addr, ip, freeIP := g.client(r)
	sub := gp.p.AddressSubject(client, ip, freeIP)
	var aggs []string
	if !freeIP {
		aggs = sub.Aggregates()
		if g.refuseDenied(w, client, addr, aggs) {
			return
		}
	}
	if !g.track(1) {
		refuseUnavailable(w, "sluice: shutting down")
		return
	}
	// Until the connection is handed to a goroutine of its own, its
	// cleanups are this handler's.
	handedOff := false
	defer func() {
		if !handedOff {
			g.track(-1)
		}
	}()

	// A client the limiter refuses from its local table is answered
	// before anything asks the Guard: knocking costs no store call.
	if wait, refused := sub.ConnectionRefused(g.limiter); refused {
		g.refuseRateUpgrade(r.Context(), w, client, addr, aggs, wait)
		return
	}
	asked := g.askHold(r.Context(), gp, client, aggs, freeIP)
	v := sub.ChargeConnection(r.Context(), g.limiter)
	switch {
	case v.Err != nil:
		g.dropHold(client, asked)
		g.obs.ReportConnection(client, policy.Unavailable)
		refuseUnavailable(w, scan.ReasonUnavailable)
		return
	case v.Refused:
		g.dropHold(client, asked)
		g.refuseRateUpgrade(r.Context(), w, client, addr, aggs, v.Wait)
		return
	case v.Shadow && !v.Local:
		// Once per client and wait: the shadow refusals that follow are
		// answered from the limiter's local table (Local), and a client
		// that knocks on the door must not write a log line per knock.
		g.log.Info("upgrade would be rate-limited (shadow)", "client", client, "limit", v.Budget, "wait", v.ShadowWait.Round(time.Millisecond).String())
	}
	held := false
	if !freeIP {
		var ok bool
		if held, ok = g.holdUpgrade(r.Context(), w, gp, client, addr, aggs, asked); !ok {
			return
		}
	}
	if held {
		defer func() {
			if !handedOff {
				g.releaseConn(client)
			}
		}()
	}
	if freeIP {
		g.obs.ReportConnection(client, policy.Allowlisted)
	} else {
		g.obs.ReportConnection(client, policy.Admitted)
	}

	if !handshakeOK(r) {
		// Let the upgrader answer a malformed handshake before it costs
		// a connection to the relay.
		_, _ = g.upgrader.Upgrade(w, r, nil)
		return
	}
	trusted := g.fromTrustedProxy(r)
	_, host := requestOrigin(r, trusted)
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	c := &conn{
		g:       g,
		ctx:     ctx,
		cancel:  cancel,
		closing: make(chan struct{}),
		who:     client,
		host:    host,
		meter:   newControlMeter(),
		addr:    ip,
		aggs:    aggs,
	}
	c.sub.Store(sub)
	// Once the connection has been handed over, its cleanups are done
	// where it ends.
	// The connection is reported closed only once its places are free,
	// so what an observer sees closed can be opened again.
	if !freeIP {
		c.subs.release = func(n int) { g.filterBytes.release(client, n) }
	}
	cleanup := func() {
		c.settlePending()
		g.releaseSyncs(client, c.syncs.clear())
		c.subs.clear()
		g.remove(c)
		if held {
			g.releaseConn(client)
		}
		g.obs.ReportOpen(-1)
		g.track(-1)
	}
	if up.local != nil {
		handedOff = true
		g.serveTapped(w, r, up.local, c, addr, trusted, cleanup)
		return
	}
	upConn, resp, err := up.dial(r.Context(), r, addr, trusted)
	if err != nil {
		cancel()
		if resp != nil {
			// The relay refused the handshake itself: pass its answer on.
			relayRefusal(w, resp)
			return
		}
		g.log.Warn("relay unreachable", "client", client, "err", err)
		http.Error(w, "sluice: relay unreachable", http.StatusBadGateway)
		return
	}
	mc := newMeteredConn(c.meter, g.writeTimeout)
	clientConn, err := g.upgrader.Upgrade(meteredWriter{w, mc}, r, nil)
	if err != nil {
		cancel()
		_ = upConn.Close()
		return // the upgrader has answered
	}
	clientConn.SetReadLimit(g.readLimit)
	b := &bridge{c: c, client: clientConn, up: upConn, wire: mc, out: newOutQueue(g.queueBytes)}
	c.side = b
	c.relayW = &b.relayW
	c.subs.onMark = b.kick
	if g.gateAuth {
		c.gateAuth = true
		b.reply(c.auths.issue())
	}
	if !g.add(c) {
		c.end(true, true, closeGoingAway, "sluice: shutting down")
		return
	}
	// The connection runs on a goroutine of its own and the handler
	// returns: the HTTP server's per-request state (its connection, the
	// request, its buffers) and the handler's stack, deep from the two
	// handshakes, are not held for the connection's life.
	handedOff = true
	go func() {
		g.obs.ReportOpen(1)
		b.run()
		cleanup()
	}()
}

// serveTapped hands an admitted upgrade to the in-process handler h, with
// the client's socket tapped (tapConn): h upgrades the client itself and
// serves it on goroutines of its own, and cleanup runs once both h's call
// has returned and the connection has ended.
func (g *Gate) serveTapped(w http.ResponseWriter, r *http.Request, h http.Handler, c *conn, addr string, trusted bool, cleanup func()) {
	t := newTap(c, g.writeTimeout)
	c.side = t
	t.cleanup = cleanup
	g.obs.ReportOpen(1)
	if !g.add(c) {
		// Shutting down: refused before anything reached the handler.
		http.Error(w, "sluice: shutting down", http.StatusServiceUnavailable)
		c.cancel()
		t.unref()
		t.unref()
		return
	}
	tw := &tapResponse{ResponseWriter: w, t: t}
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				buf := make([]byte, 16<<10)
				buf = buf[:runtime.Stack(buf, false)]
				g.log.Error("in-process relay panicked", "panic", v, "stack", string(buf))
			}
			if tw.hijacked == nil {
				http.Error(w, "sluice: relay failed", http.StatusBadGateway)
			} else {
				c.end(true, true, websocket.CloseInternalServerErr, "")
				_ = t.Close() // for the handler, which will not
			}
		}
		if tw.hijacked == nil {
			// Refused (its answer went to the client), or it panicked:
			// there is no connection to end.
			c.cancel()
			t.unref()
		}
		t.unref()
	}()
	h.ServeHTTP(tw, handlerRequest(c.ctx, r, addr, forwardedHeader(r, addr, trusted)))
}

// handshakeOK reports whether r has what the upgrader requires of a
// client handshake (RFC 6455 4.2.1), short of the Connection and Upgrade
// headers that IsWebSocketUpgrade has checked.
func handshakeOK(r *http.Request) bool {
	return r.Method == http.MethodGet &&
		r.Header.Get("Sec-Websocket-Version") == "13" &&
		r.Header.Get("Sec-Websocket-Key") != ""
}

// relayRefusal copies a relay's refused handshake to the client: status,
// Retry-After, content type and up to 4 KiB of body.
func relayRefusal(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	for _, k := range []string{"Retry-After", "Content-Type"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(resp.Body, 4<<10))
}

// track counts a handler in or out of the gate; it refuses new ones once
// Shutdown has begun.
func (g *Gate) track(delta int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if delta > 0 {
		if g.closed {
			return false
		}
		g.wg.Add(1)
		return true
	}
	g.wg.Done()
	return true
}

func (g *Gate) add(c *conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.conns[c] = struct{}{}
	return true
}

func (g *Gate) remove(c *conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// Shutdown stops accepting upgrades, closes every gated connection with a
// close frame (1001, going away) on both sides, stops the in-process
// servers of Wrap, and waits for the gate's goroutines until ctx is done.
// It returns ctx.Err() if they did not all finish in time. A second call
// waits, until its own ctx is done, for the drain the first one started.
func (g *Gate) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		select {
		case <-g.drained:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	g.closed = true
	close(g.stopped)
	conns := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.mu.Unlock()

	// Each goodbye may wait up to a second for a slow peer: say them all
	// at once.
	var ends sync.WaitGroup
	for _, c := range conns {
		ends.Add(1)
		go func() {
			defer ends.Done()
			c.end(true, true, closeGoingAway, "sluice: shutting down")
		}()
	}
	go func() {
		ends.Wait()
		g.wg.Wait()
		close(g.drained)
	}()
	select {
	case <-g.drained:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// client returns the budget key of a request's client, the address the
// relay is told (as text and as read), and whether that address is
// allow-listed, by the running policy's identity.
func (g *Gate) client(r *http.Request) (client, addr string, ip netip.Addr, free bool) {
	id := g.current().p.Identity()
	key, a := id.Client(r)
	if !a.IsValid() {
		return key, "", a, false
	}
	return key, a.String(), a, id.AllowsAddr(a)
}

// fromTrustedProxy reports whether r's TCP peer is one of the identity's
// trusted proxies.
func (g *Gate) fromTrustedProxy(r *http.Request) bool {
	return g.current().p.Identity().FromTrustedProxy(r)
}
