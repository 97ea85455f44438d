package hooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/charge"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// ErrRateLimited is wrapped by the error a rely hook returns for a message
// or connection that a limit or the actor quota refused; a store that
// could not decide is ratelimit.ErrUnavailable instead. Test with
// errors.Is.
var ErrRateLimited = errors.New("hooks: rate limited")

// refusal is the error the rely hooks return. Its Error is the NIP-01
// reason that rely sends to the client unchanged, "rate-limited: slow
// down; retry in 3s" or "error: rate limiter unavailable"; it unwraps to
// ErrRateLimited or to the store's error (which wraps
// ratelimit.ErrUnavailable), so that a caller tells the two apart with
// errors.Is.
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string { return r.reason }
func (r *refusal) Unwrap() error { return r.err }

// Options configures Hooks. The zero value is usable: the default policy
// (policy.Config's zero value: policy.DefaultLimits, no actor quota, no
// allow-lists) over an in-process memory store.
type Options struct {
	// Limiter decides every charge, and its clock is the actor quota's.
	// If nil, a Limiter over a fresh ratelimit.MemoryStore of the default
	// size (one process only) is used.
	Limiter *ratelimit.Limiter
	// Policy is what the hooks charge, as for a Gate: limits, kind
	// classes, tiers, aggregates, shadow mode, actor quota, identity and
	// allow-lists (the address a hook is given becomes the client key,
	// IPv6 grouped by prefix), and the frame bounds. Its zero value is the
	// defaults (see policy.Config). A REQ with more filters than
	// Policy.Bounds.MaxFilters is
	// refused "invalid: too many filters"; each filter is charged its
	// price by shape (policy.ReadCost). It is compiled once, by New: another policy takes new Hooks.
	Policy policy.Config
	// Observer receives every decision, as from a Gate. If nil, none.
	Observer *policy.Observer
}

// Hooks charges the messages a relay framework has already parsed to the
// same budgets a Gate would, for operators who prefer the framework's hook
// slots to a gate in front of it. Khatru and Rely return functions whose
// types fit khatru's and rely's hook fields; the package imports neither
// framework, and learns a client's address only through a function the
// caller passes (khatru.GetIP, rely's Client.IP).
//
// Hooks is safe for concurrent use. One Hooks may serve several relays; they
// then share budgets, as gates over one store do.
//
// # What hooks cannot do
//
// A hook runs where the framework calls it, after the framework has done its
// own work, so hooks are weaker than a Gate:
//
//   - They see parsed messages only. CLOSE, AUTH, NEG-MSG, NEG-CLOSE,
//     unknown labels and frames that do not parse never reach a hook, so
//     those types are never charged; Limits.Message for them is ignored.
//   - The work a limit should save is partly spent already: the frame was
//     read and parsed (and in khatru the event's id and signature checked)
//     before the hook runs. Rely runs its Reject.Event hooks in order, so
//     prepend ours to refuse before rely checks the signature.
//   - A refused connection cannot be told how long to wait: khatru answers
//     a RejectConnection with a bare 429 and rely a Reject.Connection with
//     403, neither with Retry-After, and a store outage looks the same.
//   - khatru answers a refused COUNT with a NOTICE carrying the reason and
//     then a COUNT of 0, not a CLOSED; that is khatru's behaviour.
//   - khatru runs no RejectFilter for a filter with "limit": 0, so a REQ
//     made only of such filters (a subscription to new events, no query)
//     is not charged.
//   - They cannot see what the relay sends back. A read is priced by its
//     shape (policy.ReadCost: each filter's price charged to REQ's, COUNT's
//     or NEG-OPEN's windows, as a Gate charges it), but the read budget
//     (policy.Limits.Read, the bytes sent) is not charged through hooks:
//     a client within its REQ windows reads as much as the relay sends.
//   - Ephemeral events are not saved, so khatru's OnEventSaved does not run
//     for them and they do not count against the actor quota (their EVENT
//     budget still applies).
//   - They cannot keep a frame from the framework's parser. khatru v0.19.1
//     with Negentropy on panics, taking the process down, on a frame such
//     as [1,"X"] (go-nostr's nip77.ParseNegMessage slices out of range),
//     before any hook runs; a Gate does not forward such frames.
//   - They take the framework's word on NIP-42. khatru checks an AUTH's
//     relay tag against its ServiceURL or, without one, against the Host
//     the client sent, which any client can name: with member tiers or
//     allow-listed pubkeys, set khatru's ServiceURL to the public URL, or
//     an AUTH a member signed for another relay can be replayed to it (a
//     Gate refuses such a policy without Options.RelayURL).
//
// A Gate (Wrap) has none of these limits: it reads each frame before the
// relay does.
type Hooks struct {
	lim *ratelimit.Limiter
	p   *charge.Policy
	obs *charge.Observer
	// tooManyFilters is the refusal of a REQ with more filters than
	// p.MaxFilters.
	tooManyFilters string

	// reqs holds the cancellation scope (ctx.Done()) of every REQ whose
	// context is still live, with how many of its filters were charged;
	// khatru calls RejectFilter once per filter, all with the REQ's own
	// context. Entries leave when the context ends (CLOSE, a refused
	// filter, disconnect), so it holds at most one small entry per open
	// subscription, beside the listener per filter that khatru itself
	// keeps.
	reqs sync.Map // <-chan struct{} → *atomic.Int32
	// conns holds the scope of every live khatru connection (OnConnect),
	// so that RejectFilter can tell a NEG-OPEN, which khatru filters under
	// the connection's own context, from a REQ.
	conns sync.Map // <-chan struct{} → struct{}
}

