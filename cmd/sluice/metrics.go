package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// numOutcomes sizes the arrays indexed by policy.Outcome: the last one,
// plus one (TestOutcomeNames in relay/policy holds the last one last).
const numOutcomes = policy.Unanswered + 1

// cutReasons are the reasons the gate gives Observer.Cut.
var cutReasons = []string{"slow_reader", "control_flood", "knocking"}

// metrics holds sluice's Prometheus collectors on a registry of its own
// (not the global one, so tests can build several). Every counter a frame
// can touch is created up front and kept in arrays, so the gate's hot path
// costs an index and an atomic add, never a label lookup.
type metrics struct {
	reg *prometheus.Registry

	frames      [wire.NumTypes][numOutcomes]prometheus.Counter
	connections [numOutcomes]prometheus.Counter
	cuts        map[string]prometheus.Counter // by reason; read-only once built
	// offenders are the clients refused most over the last minutes,
	// served at /top and on the status page.
	offenders *Offenders
	// bans are the penalty box's bans this process knows of, served at
	// /top and on the status page.
	bans *banList
	// readers are the clients the relay sent most over the last minutes,
	// counted in MiB (the read budget's settlements), at /top and on the
	// status page.
	readers *Offenders
	// readBytes, readEvents and readRefusals count the read side by payer
	// kind: "address" or "tier" (a NIP-42 member's budget).
	readBytes, readEvents, readRefusals *prometheus.CounterVec
	open                                prometheus.Gauge
	// shadow counts the running policy's windows in shadow by budget
	// (setPolicy): no series while nothing is in shadow.
	shadow  *prometheus.GaugeVec
	latency *prometheus.HistogramVec // registered by watch with the Redis store only
	// held observes the frames held rather than refused (limits.max_delay)
	// by how long, and in shadow mode those that would have been.
	held, wouldHold prometheus.Observer

	// The same counts as plain atomics, for the status page (reading a
	// Prometheus counter back means writing it out as a protobuf).
	frameCounts [wire.NumTypes][numOutcomes]atomic.Uint64
	openCount   atomic.Int64
	storeOK     prometheus.Observer
	storeErr    prometheus.Observer
}

// connectionOutcomes are the outcomes an upgrade can have; the others
// (quota_exceeded, invalid) are a frame's, and are not exported as series
// of sluice_connections_total that could never move.
var connectionOutcomes = []policy.Outcome{policy.Admitted, policy.RateLimited, policy.Unavailable, policy.Allowlisted, policy.OverCap}

// newMetrics registers the gate's and the store's collectors; watch adds
// the limiter's once it exists (the store it wraps needs observeStore first).
func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), offenders: NewOffenders(0, 0, nil), bans: newBanList(nil), readers: NewOffenders(0, 0, nil)}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sluice_build_info",
		Help:        "Always 1; the version label says which sluice is running.",
		ConstLabels: prometheus.Labels{"version": buildVersion()},
	})
	buildInfo.Set(1)

	frames := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_frames_total",
		Help: "Client frames by message type and what the gate did with them: admitted, rate_limited, unavailable (store could not decide; refused), quota_exceeded, allowlisted, invalid (not forwarded: not canonical, too large, an AUTH that failed verification), over_cap (a REQ past limits.subscriptions), shadow_limited (forwarded, but a window in shadow would have refused it).",
	}, []string{"type", "outcome"})
	conns := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_connections_total",
		Help: "WebSocket upgrade attempts by outcome: admitted, allowlisted, rate_limited and over_cap (HTTP 429), unavailable (HTTP 503).",
	}, []string{"outcome"})
	cuts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_disconnects_total",
		Help: "Client connections the gate closed on its own account (1008), by reason: slow_reader (a write to it made no progress for the write timeout), control_flood (too many pings, pongs or fragments), knocking (too many frames refused from the local table).",
	}, []string{"reason"})
	m.cuts = make(map[string]prometheus.Counter, len(cutReasons))
	for _, r := range cutReasons {
		m.cuts[r] = cuts.WithLabelValues(r)
	}
	for t := wire.Type(0); t < wire.NumTypes; t++ {
		for o := policy.Outcome(0); o < numOutcomes; o++ {
			m.frames[t][o] = frames.WithLabelValues(t.String(), o.String())
		}
	}
	for _, o := range connectionOutcomes {
		m.connections[o] = conns.WithLabelValues(o.String())
	}
	m.open = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_open_connections",
		Help: "Gated WebSocket connections open now.",
	})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sluice_store_latency_seconds",
		Help: "Duration of Redis store calls (memory-store decisions are not observed), by result: ok or error.",
		// From 100µs (a local Redis) to the default 100ms deadline and past it.
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
	}, []string{"result"})
	m.shadow = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_shadow_windows",
		Help: "Windows of the running policy in shadow (mode: shadow, or shadow: true on a window), by budget: connection, a message type, \"kind <class>\", \"tier <name> <type>\", \"prefix IPv6 /48\". No series while none is.",
	}, []string{"budget"})
	held := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sluice_held_seconds",
		Help: "Client frames held rather than refused (limits.max_delay), by how long, observed when let go (forwarded, or refused after all: see sluice_frames_total); mode=\"shadow\": frames that would have been held, by the wait they would have been held for.",
		// From a few milliseconds (one frame past a large burst) to the
		// longest max_delay.
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"mode"})
	m.held, m.wouldHold = held.WithLabelValues("enforce"), held.WithLabelValues("shadow")
	m.storeOK = m.latency.WithLabelValues("ok")
	m.storeErr = m.latency.WithLabelValues("error")
	m.readBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_read_bytes_total",
		Help: "Bytes the relay sent clients, charged to their read budget (limits.read), by payer: address or tier.",
	}, []string{"budget"})
	m.readEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_read_events_total",
		Help: "Events the relay sent clients, with the bytes of sluice_read_bytes_total, by payer: address or tier.",
	}, []string{"budget"})
	m.readRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_read_refusals_total",
		Help: "Subscriptions closed and REQs, COUNTs and NEG-OPENs refused because the client's read budget was spent, by payer: address or tier.",
	}, []string{"budget"})
	m.reg.MustRegister(buildInfo, frames, conns, cuts, m.open, m.shadow, held, m.readBytes, m.readEvents, m.readRefusals)
	return m
}

