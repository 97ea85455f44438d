package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// runLoad opens o.conns connections, starts the clock and runs conn on
// each (stop is set after o.duration, if any), closes them, and adds what
// they measured up into rep: everything but rep.RateUnit, which the mode
// names (rep.Rate counts OK true per second).
func runLoad(ctx context.Context, rep *report, o *common, conn func(i int, c *websocket.Conn, stop *atomic.Bool) *connResult) {
	if o.duration > 0 {
		rep.Params["duration"] = o.duration.String()
	}
	var fails tally
	d := newDialer(o.url, o.xff, o.timeout)
	conns, _ := dialAll(ctx, d, o.conns, o.parallel, &fails)
	fails.into(rep.ConnFailures)

	var stop atomic.Bool
	results := make([]*connResult, o.conns)
	start := time.Now()
	if o.duration > 0 {
		t := time.AfterFunc(o.duration, func() { stop.Store(true) })
		defer t.Stop()
	}
	runConns(ctx, conns, func(i int, c *websocket.Conn) {
		results[i] = conn(i, c, &stop)
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
	rep.Latency = summarize(lat)
}

// eachConn runs f for every connection that was set up (conns[i] not
// nil), each in its own goroutine, and waits for them.
func eachConn(conns []*websocket.Conn, f func(i int, c *websocket.Conn)) {
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
	wg.Wait()
}

// runConns runs f for every connection that was set up, as eachConn does;
// ctx ending closes the connections so that blocked reads return.
func runConns(ctx context.Context, conns []*websocket.Conn, f func(int, *websocket.Conn)) {
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
	eachConn(conns, f)
	close(done)
}

// closeAll closes every connection cleanly, in parallel.
func closeAll(conns []*websocket.Conn, wait time.Duration) {
	eachConn(conns, func(_ int, c *websocket.Conn) {
		closeConn(c, min(wait, 2*time.Second))
	})
}