// New returns Hooks for opts. It validates every configured limit and
// returns an error wrapping ratelimit.ErrInvalidLimit that names the
// offending field (*policy.FieldError), as policy.Config.Validate does.
func New(opts Options) (*Hooks, error) {
	p, err := charge.Compile(opts.Policy)
	if err != nil {
		return nil, err
	}
	h := &Hooks{
		lim:            opts.Limiter,
		p:              p,
		obs:            (*charge.Observer)(opts.Observer),
		tooManyFilters: fmt.Sprintf("%s (at most %d)", scan.ReasonFilters, p.MaxFilters()),
	}
	if h.lim == nil {
		h.lim = ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), nil)
	}
	return h, nil
}

// verdict is the outcome of one charge: pass, or refuse with reason.
type verdict struct {
	refuse bool
	reason string
	err    error // ErrRateLimited or the store's error when refused
}

// refusal renders v for rely: nil when it passes.
func (v verdict) refusal() error {
	if !v.refuse {
		return nil
	}
	return &refusal{reason: v.reason, err: v.err}
}

// subject returns who pays for a call from the client at addr whose
// NIP-42 authenticated pubkey is authed ("" for none): a tier member's
// budget, or the address's (charged nothing when the address or the
// authenticated pubkey is allow-listed). addr must not be empty.
func (h *Hooks) subject(addr, authed string) (sub *charge.Subject, client string) {
	key, a, free := h.p.Identity().ClientOf(addr)
	if !free && authed != "" && h.p.AllowsPubkey(authed) {
		free = true
	}
	return h.p.CallSubject(key, a, free, authed), key
}

// charge decides one message of type t (a REQ of filters filters) from
// the client at addr, whose NIP-42 authenticated pubkey is authed ("" for
// none), and reports it. An empty addr is a call from inside the relay
// (khatru's AddEvent has no connection), not a client's, and passes
// uncharged.
func (h *Hooks) charge(ctx context.Context, addr, authed string, t wire.Type, filters int) verdict {
	if addr == "" {
		return verdict{}
	}
	sub, client := h.subject(addr, authed)
	return h.report(client, t, sub.Charge(ctx, h.lim, t, filters, -1))
}

// report tells the observer of pv, a decision on a message of type t from
// client, and
// turns it into the hooks' verdict: the store failing is never a rate
// limit; a shadow refusal passes.
func (h *Hooks) report(client string, t wire.Type, pv charge.Verdict) verdict {
	h.obs.ReportFrame(client, t, pv.Outcome())
	return hookVerdict(pv)
}

func hookVerdict(pv charge.Verdict) verdict {
	switch {
	case pv.Err != nil:
		return verdict{refuse: true, reason: scan.ReasonUnavailable, err: pv.Err}
	case pv.Refused:
		return verdict{refuse: true, reason: scan.RateLimitedReason(pv.Wait), err: ErrRateLimited}
	}
	return verdict{}
}

// connection decides one WebSocket upgrade from the client at addr.
func (h *Hooks) connection(ctx context.Context, addr string) verdict {
	sub, client := h.subject(addr, "")
	pv := sub.ChargeConnection(ctx, h.lim)
	h.obs.ReportConnection(client, pv.Outcome())
	return hookVerdict(pv)
}