// setPolicy sets sluice_shadow_windows from the policy now running.
func (m *metrics) setPolicy(pc policy.Config) {
	m.shadow.Reset()
	for budget, n := range shadowWindows(pc) {
		m.shadow.WithLabelValues(budget).Set(float64(n))
	}
}

// watch registers the limiter's counters and, when breaker is not nil
// (the Redis store), the breaker gauge and the store latency histogram
// (the memory store is not observed: with it they would be a series that
// never moves, read as a Redis that is never called).
func (m *metrics) watch(limiter *ratelimit.Limiter, breaker func() string) {
	if breaker != nil {
		m.reg.MustRegister(m.latency)
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_breaker_open",
			Help: "1 while the Redis store's breaker is open or half-open (decisions fail closed without calling Redis), else 0.",
		}, func() float64 {
			if breaker() == "closed" {
				return 0
			}
			return 1
		}))
	}
	if limiter != nil {
		stat := func(name, help string, f func(ratelimit.LimiterStats) uint64) prometheus.Collector {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
				func() float64 { return float64(f(limiter.Stats())) })
		}
		m.reg.MustRegister(
			stat("sluice_limiter_store_calls_total", "Decisions the limiter asked of its store.",
				func(s ratelimit.LimiterStats) uint64 { return s.StoreCalls }),
			stat("sluice_limiter_store_errors_total", "Store decisions that failed (refused closed).",
				func(s ratelimit.LimiterStats) uint64 { return s.StoreErrors }),
			stat("sluice_limiter_local_refusals_total", "Messages refused from the local refused-until table, without a store call.",
				func(s ratelimit.LimiterStats) uint64 { return s.LocalRefusals }),
		)
	}
}

// masterBreakers is sluice_redis_master_breaker_open: on a Redis Cluster,
// one series per master decisions were routed to within the last seconds
// (redisstore.Store.NodeBreakers), 1 while that master's breaker is open
// or half-open. sluice_breaker_open is the worst of them. Nothing on a
// standalone or Sentinel store (one node: sluice_breaker_open says it).
type masterBreakers struct{ st *redisstore.Store }

var masterBreakerDesc = prometheus.NewDesc("sluice_redis_master_breaker_open",
	"On a Redis Cluster, 1 while the breaker of this master is open or half-open (its clients' decisions fail closed), else 0.",
	[]string{"master"}, nil)

func (m masterBreakers) Describe(ch chan<- *prometheus.Desc) { ch <- masterBreakerDesc }

