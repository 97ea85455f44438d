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
	keys     int    // 0: one key per connection
	live     string // "": no subscriber; a ws:// URL: one subscriber there times each event's live delivery
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

func runPublish(ctx context.Context, o *publishOpts) (*report, error) {
	rep := newReport("publish", o.url, o.conns)
	rep.Params = map[string]any{"events": o.events, "size": o.size, "kind": o.kind, "inflight": o.inflight, "keys": max(o.keys, 0), "xff": o.xff}
	if o.keys <= 0 {
		rep.Params["keys"] = o.conns
	}
	evs, err := presign(o)
	if err != nil {
		return nil, err
	}
	var sent *sync.Map // event id → time.Time of its write; nil without -live
	var delivered deliveries
	subDone := make(chan struct{})
	var sub *websocket.Conn
	if o.live != "" {
		rep.Params["live"] = o.live
		sent = &sync.Map{}
		// The subscriber's address follows the publishers' under -xff.
		if sub, _, err = newDialer(o.live, o.xff, o.timeout).dial(ctx, o.conns); err != nil {
			return nil, fmt.Errorf("the live subscriber: %w", err)
		}
		defer sub.Close()
		if err := subscribeLive(sub, o.timeout); err != nil {
			return nil, fmt.Errorf("the live subscriber: %w", err)
		}
		go func() {
			defer close(subDone)
			readLive(sub, sent, &delivered)
		}()
	}
	runLoad(ctx, rep, &o.common, func(i int, c *websocket.Conn, stop *atomic.Bool) *connResult {
		return publishConn(ctx, c, evs[i], o, stop, sent)
	})
	rep.RateUnit = "events/s (OK true per second of wall time)"
	if sub != nil {
		// Every event has its OK; the last ones get -timeout to arrive.
		delivered.waitFor(rep.OKTrue, o.timeout)
		_ = sub.SetReadDeadline(time.Now())
		<-subDone
		dl := delivered.latencies()
		live := summarize(dl)
		rep.Live = &live
		rep.Undelivered = max(0, rep.OKTrue-len(dl))
	}
	return rep, nil
}

// publishConn sends evs on c, keeping up to o.inflight unanswered, and
// measures each from its write to its OK; it notes each write's time in
// sent (nil: not noted).
func publishConn(ctx context.Context, c *websocket.Conn, evs []signedEvent, o *publishOpts, stop *atomic.Bool, sent *sync.Map) *connResult {
	return pipeline(ctx, c, exchange{
		n:        len(evs),
		inflight: o.inflight,
		timeout:  o.timeout,
		stop:     stop,
		request: func(i int) (string, []byte) {
			if sent != nil {
				sent.Store(evs[i].id, time.Now())
			}
			return evs[i].id, evs[i].frame
		},
		answers: func(label string) bool { return label == "OK" },
		stray: func(r *connResult, _ message) {
			r.errors["OK for no event in flight"]++
		},
		answered: func(r *connResult, m message, lat time.Duration) error {
			r.lat = append(r.lat, lat)
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
			return nil
		},
	})
}