// event decides an EVENT from the client at addr whose NIP-42 pubkey is
// authed ("" for none) by the gate's rule (charge.Subject.Event): its
// windows, then the actor quota.
func (h *Hooks) event(ctx context.Context, addr, authed string, evt *nostr.Event) verdict {
	if addr == "" {
		return verdict{} // the relay's own event, not a client's
	}
	sub, client := h.subject(addr, authed)
	pv, _ := sub.Event(ctx, h.lim, evt.Kind, authed, author(evt))
	v := h.report(client, wire.TypeEVENT, pv)
	if pv.Refused && pv.Quota && pv.Err == nil {
		v.reason = charge.QuotaReason(sub.Quota(), pv.Wait)
	}
	return v
}

// saved charges evt, validated and saved for the client at addr whose
// NIP-42 pubkey is authed, to the actor quota, as the EVENT rule names
// the actor (charge.Subject.EventActor). A failed charge leaves the event
// uncounted, as in a Gate.
func (h *Hooks) saved(ctx context.Context, addr, authed string, evt *nostr.Event) {
	if addr == "" {
		return // saved by the relay itself, not by a client
	}
	sub, _ := h.subject(addr, authed)
	if q, actor, _ := sub.EventActor(authed, author(evt)); q != nil {
		_, _ = q.Add(ctx, actor, evt.ID, int64(evt.CreatedAt))
	}
}

// author is evt's pubkey, decoded; nil when it is not 64 hex digits (such
// an event fails its signature check, and is never saved).
func author(evt *nostr.Event) *scan.Hex32 {
	k, ok := scan.DecodeHex32(evt.PubKey)
	if !ok {
		return nil
	}
	return &k
}

// requestAddr is the TCP peer's host, for a connection hook given no
// function of its own: the one address a client cannot forge.
func requestAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// KhatruHooks are functions whose types fit khatru v0.19.1's hook slices,
// field for field. Append every non-nil one to the khatru.Relay field of the
// same name; OnConnect matters whenever Negentropy is on, and OnEventSaved
// whenever there is a quota.
type KhatruHooks struct {
	// RejectConnection charges an upgrade to the connection limit. khatru
	// answers true with a bare 429: no Retry-After, and a store outage
	// looks the same (see Hooks).
	RejectConnection func(r *http.Request) bool
	// OnConnect records the connection's context, so that RejectFilter can
	// tell khatru's NEG-OPEN (filtered under the connection's context)
	// from a REQ (filtered under a context of its own).
	OnConnect func(ctx context.Context)
	// RejectEvent checks the actor quota and charges the EVENT windows.
	RejectEvent func(ctx context.Context, event *nostr.Event) (reject bool, msg string)
	// RejectFilter charges each filter of a REQ its price by shape
	// (policy.ReadCost), as a Gate does: khatru calls it once per filter, every time under the REQ's
	// own context, and refuses a filter past the policy's Bounds.MaxFilters.
	// Filters with "limit": 0 skip khatru's RejectFilter altogether, so
	// they are not charged. A call under a connection's context is a
	// NEG-OPEN and charged as one.
	RejectFilter func(ctx context.Context, filter nostr.Filter) (reject bool, msg string)
	// RejectCountFilter charges a COUNT; khatru calls it once per COUNT.
	RejectCountFilter func(ctx context.Context, filter nostr.Filter) (reject bool, msg string)
	// OnEventSaved charges a saved event to its actor's quota. Nil when
	// there is no quota.
	OnEventSaved func(ctx context.Context, event *nostr.Event)
	// OverwriteRelayInformation appends to the document's description one
	// line that states the limits these hooks enforce, for the people who
	// read it. nip11.RelayInformationDocument has no field for rates, so
	// the machine-readable "rate_limits" object that a Gate's NIP11Handler
	// publishes cannot be expressed here.
	OverwriteRelayInformation func(ctx context.Context, r *http.Request, info nip11.RelayInformationDocument) nip11.RelayInformationDocument
}

