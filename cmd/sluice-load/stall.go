package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

type stallOpts struct {
	url     string
	xff     bool
	timeout time.Duration
	json    bool

	publishers int
	rate       float64 // events a second per publisher
	size       int
	fill       int
	duration   time.Duration
	settle     time.Duration

	stallers  int
	stallRead int // bytes a second; 0: never reads
	rcvbuf    int
	stallXFF  string
	filters   int // filters in each staller's REQ
	redial    time.Duration
	reconnect bool
	probe     time.Duration
}

// stallReport is what the stall mode measured: the honest clients'
// latencies while the stallers were subscribed.
type stallReport struct {
	Mode   string         `json:"mode"`
	URL    string         `json:"url"`
	Params map[string]any `json:"params"`

	// Sent counts the honest EVENTs written; Publish is each one's
	// write→OK, over those answered within -timeout of the end of the
	// run; Unanswered those that were not.
	Sent       int            `json:"sent"`
	Publish    latencySummary `json:"publish_ok_ms"`
	Unanswered int            `json:"unanswered"`
	Refused    map[string]int `json:"refused"` // OK false, by prefix
	// Delivery is each honest event's write→arrival at the honest
	// subscriber; Undelivered those that did not arrive.
	Delivery    latencySummary `json:"live_delivery_ms"`
	Undelivered int            `json:"undelivered"`

	// Stallers: connections set up (reconnections included), how many
	// were cut (found by a read error or probeCut) and how long each had
	// been subscribed when it was, dial failures by kind.
	StallersUp    int            `json:"stallers_up"`
	StallerCuts   int            `json:"staller_cuts"`
	CutAfter      latencySummary `json:"staller_cut_after_ms"`
	StallerFails  map[string]int `json:"staller_dial_failures"`
	StallerRead   int64          `json:"staller_bytes_read"`
	HonestErrors  map[string]int `json:"honest_errors"`
	ElapsedS      float64        `json:"elapsed_s"`
	HonestClients int            `json:"honest_clients"`
}

func parseStall(args []string, stderr io.Writer) (*stallOpts, error) {
	o := &stallOpts{}
	fs := newFlagSet("stall", stderr)
	fs.StringVar(&o.url, "url", "", "relay `URL`, ws:// or wss:// (required)")
	fs.BoolVar(&o.xff, "xff", false, "give each honest client its own X-Forwarded-For, the stallers -stall-xff")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "the longest wait for a dial, and for the last replies after -duration")
	fs.BoolVar(&o.json, "json", false, "print the report as one JSON object")
	fs.IntVar(&o.publishers, "publishers", 4, "honest publishing connections")
	fs.Float64Var(&o.rate, "rate", 5, "events a second each publisher sends, on a schedule (not waiting for OKs)")
	fs.IntVar(&o.size, "size", 3000, "content size of every event in `bytes` (the fill's and the publishers')")
	fs.IntVar(&o.fill, "fill", 1000, "events stored before the stallers subscribe (their REQ's result)")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "how long the publishers publish")
	fs.DurationVar(&o.settle, "settle", 3*time.Second, "wait after the stallers subscribe, so that their queues fill first")
	fs.IntVar(&o.stallers, "stallers", 1, "stalled subscribers, all from one address (0: the unloaded case)")
	fs.IntVar(&o.stallRead, "stall-read", 0, "bytes a second each staller reads (0: nothing)")
	fs.IntVar(&o.rcvbuf, "rcvbuf", 4096, "SO_RCVBUF of each staller in `bytes` (0: the kernel's default)")
	fs.StringVar(&o.stallXFF, "stall-xff", "10.255.255.254", "the stallers' X-Forwarded-For with -xff")
	fs.IntVar(&o.filters, "stall-filters", 2, "copies of {\"kinds\":[1],\"limit\":1000} in each staller's second REQ: each brings the stored set (up to the relay's limit); the first, {\"kinds\":[1],\"limit\":0}, brings the live events")
	fs.BoolVar(&o.reconnect, "reconnect", true, "a staller that is cut connects and subscribes again")
	fs.DurationVar(&o.redial, "redial", time.Second, "a staller's wait after a refused upgrade")
	fs.DurationVar(&o.probe, "probe", time.Second, "how often a staller pings to find out whether it was cut")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if err := checkURL("stall", o.url); err != nil {
		return nil, err
	}
	switch {
	case o.publishers < 1:
		return nil, usagef("stall: -publishers must be at least 1, got %d", o.publishers)
	case o.rate <= 0 || o.rate > 10000:
		return nil, usagef("stall: -rate must be in (0, 10000], got %v", o.rate)
	case o.size < 0 || o.size > 256<<10:
		return nil, usagef("stall: -size must be between 0 and %d, got %d", 256<<10, o.size)
	case o.filters < 1:
		return nil, usagef("stall: -stall-filters must be at least 1, got %d", o.filters)
	case o.redial < 0:
		return nil, usagef("stall: -redial must not be negative, got %v", o.redial)
	case o.fill < 0 || o.stallers < 0 || o.stallRead < 0 || o.rcvbuf < 0:
		return nil, usagef("stall: -fill, -stallers, -stall-read and -rcvbuf must not be negative")
	case o.duration <= 0 || o.timeout <= 0 || o.probe <= 0 || o.settle < 0:
		return nil, usagef("stall: -duration, -timeout and -probe must be positive, -settle not negative")
	}
	return o, nil
}

