package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// shutdownTimeout bounds a graceful shutdown: draining connections,
// flushing the event store, closing Redis. Past it the remaining
// connections are cut and sluice exits 1.
const shutdownTimeout = 10 * time.Second

// redisPingTimeout bounds the start-up check that Redis answers.
const redisPingTimeout = 2 * time.Second

// The Redis store's batching: up to redisBatch decisions per round trip
// (and per script call: on a cluster, per master), with the store's four
// round trips in flight (twice as many of decisions sent alone while none
// has had to queue since nothing was in flight, and more only for
// decisions that waited a twentieth of the timeout). Four rather than two:
// with Redis a few milliseconds away, a decision then seldom waits for a
// round trip to end before its own can start (docs/BENCHMARKS.md, "Round
// trips in flight").
const redisBatch = 32

// limiterParts is the limiter and what must be closed with it.
type limiterParts struct {
	limiter *ratelimit.Limiter
	quotas  *quotaCache // the actor quotas, global and per tier
	// policy is the policy the gate was built with (a reload replaces
	// the gate's, and keeps its own copy).
	policy policy.Config
	redis  redis.UniversalClient
	rstore *redisstore.Store // nil with the memory store
	// guard counts open connections and keeps the penalty box in Redis,
	// across instances; nil with the memory store (the gate's own).
	guard ratelimit.Guard
	store string     // "memory" or the redacted Redis URL, for logs
	ready readyCheck // /readyz's question to the store
}

// newLimiter builds the store (memory, or Redis when cfg.Redis is set), the
// Limiter over it and the quota, and wires their metrics. A Redis that does
// not answer is logged, not fatal: sluice starts and fails closed until
// Redis is there, which is what it would do if Redis left a minute later.
func newLimiter(ctx context.Context, cfg *config, m *metrics, logger *slog.Logger) (*limiterParts, error) {
	p := &limiterParts{store: "memory"}
	if cfg.Redis == "" {
		mem := ratelimit.NewMemoryStore(0)
		p.limiter = ratelimit.NewLimiter(mem, nil)
		p.ready = storeCheck(mem, nil)
		m.watch(p.limiter, nil)
	} else {
		// go-redis logs pool failures on its own; route them through slog
		// (at Debug: every one of them is also a refused decision, which
		// the metrics count, and an outage would flood the log).
		redis.SetLogger(redisLogger{logger.With("component", "redis")})
		client, err := redisstore.NewClient(cfg.Redis)
		serrs := new(storeErrors)
		if err != nil {
			return nil, fmt.Errorf("%w: store.redis: %v", errConfig, err)
		}
		st, err := redisstore.New(client, redisstore.Options{
			Prefix:  cfg.Prefix,
			Timeout: cfg.StoreTimeout,
			Observe: func(d time.Duration, err error) {
				m.observeStore(d, err)
				serrs.observe(err)
			},
			// Batched decisions: one write, one read and (except on a
			// cluster) one script call per batch instead of per message,
			// which is most of the cost under load (see docs/BENCHMARKS.md);
			// each message still keeps its own deadline.
			Batch: redisBatch,
		})
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("%w: store: %v", errConfig, err)
		}
		p.redis = client
		p.rstore = st
		if p.guard, err = redisstore.NewGuard(st, 0); err != nil {
			client.Close()
			return nil, fmt.Errorf("%w: store: %v", errConfig, err)
		}
		p.store = redisstore.RedactURL(cfg.Redis)
		p.limiter = ratelimit.NewLimiter(st, nil)
		p.ready = storeCheck(st, st.BreakerState)
		if _, cluster := client.(*redis.ClusterClient); cluster {
			p.ready = clusterStoreCheck(st)
		}
		m.watch(p.limiter, st.BreakerState)
		m.reg.MustRegister(masterBreakers{st})
		ol := &outageLog{
			errs: serrs,
			ping: func(ctx context.Context) error { return client.Ping(ctx).Err() },
			trips: func() (uint64, uint64) {
				s := st.Stats()
				return s.RoundTrips, s.RoundTripFailures
			},
			timeout: cfg.StoreTimeout,
			breaker: st.BreakerState,
			logger:  logger,
		}
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_store_overloaded_total",
			Help: "Decisions that expired in the Redis store's own queue, never sent: sluice's overload, not Redis's (refused as unavailable).",
		}, func() float64 { return float64(st.Stats().Overloaded) }))
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_store_stalls_total",
			Help: "Redis answers saved after sluice itself did not run for a while (its machine paused, its CPU taken): replies read in the time given back past their deadline, and decisions Redis found late sent again.",
		}, func() float64 { return float64(st.Stats().Stalls) }))
		go ol.run(ctx)

		pctx, cancel := context.WithTimeout(ctx, redisPingTimeout)
		err = client.Ping(pctx).Err()
		cancel()
		if err != nil {
			logger.Warn("redis does not answer; every message is refused with \"error: rate limiter unavailable\" until it does",
				"redis", p.store, "err", err)
		}
	}
	// With Redis the quotas live there, so that N instances give an actor
	// one quota; without, in this process's bounded table.
	p.quotas = &quotaCache{limiter: p.limiter, rstore: p.rstore}
	return p, nil
}

