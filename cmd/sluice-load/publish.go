package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"
)

type publishOpts struct {
	common
	events   int
	size     int
	kind     int
	inflight int
	keys     int // 0: one key per connection
}

// signedEvent is an EVENT message ready to write.
type signedEvent struct {
	id    string
	frame []byte
}

// share returns how many of total items connection i of n gets.
func share(total, n, i int) int {
	s := total / n
	if i < total%n {
		s++
	}
	return s
}

// presign signs every connection's events: conn i's events are signed by
// key i mod len(keys). Signing is spread over the CPUs; it runs before
// the clock starts.
func presign(o *publishOpts) ([][]signedEvent, error) {
	nk := o.keys
	if nk <= 0 {
		nk = o.conns
	}
	keys := make([]string, nk)
	for i := range keys {
		keys[i] = nostr.GeneratePrivateKey()
	}
	var run [6]byte
	if _, err := rand.Read(run[:]); err != nil {
		return nil, err
	}
	runID := hex.EncodeToString(run[:])
	now := nostr.Now()

	out := make([][]signedEvent, o.conns)
	type job struct{ conn, n int }
	jobs := make(chan job, 1024)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				content := fmt.Sprintf("sluice-load %s %d %d ", runID, j.conn, j.n)
				if pad := o.size - len(content); pad > 0 {
					content += strings.Repeat("x", pad)
				}
				ev := nostr.Event{
					CreatedAt: now,
					Kind:      o.kind,
					Tags:      nostr.Tags{},
					Content:   content,
				}
				if err := ev.Sign(keys[j.conn%nk]); err != nil {
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				b, err := json.Marshal([]any{"EVENT", &ev})
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				out[j.conn][j.n] = signedEvent{id: ev.ID, frame: b}
			}
		}()
	}
	for c := range o.conns {
		out[c] = make([]signedEvent, share(o.events, o.conns, c))
		for n := range out[c] {
			jobs <- job{c, n}
		}
	}
	close(jobs)
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return nil, fmt.Errorf("signing events: %w", err)
	}
	return out, nil
}

// connResult is what one connection measured.
type connResult struct {
	sent, replies, okTrue, events int
	lat                           []time.Duration
	prefixes                      map[string]int
	errors                        map[string]int
}

func newConnResult() *connResult {
	return &connResult{prefixes: map[string]int{}, errors: map[string]int{}}
}

func (r *connResult) into(rep *report) {
	rep.Sent += r.sent
	rep.Replies += r.replies
	rep.OKTrue += r.okTrue
	rep.Events += r.events
	for k, v := range r.prefixes {
		rep.Prefixes[k] += v
	}
	for k, v := range r.errors {
		rep.Errors[k] += v
	}
}

// readErr records err, the end of a connection with pending requests
// unanswered.
func (r *connResult) readErr(ctx context.Context, err error, pending int, what string) {
	k := errKey(err)
	if ctx.Err() != nil {
		k = "interrupted"
	}
	r.errors[what+": "+k]++
	if pending > 0 {
		r.errors["unanswered"] += pending
	}
}

func runPublish(ctx context.Context, o *publishOpts) (*report, error) {
	rep := newReport("publish", o.url, o.conns)
	rep.Params = map[string]any{"events": o.events, "size": o.size, "kind": o.kind, "inflight": o.inflight, "keys": max(o.keys, 0), "xff": o.xff}
	if o.keys <= 0 {
		rep.Params["keys"] = o.conns
	}
	if o.duration > 0 {
		rep.Params["duration"] = o.duration.String()
	}
	evs, err := presign(o)
	if err != nil {
		return nil, err
	}

	var fails tally
	d := newDialer(o.url, o.xff, o.timeout)
	conns := dialAll(ctx, d, o.conns, o.parallel, &fails)
	fails.into(rep.ConnFailures)

	var stop atomic.Bool
	results := make([]*connResult, o.conns)
	start := time.Now()
	if o.duration > 0 {
		t := time.AfterFunc(o.duration, func() { stop.Store(true) })
		defer t.Stop()
	}
	runConns(ctx, conns, func(i int, c *websocket.Conn) {
		results[i] = publishConn(ctx, c, evs[i], o, &stop)
	})
	elapsed := time.Since(start)
	closeAll(conns, o.timeout)

	var lat []time.Duration
	for i, r := range results {
		if conns[i] == nil {
			continue
		}
		rep.Connected++
		r.into(rep)
		lat = append(lat, r.lat...)
	}
	rep.Elapsed = elapsed.Seconds()
	rep.Rate = perSecond(rep.OKTrue, elapsed)
	rep.RateUnit = "events/s (OK true per second of wall time)"
	rep.Latency = summarize(lat)
	return rep, nil
}