// Khatru returns hooks for a khatru v0.19.1 relay; this package need not
// import khatru, so its accessors are passed in:
//
//   - ip returns the client's address for a connection's context, such as
//     khatru.GetIP (a host:port is accepted). Required: Khatru panics if
//     it is nil. An empty address (khatru's own AddEvent calls have no
//     connection) is not charged. khatru.GetIP believes the first public
//     X-Forwarded-For address from any peer: use it only behind a proxy
//     that overwrites that header, or behind a Gate; otherwise pass a
//     function that reads the peer address, such as func(ctx) string {
//     return khatru.GetConnection(ctx).Request.RemoteAddr }.
//   - requestIP returns the client's address for an upgrade request, such
//     as khatru.GetIPFromRequest. Nil means the host of r.RemoteAddr.
//   - authed returns the NIP-42 authenticated pubkey of a connection, or
//     "": khatru.GetAuthed. Nil means none: the actor quota then charges
//     the event's pubkey, and no call is a tier member's.
func (h *Hooks) Khatru(ip func(context.Context) string, requestIP func(*http.Request) string, authed func(context.Context) string) KhatruHooks {
	if ip == nil {
		panic("hooks: Khatru ip is nil")
	}
	if requestIP == nil {
		requestIP = requestAddr
	}
	if authed == nil {
		authed = func(context.Context) string { return "" }
	}
	k := KhatruHooks{
		RejectConnection: func(r *http.Request) bool {
			return h.connection(r.Context(), requestIP(r)).refuse
		},
		OnConnect: func(ctx context.Context) {
			h.track(&h.conns, ctx)
		},
		RejectEvent: func(ctx context.Context, evt *nostr.Event) (bool, string) {
			v := h.event(ctx, ip(ctx), authed(ctx), evt)
			return v.refuse, v.reason
		},
		RejectFilter: func(ctx context.Context, f nostr.Filter) (bool, string) {
			v := h.filter(ctx, ip(ctx), authed(ctx), h.price(&f))
			return v.refuse, v.reason
		},
		RejectCountFilter: func(ctx context.Context, f nostr.Filter) (bool, string) {
			v := h.charge(ctx, ip(ctx), authed(ctx), wire.TypeCOUNT, h.price(&f))
			return v.refuse, v.reason
		},
	}
	summary := h.summary()
	k.OverwriteRelayInformation = func(_ context.Context, _ *http.Request, info nip11.RelayInformationDocument) nip11.RelayInformationDocument {
		switch {
		case summary == "":
		case info.Description == "":
			info.Description = summary
		default:
			info.Description += "\n\n" + summary
		}
		return info
	}
	if h.p.HasQuota() {
		k.OnEventSaved = func(ctx context.Context, evt *nostr.Event) {
			h.saved(ctx, ip(ctx), authed(ctx), evt)
		}
	}
	return k
}