// close stops the Redis store's batch workers, then closes its client.
func (p *limiterParts) close() error {
	if p.guard != nil {
		_ = p.guard.Close() // sends the releases not yet sent, stops its renewals; its leases then run out
	}
	if p.rstore != nil {
		_ = p.rstore.Close() // never fails; it only stops the workers
	}
	if p.redis != nil {
		return p.redis.Close()
	}
	return nil
}

// newGate builds the metrics, the limiter (newLimiter) and the gate on
// them with cfg's limits, identity, read limit, frame sizes, filter bound
// and relay URL: the wiring that proxy and relay mode share; stored is the
// relay's word on which events it stored (relay.Options.Stored; nil in
// proxy mode), supports its word on the NIPs it does (relay.Options.Supports;
// nil in relay mode, whose khatru does every one the gate forwards). On error nothing is left open; otherwise the caller closes p
// after the gate has shut down.
func newGate(ctx context.Context, cfg *config, logger *slog.Logger, stored func(id [32]byte) bool, supports func(nip int) bool) (g *relay.Gate, p *limiterParts, m *metrics, err error) {
	m = newMetrics()
	p, err = newLimiter(ctx, cfg, m, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	pc, err := buildPolicy(cfg, p.quotas.make)
	if err != nil {
		p.close()
		return nil, nil, nil, err
	}
	p.policy = pc
	m.setPolicy(pc)
	opts := gateOptions(cfg, pc)
	opts.Limiter, opts.Stored, opts.Observer, opts.Logger = p.limiter, stored, m.observer(), logger
	opts.Guard = p.guard
	// sluice relay's khatru verifies every signature before its OK.
	opts.UpstreamVerifies = cfg.UpstreamVerifies || stored != nil
	opts.GateAuth = cfg.GateAuth
	opts.Supports = supports
	g, err = relay.New(opts)
	if err != nil {
		p.close()
		return nil, nil, nil, fmt.Errorf("%w: %v", errConfig, err)
	}
	return g, p, m, nil
}

// reqFilters is the most filters a REQ may hold under pc: its bound, or
// the default.
func reqFilters(pc policy.Config) int {
	if pc.Bounds.MaxFilters > 0 {
		return pc.Bounds.MaxFilters
	}
	return wire.DefaultBounds().MaxFilters
}

// nip11Limitation is what sluice publishes about itself in NIP-11 under
// the policy pc, the one the gate runs (newGate and the reloader keep it
// in limiterParts.policy): the one source of every NIP-11 document, sluice
// relay's, sluice proxy's merge and its fallback, so that the number
// published is the number enforced.
func nip11Limitation(cfg *config, pc policy.Config) nip11.Limitation {
	limits := policy.DefaultLimits()
	if pc.Limits != nil {
		limits = *pc.Limits
	}
	var nips []int
	if cfg.GateAuth {
		nips = []int{42} // the gate does NIP-42 itself, whatever the relay does
	}
	return nip11.Limitation{
		NIPs:             nips,
		MaxMessageLength: cfg.ReadLimit,
		MaxFilters:       int64(reqFilters(pc)),
		MaxSubidLength:   wire.MaxSubIDBytes,
		MaxSubscriptions: int64(cfg.Subscriptions),
		Limits:           &limits,
		Quota:            pc.Quota,
		Kinds:            pc.Kinds,
		Shadow:           pc.Shadow,
		ReadCost:         pc.ReadCost.Resolved(),
	}
}

// front routes a request: NIP-11 to info, WebSocket upgrades (as the gate
// reads them, relay.IsUpgrade) to gated, a GET or HEAD of anything else to
// a short page saying what this is; every other method is answered 405
// without reading the body.
func front(info, gated http.Handler, page string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case nip11.IsRequest(r):
			info.ServeHTTP(w, r)
		case r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "":
			info.ServeHTTP(w, r) // CORS preflight for NIP-11
		case wire.IsUpgrade(r):
			gated.ServeHTTP(w, r)
		case r.Method == http.MethodGet || r.Method == http.MethodHead:
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if r.URL.Path != "/" {
				w.WriteHeader(http.StatusNotFound)
			}
			_, _ = io.WriteString(w, page)
		default:
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
}

// serverLimits bound what one client can make an HTTP server hold before
// its handler answers: a request's header (its time and size), the whole
// request, its body included, and an idle keep-alive connection. A
// WebSocket is not cut by them: net/http clears a connection's deadlines
// when a handler hijacks it (and gorilla's upgrader does again), and the
// gate then keeps its own.
type serverLimits struct {
	readHeader time.Duration // ReadHeaderTimeout
	read       time.Duration // ReadTimeout: header and body
	idle       time.Duration // IdleTimeout between keep-alive requests
	maxHeader  int           // MaxHeaderBytes
}

// defaultServerLimits are every sluice server's: a header takes a client
// at most 10 s and 64 KiB, a whole plain request 30 s (its body is at
// most the gate's plain body limit, 64 KiB), and a keep-alive connection
// idles 2 minutes.
var defaultServerLimits = serverLimits{
	readHeader: 10 * time.Second,
	read:       30 * time.Second,
	idle:       2 * time.Minute,
	maxHeader:  64 << 10,
}

// server returns an http.Server of handler with the limits l; its error
// log goes to logger at Debug (a client's broken request is no news).
func (l serverLimits) server(handler http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: l.readHeader,
		ReadTimeout:       l.read,
		IdleTimeout:       l.idle,
		MaxHeaderBytes:    l.maxHeader,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
}

// serve runs handler on cfg.Listen and the metrics, /healthz, /readyz
// (asking checks) and /status on cfg.MetricsListen until ctx is done, then shuts down in order: stop accepting, drain the
// gate, then close (the event store, Redis) — all within shutdownTimeout,
// which each closer is given.
func serve(ctx context.Context, cfg *config, logger *slog.Logger, handler http.Handler, m *metrics, gate *relay.Gate, checks []readyCheck, closers ...func(context.Context) error) error {
	closeAll := func() {
		for _, c := range closers {
			_ = c(context.Background()) // at start-up no call is in flight
		}
	}
	// Bind both addresses before serving either, so a port in use is an
	// error at start-up rather than half a running sluice.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		closeAll()
		return fmt.Errorf("listen: %w", err)
	}
	var mln net.Listener
	if cfg.MetricsListen != "" {
		if mln, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			ln.Close()
			closeAll()
			return fmt.Errorf("metrics listen: %w", err)
		}
	}
	srv := defaultServerLimits.server(handler, logger)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()

	var msrv *http.Server
	if mln != nil {
		status := newStatusPage(m, checks, nil)
		go status.run(ctx)
		msrv = defaultServerLimits.server(m.handler(status, checks...), logger)
		go func() { errc <- msrv.Serve(mln) }()
		logger.Info("metrics", "addr", mln.Addr().String(), "path", "/metrics")
	}
	logger.Info("listening", "addr", ln.Addr().String())

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "timeout", shutdownTimeout)
	case runErr = <-errc:
		logger.Error("server failed", "err", runErr)
	}

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	var errs []error
	if runErr != nil && !errors.Is(runErr, http.ErrServerClosed) {
		errs = append(errs, runErr)
	}
	// Stop accepting first: new upgrades would only be cut again.
	if err := srv.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("http shutdown: %w", err))
	}
	if err := gate.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("draining connections: %w", err))
	}
	if msrv != nil {
		if err := msrv.Shutdown(sctx); err != nil {
			errs = append(errs, fmt.Errorf("metrics shutdown: %w", err))
		}
	}
	for _, c := range closers {
		if err := c(sctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	logger.Info("stopped cleanly")
	return nil
}

// redisLogger adapts slog to go-redis's logger interface.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, fmt.Sprintf(format, v...))
}

