package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

type reqOpts struct {
	common
	reqs     int
	filters  int
	filter   json.RawMessage
	inflight int
}

// reqFrame is the REQ of subscription id with f copies of filter.
func reqFrame(id string, filter json.RawMessage, f int) []byte {
	msg := make([]any, 0, 2+f)
	msg = append(msg, "REQ", id)
	for range f {
		msg = append(msg, filter)
	}
	b, _ := json.Marshal(msg) // strings and valid raw JSON
	return b
}

func runReq(ctx context.Context, o *reqOpts) (*report, error) {
	rep := newReport("req", o.url, o.conns)
	rep.Params = map[string]any{"reqs": o.reqs, "filters": o.filters, "filter": string(o.filter), "inflight": o.inflight, "xff": o.xff}
	if o.duration > 0 {
		rep.Params["duration"] = o.duration.String()
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
		results[i] = reqConn(ctx, c, i, share(o.reqs, o.conns, i), o, &stop)
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
	rep.RateUnit = "REQs/s (EOSE per second of wall time)"
	rep.Latency = summarize(lat)
	return rep, nil
}

// reqConn sends n REQs on connection conn, keeping up to o.inflight open;
// each is measured from its write to its EOSE, then closed with CLOSE.
func reqConn(ctx context.Context, c *websocket.Conn, conn, n int, o *reqOpts, stop *atomic.Bool) *connResult {
	r := newConnResult()
	r.lat = make([]time.Duration, 0, n)
	pending := make(map[string]time.Time, o.inflight)
	next := 0
	prefix := "c" + strconv.Itoa(conn) + "-"
	fill := func() error {
		for next < n && len(pending) < o.inflight && !stop.Load() {
			id := prefix + strconv.Itoa(next)
			next++
			frame := reqFrame(id, o.filter, o.filters)
			pending[id] = time.Now()
			if err := c.WriteMessage(websocket.TextMessage, frame); err != nil {
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
			r.events++
			continue
		}
		m, err := parseMessage(b)
		if err != nil {
			r.errors["unparsable reply"]++
			continue
		}
		switch m.label {
		case "EOSE", "CLOSED":
			id := m.str(0)
			t, ok := pending[id]
			if !ok {
				// A CLOSED after our CLOSE, or for a subscription gone.
				if m.label == "EOSE" {
					r.errors["EOSE for no REQ in flight"]++
				}
				continue
			}
			delete(pending, id)
			r.replies++
			if m.label == "EOSE" {
				r.okTrue++
				r.lat = append(r.lat, now.Sub(t))
				r.prefixes[""]++
				close, _ := json.Marshal([]string{"CLOSE", id})
				if err := c.WriteMessage(websocket.TextMessage, close); err != nil {
					r.readErr(ctx, err, len(pending), "write")
					return r
				}
			} else {
				key := reasonPrefix(m.str(1))
				if key == "" {
					key = "(no reason)"
				}
				r.prefixes[key]++
			}
			if err := fill(); err != nil {
				r.readErr(ctx, err, len(pending), "write")
				return r
			}
		case "NOTICE":
			r.prefixes["NOTICE "+reasonPrefix(m.str(0))]++
		case "AUTH":
		default:
			r.errors["unexpected "+m.label]++
		}
	}
	return r
}

// parseFilter checks that s is one JSON object.
func parseFilter(s string) (json.RawMessage, error) {
	var obj map[string]any
	if err := json.Unmarshal([]byte(s), &obj); err != nil {
		return nil, fmt.Errorf("-filter must be a JSON object: %v", err)
	}
	b, _ := json.Marshal(obj)
	return b, nil
}