// runConns runs f for every connection that was set up, each in its own
// goroutine, and waits for them; ctx ending closes the connections so
// that blocked reads return.
func runConns(ctx context.Context, conns []*websocket.Conn, f func(int, *websocket.Conn)) {
	var wg sync.WaitGroup
	for i, c := range conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i, c)
		}()
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			for _, c := range conns {
				if c != nil {
					c.NetConn().Close()
				}
			}
		case <-done:
		}
	}()
	wg.Wait()
	close(done)
}

// closeAll closes every connection cleanly, in parallel.
func closeAll(conns []*websocket.Conn, wait time.Duration) {
	var wg sync.WaitGroup
	for _, c := range conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			closeConn(c, min(wait, 2*time.Second))
		}()
	}
	wg.Wait()
}

// publishConn sends evs on c, keeping up to o.inflight unanswered, and
// measures each from its write to its OK.
func publishConn(ctx context.Context, c *websocket.Conn, evs []signedEvent, o *publishOpts, stop *atomic.Bool) *connResult {
	r := newConnResult()
	r.lat = make([]time.Duration, 0, len(evs))
	pending := make(map[string]time.Time, o.inflight)
	next := 0
	fill := func() error {
		for next < len(evs) && len(pending) < o.inflight && !stop.Load() {
			ev := evs[next]
			next++
			pending[ev.id] = time.Now()
			if err := c.WriteMessage(websocket.TextMessage, ev.frame); err != nil {
				return err
			}
			r.sent++
		}
		return nil
	}
	if err := fill(); err != nil {
		r.readErr(ctx, err, len(pending), "write")
		return r
	}
	for len(pending) > 0 {
		_ = c.SetReadDeadline(time.Now().Add(o.timeout))
		_, b, err := c.ReadMessage()
		if err != nil {
			r.readErr(ctx, err, len(pending), "read")
			return r
		}
		now := time.Now()
		if isEvent(b) {
			continue
		}
		m, err := parseMessage(b)
		if err != nil {
			r.errors["unparsable reply"]++
			continue
		}
		switch m.label {
		case "OK":
			id := m.str(0)
			t, ok := pending[id]
			if !ok {
				r.errors["OK for no event in flight"]++
				continue
			}
			delete(pending, id)
			r.lat = append(r.lat, now.Sub(t))
			r.replies++
			var accepted bool
			if len(m.args) > 1 {
				_ = json.Unmarshal(m.args[1], &accepted)
			}
			reason := m.str(2)
			key := reasonPrefix(reason)
			if accepted {
				r.okTrue++
			} else if key == "" {
				key = "(no reason)"
			}
			r.prefixes[key]++
			if err := fill(); err != nil {
				r.readErr(ctx, err, len(pending), "write")
				return r
			}
		case "NOTICE":
			// A NOTICE in answer to an EVENT leaves it without an OK: it
			// ends up "unanswered" after -timeout.
			r.prefixes["NOTICE "+reasonPrefix(m.str(0))]++
		case "AUTH":
			// The relay's NIP-42 challenge: not answered.
		default:
			r.errors["unexpected "+m.label]++
		}
	}
	return r
}