// storeErrors sorts the Redis store's failed calls (redisstore's Observe)
// into outages and errors about one key. Safe for concurrent use.
type storeErrors struct {
	outage   atomic.Uint64 // Redis did not answer: timeout, refused, reset…
	perKey   atomic.Uint64 // Redis answered, about one key: corrupt value, CROSSSLOT, malformed reply
	overload atomic.Uint64 // expired in sluice's own queue, never sent
}

// observe counts err (nil: nothing). A canceled context is the caller
// leaving (a client gone mid-decision), which says nothing about Redis.
func (s *storeErrors) observe(err error) {
	switch {
	case err == nil, errors.Is(err, context.Canceled):
	case errors.Is(err, redisstore.ErrOverloaded):
		s.overload.Add(1)
	case redisstore.IsPerKey(err):
		s.perKey.Add(1)
	default:
		s.outage.Add(1)
	}
}

// outageLog logs when the store starts failing and when Redis answers
// again, and, separately at Warn, calls refused for one key and decisions
// that expired in sluice's own queue: an operator reading the log sees an
// outage begin and end, not a line per refused message, and neither a
// corrupt key nor sluice's own overload is reported as Redis being down.
//
// Redis answers again when decisions say so: round trips since the last
// tick, none of them failed. With no traffic to tell, a ping with the
// store's own timeout decides (a ping allowed longer would say "answers
// again" of a Redis too slow for every decision).
type outageLog struct {
	errs    *storeErrors
	ping    func(context.Context) error
	trips   func() (roundTrips, failures uint64) // nil: ping only
	timeout time.Duration                        // the ping's; 0 means redisPingTimeout
	breaker func() string
	logger  *slog.Logger

	lastOutage, lastPerKey, lastOverload uint64
	lastTrips, lastFailures              uint64
	failing                              bool
}

