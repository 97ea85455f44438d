package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/ratelimit/redisstore"
)

// readyTimeout bounds each readiness check: the store's own deadline is
// shorter (store.timeout), so this bounds the upstream's handshake.
const readyTimeout = 5 * time.Second

// readyCheck is one thing /readyz asks: check returns nil when it is
// ready, and detail (optional) says what was seen either way.
type readyCheck struct {
	name   string
	check  func(ctx context.Context) error
	detail func() string // nil: none
}

// checkResult is one check's line in /readyz's body.
type checkResult struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
	Error  string `json:"error,omitempty"`
}

// healthBody is the JSON body of /healthz and /readyz.
type healthBody struct {
	OK      bool          `json:"ok"`
	Version string        `json:"version"`
	Checks  []checkResult `json:"checks,omitempty"`
}

// readyKey is the store key readiness decisions are made on: the braces
// keep it apart from every client's key (a client is an address, never
// this), and in one Redis Cluster slot.
const readyKey = "{sluice:readyz}:readyz"

// readyLimit is the limit of a readiness decision: a 1 ms half-life, so the
// key's score is gone by the next probe and no client's limit shares its
// window (no configured period can be 1 ms and matter). Admitted or
// refused, a decision is an answer: only an error is "not ready".
var readyLimit = func() *ratelimit.Windows {
	w, err := ratelimit.NewWindows(ratelimit.Limit{Rate: 2, Period: time.Millisecond, Cost: 1})
	if err != nil {
		panic(err) // a valid literal
	}
	return w
}()

// storeCheck asks store for a real decision on readyKey, as a client's
// message would: with Redis that is the script, the store's deadline, its
// breaker (an open breaker refuses at once) and its pool, all at once.
func storeCheck(store ratelimit.Store, breaker func() string) readyCheck {
	c := readyCheck{
		name: "store",
		check: func(ctx context.Context) error {
			_, err := store.Decide(ctx, readyKey, readyLimit, time.Time{})
			return err
		},
		detail: func() string { return "memory" },
	}
	if breaker != nil {
		c.detail = func() string { return "redis, breaker " + breaker() }
	}
	return c
}

// clusterStoreCheck is storeCheck on a Redis Cluster: a real decision on
// every master of the slot map, each on a reserved key of a slot that
// master serves ("{sluice:readyz:<i>}:readyz"). Ready while at least one
// master answers: the masters are shared by every instance, so a dead one
// refuses the same clients on each (its detail and
// sluice_redis_master_breaker_open say which), and an instance that
// declared itself unready for it would only take the clients of the
// healthy masters out of the load balancer too. Not ready when none
// answers. The detail lists each master's answer.
func clusterStoreCheck(st *redisstore.Store) readyCheck {
	var mu sync.Mutex
	last := "redis cluster, not asked yet"
	return readyCheck{
		name: "store",
		check: func(ctx context.Context) error {
			keys, err := st.KeyPerMaster(ctx, func(i int) string {
				return "{sluice:readyz:" + strconv.Itoa(i) + "}:readyz"
			})
			if err != nil {
				mu.Lock()
				last = "redis cluster, no slot map"
				mu.Unlock()
				return err
			}
			addrs := make([]string, 0, len(keys))
			for a := range keys {
				addrs = append(addrs, a)
			}
			slices.Sort(addrs)
			errs := make([]error, len(addrs))
			var wg sync.WaitGroup
			for i, a := range addrs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = st.Decide(ctx, keys[a], readyLimit, time.Time{})
				}()
			}
			wg.Wait()
			var b strings.Builder
			fmt.Fprintf(&b, "redis cluster, breaker %s, %d masters:", st.BreakerState(), len(addrs))
			ok := 0
			var failed []string
			for i, a := range addrs {
				if errs[i] == nil {
					ok++
					fmt.Fprintf(&b, " %s ok;", a)
				} else {
					failed = append(failed, a+": "+errs[i].Error())
					fmt.Fprintf(&b, " %s unavailable;", a)
				}
			}
			mu.Lock()
			last = strings.TrimSuffix(b.String(), ";")
			mu.Unlock()
			if ok == 0 {
				return fmt.Errorf("no master answers: %s", strings.Join(failed, "; "))
			}
			return nil
		},
		detail: func() string {
			mu.Lock()
			defer mu.Unlock()
			return last
		},
	}
}