// runStall runs the stalled-subscriber scenario: the store filled with
// -fill events, -stallers subscribers to every kind-1 event that read
// -stall-read bytes a second through a -rcvbuf receive buffer (and come
// back when cut), then -publishers honest clients publishing on a
// schedule while one honest subscriber, subscribed last, times each event
// from its write to its arrival.
func runStall(ctx context.Context, o *stallOpts) (*stallReport, error) {
	rep := &stallReport{
		Mode: "stall", URL: o.url,
		Params: map[string]any{
			"publishers": o.publishers, "rate": o.rate, "size": o.size, "fill": o.fill,
			"duration": o.duration.String(), "settle": o.settle.String(), "stallers": o.stallers,
			"stall_read": o.stallRead, "stall_filters": o.filters, "rcvbuf": o.rcvbuf, "reconnect": o.reconnect, "xff": o.xff,
		},
		Refused: map[string]int{}, StallerFails: map[string]int{}, HonestErrors: map[string]int{},
	}
	if err := fill(ctx, o.url, o.fill, o.size, o.xff, o.timeout); err != nil {
		return nil, err
	}
	perPub := int(math.Ceil(o.rate*o.duration.Seconds())) + 1
	evs, err := presign(&publishOpts{common: common{conns: o.publishers}, events: perPub * o.publishers, size: o.size, kind: 1})
	if err != nil {
		return nil, err
	}

	// The stallers, subscribed and settled before anything is measured.
	stop := make(chan struct{})
	var stallWG sync.WaitGroup
	var st stallerStats
	sd := &slowDialer{url: o.url, timeout: o.timeout, rcvbuf: o.rcvbuf, rate: o.stallRead}
	xff := ""
	if o.xff {
		xff = o.stallXFF
	}
	up := make(chan struct{}, o.stallers)
	for range o.stallers {
		stallWG.Add(1)
		go func() {
			defer stallWG.Done()
			staller(ctx, sd, xff, o, &st, up, stop)
		}()
	}
	for range o.stallers {
		select {
		case <-up:
		case <-time.After(o.timeout):
		}
	}
	if o.stallers > 0 {
		select {
		case <-time.After(o.settle):
		case <-ctx.Done():
		}
	}

	// The honest clients: xff addresses 10.0.0.1… for the publishers, the
	// next one for the subscriber.
	hd := newDialer(o.url, o.xff, o.timeout)
	var sent sync.Map // event id → time.Time of its write
	sub, _, err := hd.dial(ctx, o.publishers)
	if err != nil {
		close(stop)
		stallWG.Wait()
		return nil, fmt.Errorf("the honest subscriber: %w", err)
	}
	defer sub.Close()
	if err := subscribeLive(sub, o.timeout); err != nil {
		close(stop)
		stallWG.Wait()
		return nil, fmt.Errorf("the honest subscriber: %w", err)
	}
	pubs := make([]*websocket.Conn, o.publishers)
	for i := range pubs {
		c, _, err := hd.dial(ctx, i)
		if err != nil {
			close(stop)
			stallWG.Wait()
			return nil, fmt.Errorf("publisher %d: %w", i, err)
		}
		defer c.Close()
		pubs[i] = c
	}
	rep.HonestClients = o.publishers + 1

	var delivered deliveries
	subDone := make(chan struct{})
	go func() {
		defer close(subDone)
		readLive(sub, &sent, &delivered)
	}()

	start := time.Now()
	results := make([]*pubResult, o.publishers)
	var wg sync.WaitGroup
	for i, c := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = schedulePublish(ctx, c, evs[i], o, start, &sent)
		}()
	}
	wg.Wait()
	// Every honest event has been answered or given up on; the last ones
	// get -timeout to arrive at the subscriber.
	total := 0
	var lat []time.Duration
	for _, r := range results {
		total += r.sent
		lat = append(lat, r.lat...)
		rep.Unanswered += r.unanswered
		for k, v := range r.refused {
			rep.Refused[k] += v
		}
		for k, v := range r.errors {
			rep.HonestErrors[k] += v
		}
	}
	delivered.waitFor(total, o.timeout)
	rep.ElapsedS = time.Since(start).Seconds()
	close(stop)
	_ = sub.SetReadDeadline(time.Now())
	<-subDone
	stallWG.Wait()

	rep.Sent = total
	rep.Publish = summarize(lat)
	dl := delivered.latencies()
	rep.Delivery = summarize(dl)
	rep.Undelivered = max(0, total-len(dl))
	rep.StallersUp = int(st.up.Load())
	rep.StallerRead = st.read.Load()
	st.mu.Lock()
	rep.StallerCuts = len(st.cutAfter)
	rep.CutAfter = summarize(st.cutAfter)
	for k, v := range st.fails {
		rep.StallerFails[k] += v
	}
	st.mu.Unlock()
	return rep, nil
}