// run calls step once a second until ctx is done.
func (o *outageLog) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			o.step(ctx)
		}
	}
}

// step logs what changed since the last step.
func (o *outageLog) step(ctx context.Context) {
	if n := o.errs.perKey.Load(); n != o.lastPerKey {
		o.logger.Warn("redis refused decisions for single keys (a corrupt stored value, a CROSSSLOT key, a malformed reply); those messages were refused with \"error: rate limiter unavailable\", other clients are unaffected",
			"refused_calls", n-o.lastPerKey)
		o.lastPerKey = n
	}
	if n := o.errs.overload.Load(); n != o.lastOverload {
		o.logger.Warn("sluice is overloaded: decisions expired in its own queue before reaching Redis and were refused with \"error: rate limiter unavailable\" (not a Redis failure)",
			"expired", n-o.lastOverload)
		o.lastOverload = n
	}
	var trips, failures uint64
	if o.trips != nil {
		trips, failures = o.trips()
	}
	newTrips, newFailures := trips-o.lastTrips, failures-o.lastFailures
	o.lastTrips, o.lastFailures = trips, failures
	n := o.errs.outage.Load()
	newErrs := n - o.lastOutage
	o.lastOutage = n
	if !o.failing {
		if newErrs > 0 {
			o.failing = true
			o.logger.Error("rate limiter store unavailable: messages are refused with \"error: rate limiter unavailable\" until it answers",
				"failed_calls", newErrs, "breaker", o.breaker())
		}
		return
	}
	switch {
	case newErrs > 0 || newFailures > 0:
		return // decisions still fail
	case newTrips > 0:
		// Decisions reached Redis and every one was answered.
	default:
		timeout := o.timeout
		if timeout <= 0 {
			timeout = redisPingTimeout
		}
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := o.ping(pctx)
		cancel()
		if err != nil {
			return
		}
	}
	o.failing = false
	o.logger.Info("rate limiter store answers again")
}