// upstreamCheck opens a WebSocket to the relay sluice proxy protects and
// closes it again: the upstream is ready when it accepts one.
func upstreamCheck(upstream string) readyCheck {
	dialer := &websocket.Dialer{Proxy: http.ProxyFromEnvironment, HandshakeTimeout: readyTimeout}
	return readyCheck{
		name: "upstream",
		check: func(ctx context.Context) error {
			c, resp, err := dialer.DialContext(ctx, upstream, nil)
			if err != nil {
				if resp != nil {
					return fmt.Errorf("upgrade refused: HTTP %d", resp.StatusCode)
				}
				return err
			}
			_ = c.WriteControl(websocket.CloseMessage,
				websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			return c.Close()
		},
		detail: func() string { return upstream },
	}
}

// healthHandlers adds /healthz (the process serves HTTP) and /readyz
// (every check passes) to mux. Both answer JSON; /readyz is 503 with the
// failing checks' errors when one fails.
func healthHandlers(mux *http.ServeMux, checks []readyCheck) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeHealth(w, http.StatusOK, healthBody{OK: true, Version: buildVersion()})
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		body := healthBody{OK: true, Version: buildVersion(), Checks: []checkResult{}}
		for _, c := range checks {
			ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			err := c.check(ctx)
			cancel()
			res := checkResult{Name: c.name, OK: err == nil}
			if c.detail != nil {
				res.Detail = c.detail()
			}
			if err != nil {
				res.Error = err.Error()
				body.OK = false
			}
			body.Checks = append(body.Checks, res)
		}
		code := http.StatusOK
		if !body.OK {
			code = http.StatusServiceUnavailable
		}
		writeHealth(w, code, body)
	})
}

func writeHealth(w http.ResponseWriter, code int, body healthBody) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

const healthHelp = `Asks a running sluice whether it is ready (GET /readyz on its metrics
address) and exits 0 if it is, 1 if it is not or cannot be asked, printing
the answer. Without --url the address is metrics_listen from the same
configuration the server reads (file, SLUICE_* variables, flags), with an
unspecified host (0.0.0.0, ::) asked on loopback. For liveness only, use
--url http://HOST:PORT/healthz. Made for container health checks, so it
never exits 2 (Docker reserves it): a usage mistake is 1 too.`

// runHealth is "sluice health": it returns 0 when the probed URL answers
// 200, else 1.
func runHealth(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fv := &flagValues{}
	target := fs.String("url", "", "`URL` to probe (default http://<metrics_listen>/readyz); a URL without a path gets /readyz")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after `duration`")
	fs.StringVar(&fv.config, "config", "", "YAML config `file` to read metrics_listen from (env SLUICE_CONFIG)")
	fs.StringVar(&fv.metricsListen, "metrics-listen", "", "`host:port` of the metrics listener (env SLUICE_METRICS_LISTEN)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice health [flags]\n\n%s\n\nFlags (-flag and --flag both work):\n", healthHelp)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitFailure
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice health: unexpected argument %q (flags start with --)\n", fs.Arg(0))
		return exitFailure
	}
	u := *target
	if u == "" {
		cfg, err := loadConfig(fs, fv, getenv)
		if err != nil {
			fmt.Fprintf(stderr, "sluice health: invalid configuration:\n%s\n", indent(err))
			return exitFailure
		}
		if cfg.MetricsListen == "" {
			fmt.Fprintln(stderr, "sluice health: metrics_listen is off (\"\"), so there is nothing to ask; pass --url")
			return exitFailure
		}
		u = "http://" + probeAddr(cfg.MetricsListen) + "/readyz"
	} else if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		fmt.Fprintf(stderr, "sluice health: --url %q: want http://host:port[/path]\n", u)
		return exitFailure
	} else if p.Path == "" || p.Path == "/" {
		p.Path = "/readyz"
		u = p.String()
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		fmt.Fprintf(stderr, "sluice health: %v\n", err)
		return exitFailure
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "sluice health: %s: %v\n", u, err)
		return exitFailure
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	fmt.Fprintf(stdout, "%s %s\n", u, strings.TrimSpace(string(body)))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "sluice health: %s: HTTP %d\n", u, resp.StatusCode)
		return exitFailure
	}
	return exitOK
}

// probeAddr is the address to ask a listener on addr at: an unspecified
// or empty host (a listener on every interface) is asked on loopback.
func probeAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if ip != nil && ip.To4() == nil {
			host = "::1"
		} else {
			host = "127.0.0.1"
		}
	}
	return net.JoinHostPort(host, port)
}
