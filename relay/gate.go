package relay

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// Sentinel errors of the gate. Test with errors.Is.
var (
	// ErrUpstream is wrapped by Proxy for an upstream URL it cannot use.
	ErrUpstream = errors.New("relay: bad upstream")
	// ErrClosed is returned by Shutdown when it is called twice.
	ErrClosed = errors.New("relay: gate closed")
)

// Defaults for the zero values of Options.
const (
	// DefaultReadLimit is the largest client frame the gate reads: 512 KiB,
	// a little above khatru's own 512,000-byte limit.
	DefaultReadLimit = 512 << 10
	// DefaultWriteBuffer is how many frames may wait for a slow client
	// before the gate closes its connection.
	DefaultWriteBuffer = 256
	// DefaultPingInterval is how often the gate pings each client; a
	// client that answers nothing for two intervals is disconnected.
	DefaultPingInterval = 30 * time.Second
	// DefaultWriteTimeout bounds one write to either side.
	DefaultWriteTimeout = 10 * time.Second
)

// Options configures a Gate. The zero value is usable: default limits
// over a memory store, the default quota off, no allow-lists.
type Options struct {
	// Limiter decides every charge. Nil means a Limiter over a fresh
	// ratelimit.MemoryStore of the default size (one process only).
	Limiter *ratelimit.Limiter
	// Limits are the windows charged per connection and per message type.
	// Nil means DefaultLimits(); a non-nil Limits is used as it is, so
	// &Limits{} limits nothing and an empty slice makes its type free.
	Limits *Limits
	// Quota caps validated events per actor. Nil means no quota.
	Quota *ratelimit.Quota
	// Now is the clock of the quota. Nil means time.Now.
	Now func() time.Time
	// ReadLimit is the largest client frame in bytes; a larger one closes
	// the connection (1009). 0 means DefaultReadLimit.
	ReadLimit int64
	// WriteBuffer bounds the frames queued for one client (relay frames
	// and the gate's own replies). When a client reads so slowly that the
	// queue fills, its connection is closed (1008) rather than holding up
	// the relay. 0 means DefaultWriteBuffer.
	WriteBuffer int
	// PingInterval is the keepalive period towards clients. 0 means
	// DefaultPingInterval.
	PingInterval time.Duration
	// WriteTimeout bounds one write to a client or to the relay; a side
	// that stays blocked longer is closed. 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// Observer receives decisions for metrics. Nil means none.
	Observer *Observer
	// Logger receives connection-level events (upstream failures,
	// slow clients). Nil means slog.Default().
	Logger *slog.Logger
}

// Gate is the rate-limit gate: an http.Handler factory (Wrap, Proxy) that
// charges every client frame to its budget before forwarding it. A Gate
// is safe for concurrent use; one Gate may front several upstreams.
type Gate struct {
	opts Options
}

// New returns a Gate. It validates every configured limit and returns an
// error wrapping ratelimit.ErrInvalidLimit that names the offending type.
func New(opts Options) (*Gate, error) {
	return &Gate{opts: opts}, nil
}

// Wrap returns a handler that serves h behind the gate in-process: plain
// HTTP requests (NIP-11, web pages) go straight to h, WebSocket upgrades
// are gated and bridged to h over in-memory pipes, without a TCP port.
//
// h sees each bridged request with RemoteAddr set to the client's address
// and X-Forwarded-For / X-Real-IP set to it too (khatru's GetIPFromRequest
// reads them).
func (g *Gate) Wrap(h http.Handler) http.Handler {
	panic("unimplemented")
}

// Proxy returns a handler that gates WebSocket upgrades and forwards them
// to the relay at upstream, a ws:// or wss:// URL. The client's path and
// query are appended to upstream's path. Non-WebSocket requests (NIP-11,
// web pages) are reverse-proxied ungated to the same host over http:// or
// https://.
//
// The upstream request carries X-Forwarded-For and X-Real-IP set to the
// client's address (replacing any the client sent). Configure the relay
// to trust them from the gate's address only.
func (g *Gate) Proxy(upstream string) (http.Handler, error) {
	panic("unimplemented")
}

// Shutdown stops accepting upgrades, closes every gated connection with a
// close frame (1001, going away) on both sides, and waits for its
// goroutines until ctx is done; then it cuts the remaining connections
// and returns ctx.Err().
func (g *Gate) Shutdown(ctx context.Context) error {
	panic("unimplemented")
}