// summary states in one line the limits that hooks enforce (the types a
// hook sees), or "" when there are none.
func (h *Hooks) summary() string {
	p := h.p
	var parts []string
	if c := p.Connection(); c.Len() > 0 {
		parts = append(parts, "connections "+c.String())
	}
	for _, t := range [...]wire.Type{wire.TypeEVENT, wire.TypeREQ, wire.TypeCOUNT, wire.TypeNEGOPEN} {
		if w := p.Message(t); w.Len() > 0 {
			parts = append(parts, t.String()+" "+w.String())
		}
	}
	if q := p.Quota(); q != nil {
		parts = append(parts, fmt.Sprintf("at most %d saved events per %v per pubkey", q.Events(), q.Window()))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("Rate limits per client (IPv4 address or IPv6 /%d), as rate per half-life: %s.", p.Identity().PrefixBits(), strings.Join(parts, "; "))
}

// filter charges one khatru RejectFilter call: a call under a connection's
// context (khatru's NEG-OPEN) as a NEG-OPEN, any other as one filter of a
// REQ, so a REQ of n filters costs n REQs, as through a Gate. A REQ's
// filter past maxFilters is refused; khatru then cancels the REQ, whose
// earlier filters stay charged.
func (h *Hooks) filter(ctx context.Context, addr, authed string, price int) verdict {
	scope := ctx.Done()
	if scope == nil {
		// A context that can never end cannot be told apart from the next
		// REQ's, nor forgotten: charge every call, uncounted.
		return h.charge(ctx, addr, authed, wire.TypeREQ, price)
	}
	if _, ok := h.conns.Load(scope); ok {
		return h.charge(ctx, addr, authed, wire.TypeNEGOPEN, price)
	}
	n, loaded := h.reqs.LoadOrStore(scope, new(atomic.Int32))
	if !loaded {
		context.AfterFunc(ctx, func() { h.reqs.Delete(scope) })
	}
	if n.(*atomic.Int32).Add(1) > int32(h.p.MaxFilters()) {
		h.refuseFilters(addr)
		return verdict{refuse: true, reason: h.tooManyFilters}
	}
	return h.charge(ctx, addr, authed, wire.TypeREQ, price)
}

// refuseFilters reports a REQ from addr refused for holding more filters
// than the policy's bound.
func (h *Hooks) refuseFilters(addr string) {
	client, _, _ := h.p.Identity().ClientOf(addr)
	h.obs.ReportFrame(client, wire.TypeREQ, policy.Invalid)
}

// req charges a REQ of n filters at once (rely passes them in one call):
// n times a REQ's cost, or refused when n passes maxFilters.
func (h *Hooks) req(ctx context.Context, addr string, n, price int) verdict {
	if addr == "" {
		return verdict{}
	}
	if n > h.p.MaxFilters() {
		h.refuseFilters(addr)
		return verdict{refuse: true, reason: h.tooManyFilters}
	}
	return h.charge(ctx, addr, "", wire.TypeREQ, price)
}

// track remembers ctx's scope in m until ctx ends.
func (h *Hooks) track(m *sync.Map, ctx context.Context) {
	scope := ctx.Done()
	if scope == nil {
		return
	}
	m.Store(scope, struct{}{})
	context.AfterFunc(ctx, func() { m.Delete(scope) })
}

// RelyHooks are functions whose types fit rely v1.2.2's Reject hook slices;
// C is rely.Client and S is rely.Stats. Prepend them (relay.Reject.Event.
// Prepend(…)) so that they run before rely's signature check.
type RelyHooks[C, S any] struct {
	// Connection charges an upgrade to the connection limit; other HTTP
	// requests (NIP-11) pass uncharged. Rely answers an error with 403
	// and the reason as body, without Retry-After.
	Connection func(S, *http.Request) error
	// Event charges the EVENT windows and then checks the actor quota
	// (the event's pubkey), as a Gate does; an allow-listed author is
	// exempt from the quota only (see policy.Identity), so it needs no
	// signature check before rely's own.
	Event func(C, *nostr.Event) error
	// Req charges a REQ as many REQs as it has filters, as a Gate does,
	// and refuses one with more than the policy's MaxFilters; rely passes
	// all its filters in one call.
	Req func(C, nostr.Filters) error
	// Count charges a COUNT.
	Count func(C, nostr.Filters) error

	h  *Hooks
	ip func(C) string
}

// Rely returns hooks for a rely v1.2.2 relay. ip returns a client's address,
// for example func(c rely.Client) string { return c.IP().String() }: rely
// reads True-Client-IP, X-Real-IP and X-Forwarded-For from any peer, so run
// it behind a proxy that overwrites them, or behind a Gate. requestIP does the
// same for an upgrade request (rely.GetIP(r).String()); nil means the host of
// r.RemoteAddr. S cannot be inferred: write Rely[rely.Client, rely.Stats].
//
// The actor quota, if any, is charged by the function that SaveEvent returns.
// Rely lets a client authenticate as several pubkeys at once, so the actor is
// always the event's pubkey. Rely answers every refusal with the error's
// text, the NIP-01 reason.
func Rely[C, S any](h *Hooks, ip func(C) string, requestIP func(*http.Request) string) RelyHooks[C, S] {
	if ip == nil {
		panic("relay: Rely ip is nil")
	}
	if requestIP == nil {
		requestIP = requestAddr
	}
	return RelyHooks[C, S]{
		Connection: func(_ S, r *http.Request) error {
			if !wire.IsUpgrade(r) {
				return nil
			}
			return h.connection(r.Context(), requestIP(r)).refusal()
		},
		Event: func(c C, evt *nostr.Event) error {
			return h.event(context.Background(), ip(c), "", evt).refusal()
		},
		Req: func(c C, filters nostr.Filters) error {
			return h.req(context.Background(), ip(c), len(filters), h.prices(filters)).refusal()
		},
		Count: func(c C, filters nostr.Filters) error {
			return h.charge(context.Background(), ip(c), "", wire.TypeCOUNT, h.prices(filters)).refusal()
		},
		h:  h,
		ip: ip,
	}
}

// SaveEvent wraps rely's On.Event (the function that stores an event) so
// that an event it saves without error is charged to its pubkey's quota:
// relay.On.Event = hooks.SaveEvent(store). Without a quota it returns save.
func (r RelyHooks[C, S]) SaveEvent(save func(C, *nostr.Event) error) func(C, *nostr.Event) error {
	if r.h == nil || !r.h.p.HasQuota() {
		return save
	}
	return func(c C, evt *nostr.Event) error {
		if err := save(c, evt); err != nil {
			return err
		}
		r.h.saved(context.Background(), r.ip(c), "", evt)
		return nil
	}
}
