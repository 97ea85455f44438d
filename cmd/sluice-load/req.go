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
	runLoad(ctx, rep, &o.common, func(i int, c *websocket.Conn, stop *atomic.Bool) *connResult {
		return reqConn(ctx, c, i, share(o.reqs, o.conns, i), o, stop)
	})
	rep.RateUnit = "REQs/s (EOSE per second of wall time)"
	return rep, nil
}

// reqConn sends n REQs on connection conn, keeping up to o.inflight open;
// each is measured from its write to its EOSE, then closed with CLOSE.
func reqConn(ctx context.Context, c *websocket.Conn, conn, n int, o *reqOpts, stop *atomic.Bool) *connResult {
	prefix := "c" + strconv.Itoa(conn) + "-"
	return pipeline(ctx, c, exchange{
		n:           n,
		inflight:    o.inflight,
		timeout:     o.timeout,
		stop:        stop,
		countEvents: true,
		request: func(i int) (string, []byte) {
			id := prefix + strconv.Itoa(i)
			return id, reqFrame(id, o.filter, o.filters)
		},
		answers: func(label string) bool { return label == "EOSE" || label == "CLOSED" },
		stray: func(r *connResult, m message) {
			// A CLOSED after our CLOSE, or for a subscription gone.
			if m.label == "EOSE" {
				r.errors["EOSE for no REQ in flight"]++
			}
		},
		answered: func(r *connResult, m message, lat time.Duration) error {
			if m.label != "EOSE" {
				key := reasonPrefix(m.str(1))
				if key == "" {
					key = "(no reason)"
				}
				r.prefixes[key]++
				return nil
			}
			r.okTrue++
			r.lat = append(r.lat, lat)
			r.prefixes[""]++
			close, _ := json.Marshal([]string{"CLOSE", m.str(0)})
			return c.WriteMessage(websocket.TextMessage, close)
		},
	})
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