// stallerStats is what the stallers saw, across reconnections.
type stallerStats struct {
	up       atomic.Int64
	read     atomic.Int64
	mu       sync.Mutex
	cutAfter []time.Duration
	fails    map[string]int
}

// staller subscribes to every kind-1 event and reads at sd's rate until
// stop; when cut it comes back (o.reconnect). Its first subscription is
// reported on up.
func staller(ctx context.Context, sd *slowDialer, xff string, o *stallOpts, st *stallerStats, up chan<- struct{}, stop <-chan struct{}) {
	first := true
	filter, _ := parseFilter(`{"kinds":[1],"limit":1000}`)
	req := reqFrame("stall", filter, o.filters)
	liveReq := []byte(`["REQ","stall-live",{"kinds":[1],"limit":0}]`)
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		c, sc, err := sd.dial(ctx, xff)
		if err != nil {
			st.mu.Lock()
			if st.fails == nil {
				st.fails = map[string]int{}
			}
			st.fails[errKey(err)]++
			st.mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(o.redial):
			}
			continue
		}
		t0 := time.Now()
		// A live subscription first, whose EOSE comes at once, so that
		// the relay broadcasts to the staller while the stored set (req)
		// fills what waits for it.
		if err := c.WriteMessage(websocket.TextMessage, liveReq); err != nil {
			c.Close()
			continue
		}
		if err := c.WriteMessage(websocket.TextMessage, req); err != nil {
			c.Close()
			continue
		}
		st.up.Add(1)
		if first {
			first = false
			up <- struct{}{}
		}
		cut := make(chan time.Time, 2)
		end := make(chan struct{})
		if sd.rate > 0 {
			go func() {
				for {
					_, r, err := c.NextReader()
					if err != nil {
						cut <- time.Now()
						return
					}
					if _, err := io.Copy(io.Discard, r); err != nil {
						cut <- time.Now()
						return
					}
				}
			}()
		}
		go func() {
			if t := probeCut(c, o.probe, end); !t.IsZero() {
				cut <- t
			}
		}()
		select {
		case <-stop:
			close(end)
			st.read.Add(sc.read.Load())
			c.Close()
			return
		case t := <-cut:
			close(end)
			st.read.Add(sc.read.Load())
			c.Close()
			st.mu.Lock()
			st.cutAfter = append(st.cutAfter, t.Sub(t0))
			st.mu.Unlock()
			if !o.reconnect {
				<-stop
				return
			}
		}
	}
}

// subscribeLive opens the honest subscriber's subscription to new kind-1
// events and waits for its EOSE.
func subscribeLive(c *websocket.Conn, timeout time.Duration) error {
	if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","live",{"kinds":[1],"limit":0}]`)); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	for {
		_, b, err := c.ReadMessage()
		if err != nil {
			return fmt.Errorf("no EOSE: %w", err)
		}
		if isEvent(b) {
			continue
		}
		m, err := parseMessage(b)
		if err != nil {
			return err
		}
		switch m.label {
		case "EOSE":
			return nil
		case "CLOSED":
			return fmt.Errorf("subscription closed: %s", m.str(1))
		}
	}
}

// deliveries records the arrival latency of each honest event.
type deliveries struct {
	mu   sync.Mutex
	lat  []time.Duration
	seen map[string]bool
	more chan struct{} // a token when lat grew
}

func (d *deliveries) add(id string, lat time.Duration) {
	d.mu.Lock()
	if d.seen == nil {
		d.seen = map[string]bool{}
		d.more = make(chan struct{}, 1)
	}
	if !d.seen[id] {
		d.seen[id] = true
		d.lat = append(d.lat, lat)
	}
	more := d.more
	d.mu.Unlock()
	select {
	case more <- struct{}{}:
	default:
	}
}

func (d *deliveries) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.lat)
}

