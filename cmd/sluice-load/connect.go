package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

type connectOpts struct {
	common
	hold  time.Duration
	churn int // 0: open conns connections and hold them
}

// runConnect measures connection setup: either conns connections opened
// at once (up to -parallel dials in flight), held for o.hold and closed,
// or, with o.churn, o.churn short-lived connections opened and closed by
// conns workers.
func runConnect(ctx context.Context, o *connectOpts) (*report, error) {
	rep := newReport("connect", o.url, o.conns)
	rep.Params = map[string]any{"xff": o.xff}
	d := newDialer(o.url, o.xff, o.timeout)
	var (
		fails tally
		errs  tally
		lat   []time.Duration
		ok    int
	)
	var elapsed time.Duration
	if o.churn > 0 {
		rep.Params["churn"] = o.churn
		var claimed atomic.Int64
		lats := make([][]time.Duration, o.conns)
		oks := make([]int, o.conns)
		var wg sync.WaitGroup
		start := time.Now()
		for w := range o.conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil && claimed.Add(1) <= int64(o.churn) {
					t := time.Now()
					c, status, err := d.dial(ctx, w)
					if err != nil {
						if ctx.Err() == nil {
							fails.add(statusKey(status, err), 1)
						}
						continue
					}
					lats[w] = append(lats[w], time.Since(t))
					oks[w]++
					closeConn(c, o.timeout)
				}
			}()
		}
		wg.Wait()
		elapsed = time.Since(start)
		for w := range o.conns {
			lat = append(lat, lats[w]...)
			ok += oks[w]
		}
		rep.Sent = min(int(claimed.Load()), o.churn)
		// Every worker is a connection slot; Connected counts the upgrades.
		rep.Connected = ok
	} else {
		rep.Params["parallel"] = o.parallel
		if o.hold > 0 {
			rep.Params["hold"] = o.hold.String()
		}
		start := time.Now()
		conns, lats := dialAll(ctx, d, o.conns, o.parallel, &fails)
		elapsed = time.Since(start)
		rep.Sent = o.conns
		for i, c := range conns {
			if c != nil {
				ok++
				lat = append(lat, lats[i])
			}
		}
		rep.Connected = ok
		if o.hold > 0 {
			hold(ctx, conns, o.hold, &errs)
		}
		closeAll(conns, o.timeout)
	}
	fails.into(rep.ConnFailures)
	errs.into(rep.Errors)
	rep.OKTrue = ok
	rep.Replies = ok
	rep.Elapsed = elapsed.Seconds()
	rep.Rate = perSecond(ok, elapsed)
	rep.RateUnit = "upgrades/s"
	rep.Latency = summarize(lat)
	return rep, nil
}

// hold keeps conns open for d (or until ctx ends), reading (and so
// answering pings) on each, and counts those the relay closes meanwhile.
func hold(ctx context.Context, conns []*websocket.Conn, d time.Duration, errs *tally) {
	hctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	eachConn(conns, func(_ int, c *websocket.Conn) {
		stop := context.AfterFunc(hctx, func() {
			_ = c.SetReadDeadline(time.Now()) // unblocks the read below
		})
		defer stop()
		for {
			_ = c.SetReadDeadline(time.Time{})
			if hctx.Err() != nil {
				return
			}
			if _, _, err := c.NextReader(); err != nil {
				if hctx.Err() == nil {
					errs.add("closed during hold: "+errKey(err), 1)
				}
				return
			}
		}
	})
}