func (m masterBreakers) Collect(ch chan<- prometheus.Metric) {
	for addr, state := range m.st.NodeBreakers() {
		v := 0.0
		if state != "closed" {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(masterBreakerDesc, prometheus.GaugeValue, v, addr)
	}
}

// observer returns the gate's hook into the counters.
func (m *metrics) observer() *policy.Observer {
	return &policy.Observer{
		Frame: func(client string, t wire.Type, o policy.Outcome) {
			if t < wire.NumTypes && o < numOutcomes {
				m.frames[t][o].Inc()
				m.frameCounts[t][o].Add(1)
			}
			m.offend(client, o)
		},
		Connection: func(client string, o policy.Outcome) {
			if o < numOutcomes && m.connections[o] != nil {
				m.connections[o].Inc()
			}
			m.offend(client, o)
		},
		Open: func(delta int) {
			m.open.Add(float64(delta))
			m.openCount.Add(int64(delta))
		},
		Cut: func(reason string) {
			if c := m.cuts[reason]; c != nil {
				c.Inc()
			}
		},
		Held: func(_ wire.Type, d time.Duration, shadow bool) {
			if shadow {
				m.wouldHold.Observe(d.Seconds())
			} else {
				m.held.Observe(d.Seconds())
			}
		},
		Ban: m.bans.add,
		Sent: func(client string, bytes, events int64) {
			b := payerKind(client)
			m.readBytes.WithLabelValues(b).Add(float64(bytes))
			m.readEvents.WithLabelValues(b).Add(float64(events))
			m.readers.addN(client, float64(bytes)/(1<<20))
		},
		ReadSpent: func(client string) { m.readRefusals.WithLabelValues(payerKind(client)).Inc() },
	}
}

// offend counts a refusal that was the client's doing (not the store's)
// toward the view of who is being limited.
func (m *metrics) offend(client string, o policy.Outcome) {
	if client == "" {
		return // a refusal that was nobody's doing
	}
	switch o {
	case policy.RateLimited, policy.QuotaExceeded, policy.Invalid, policy.OverCap:
		m.offenders.Add(client)
	}
}

// payerKind is the budget label of a payer: "tier" for a member's
// ("pk:<hex>"), else "address".
func payerKind(client string) string {
	if strings.HasPrefix(client, "pk:") {
		return "tier"
	}
	return "address"
}

// serveTop writes the clients refused most over the last minutes as JSON:
// {"half_life_seconds": 60, "clients": [{"client": …, "refusals": …,
// "overestimate": …}, …], "bans": [{"key": …, "retry_after_seconds": …,
// "until": …}, …]}, most refused first; ?n= caps the list of clients. The
// bans are the penalty box's that this process knows of, ending last
// first.
func (m *metrics) serveTop(w http.ResponseWriter, r *http.Request) {
	n := 0
	if v := r.URL.Query().Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			http.Error(w, "n must be a whole number", http.StatusBadRequest)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		HalfLife float64    `json:"half_life_seconds"`
		Clients  []Offender `json:"clients"`
		Bans     []Ban      `json:"bans"`
		Readers  []reader   `json:"readers"`
	}{DefaultOffendersHalfLife.Seconds(), m.offenders.Top(n), m.bans.active(), m.topReaders(n)})
}

// reader is one client of the readers' view: the MiB the relay sent it,
// fading by half every half-life, at most Overestimate more than the truth.
type reader struct {
	Client       string  `json:"client"`
	MiB          float64 `json:"mib"`
	Overestimate float64 `json:"overestimate"`
}

// topReaders returns up to n of the clients the relay sent most (n ≤ 0:
// all kept).
func (m *metrics) topReaders(n int) []reader {
	top := m.readers.Top(n)
	out := make([]reader, len(top))
	for i, o := range top {
		out[i] = reader{Client: o.Client, MiB: o.Refusals, Overestimate: o.Overestimate}
	}
	return out
}

// observeStore is redisstore.Options.Observe.
func (m *metrics) observeStore(d time.Duration, err error) {
	if err != nil {
		m.storeErr.Observe(d.Seconds())
		return
	}
	m.storeOK.Observe(d.Seconds())
}

// handler serves /metrics, /healthz and /readyz asking checks, and, when
// status is not nil, the status page.
func (m *metrics) handler(status *statusPage, checks ...readyCheck) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	healthHandlers(mux, checks)
	if status != nil {
		mux.Handle("/status", status)
	}
	mux.HandleFunc("/top", m.serveTop)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("sluice: /status (status page), /metrics (Prometheus), /top (the clients refused most), /healthz (serving), /readyz (ready to decide)\n"))
	})
	return mux
}