// waitFor waits until n events have arrived, or no new one for timeout.
func (d *deliveries) waitFor(n int, timeout time.Duration) {
	d.mu.Lock()
	if d.more == nil {
		d.seen = map[string]bool{}
		d.more = make(chan struct{}, 1)
	}
	more := d.more
	d.mu.Unlock()
	for d.count() < n {
		select {
		case <-more:
		case <-time.After(timeout):
			return
		}
	}
}

func (d *deliveries) latencies() []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Duration(nil), d.lat...)
}

// readLive reads the honest subscriber's events until its connection
// fails (or its read deadline is set to now), timing each honest one.
func readLive(c *websocket.Conn, sent *sync.Map, d *deliveries) {
	for {
		_, b, err := c.ReadMessage()
		if err != nil {
			return
		}
		now := time.Now()
		if !isEvent(b) {
			continue
		}
		var msg []json.RawMessage
		var ev struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(b, &msg) != nil || len(msg) != 3 || json.Unmarshal(msg[2], &ev) != nil {
			continue
		}
		if t, ok := sent.Load(ev.ID); ok {
			d.add(ev.ID, now.Sub(t.(time.Time)))
		}
	}
}

// pubResult is what one honest publisher measured.
type pubResult struct {
	sent, unanswered int
	lat              []time.Duration
	refused, errors  map[string]int
}

// schedulePublish sends evs on c on a schedule of o.rate a second from
// start for o.duration, whether or not the OKs have come (an open loop:
// a stall shows as latency, not as fewer samples), then waits up to
// o.timeout for the OKs still owed.
func schedulePublish(ctx context.Context, c *websocket.Conn, evs []signedEvent, o *stallOpts, start time.Time, sent *sync.Map) *pubResult {
	r := &pubResult{refused: map[string]int{}, errors: map[string]int{}}
	var mu sync.Mutex
	pending := map[string]time.Time{}
	writing := true
	drained := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				mu.Lock()
				if ctx.Err() == nil && (writing || len(pending) > 0) {
					r.errors["read: "+closeKey(err)]++
				}
				mu.Unlock()
				return
			}
			now := time.Now()
			if isEvent(b) {
				continue
			}
			m, err := parseMessage(b)
			if err != nil || m.label != "OK" {
				continue
			}
			mu.Lock()
			t, ok := pending[m.str(0)]
			if ok {
				delete(pending, m.str(0))
				var accepted bool
				if len(m.args) > 1 {
					_ = json.Unmarshal(m.args[1], &accepted)
				}
				if accepted {
					r.lat = append(r.lat, now.Sub(t))
				} else {
					r.refused[reasonPrefix(m.str(2))]++
				}
				if !writing && len(pending) == 0 {
					close(drained)
				}
			}
			mu.Unlock()
		}
	}()
	interval := time.Duration(float64(time.Second) / o.rate)
	end := start.Add(o.duration)
	for i, ev := range evs {
		due := start.Add(time.Duration(i) * interval)
		if !due.Before(end) || ctx.Err() != nil {
			break
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		now := time.Now()
		mu.Lock()
		pending[ev.id] = now
		mu.Unlock()
		sent.Store(ev.id, now)
		if err := c.WriteMessage(websocket.TextMessage, ev.frame); err != nil {
			r.errors["write: "+errKey(err)]++
			break
		}
		r.sent++
	}
	mu.Lock()
	writing = false
	if len(pending) == 0 {
		close(drained)
	}
	mu.Unlock()
	select {
	case <-drained:
	case <-readDone:
	case <-time.After(o.timeout):
	}
	mu.Lock()
	r.unanswered = len(pending)
	mu.Unlock()
	return r
}

func (r *stallReport) writeText(w io.Writer) {
	p := func(f string, a ...any) { fmt.Fprintf(w, f, a...) }
	p("sluice-load stall %s\n", r.URL)
	p("  params       %s\n", paramsText(r.Params))
	p("  honest       %d publishers + 1 subscriber, %d events sent in %.1fs\n", r.HonestClients-1, r.Sent, r.ElapsedS)
	l := r.Publish
	p("  publish OK   p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms  (%d OK true, %d unanswered, refused %v)\n",
		l.P50, l.P90, l.P99, l.Max, l.Count, r.Unanswered, r.Refused)
	l = r.Delivery
	p("  delivery     p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms  (%d delivered, %d not)\n",
		l.P50, l.P90, l.P99, l.Max, l.Count, r.Undelivered)
	l = r.CutAfter
	p("  stallers     %d subscriptions, %d cut (after p50 %.1fs, max %.1fs), %d bytes read, dial failures %v\n",
		r.StallersUp, r.StallerCuts, l.P50/1000, l.Max/1000, r.StallerRead, r.StallerFails)
	if len(r.HonestErrors) > 0 {
		p("  honest errors %v\n", r.HonestErrors)
	}
}
