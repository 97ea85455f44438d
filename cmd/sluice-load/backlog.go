package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

type backlogOpts struct {
	url     string
	xff     bool
	timeout time.Duration
	json    bool

	fill      int
	size      int
	read      int // bytes a second the client reads
	rcvbuf    int
	eventRate float64
	countRate float64
	eventSize int
	duration  time.Duration
	metrics   []string
	sample    time.Duration
	probe     time.Duration
	filter    string
	filters   int
}

// backlogReport is what the backlog mode measured: the client's frames
// and what the relay's processes held meanwhile.
type backlogReport struct {
	Mode   string         `json:"mode"`
	URL    string         `json:"url"`
	Params map[string]any `json:"params"`

	// EventsSent and CountsSent count the frames the client wrote (a
	// write that waits because the relay stopped reading it holds up the
	// next); OKs, Counts and Events what it read of the answers.
	EventsSent int   `json:"events_sent"`
	CountsSent int   `json:"counts_sent"`
	OKs        int   `json:"oks"`
	Counts     int   `json:"counts"`
	Events     int   `json:"events_received"`
	BytesRead  int64 `json:"bytes_read"`
	// Cut says whether the relay ended the connection, and CutAfterS when
	// (seconds after the REQ).
	Cut       bool    `json:"cut"`
	CutAfterS float64 `json:"cut_after_s,omitempty"`
	CutHow    string  `json:"cut_how,omitempty"`
	ElapsedS  float64 `json:"elapsed_s"`

	// Procs is each -metrics endpoint's goroutines and RSS over the run.
	Procs []*procSummary `json:"procs"`
}

func parseBacklog(args []string, stderr io.Writer) (*backlogOpts, error) {
	o := &backlogOpts{}
	var metrics string
	fs := newFlagSet("backlog", stderr)
	fs.StringVar(&o.url, "url", "", "relay `URL`, ws:// or wss:// (required)")
	fs.BoolVar(&o.xff, "xff", false, "give the fill's connections their own X-Forwarded-For")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "the longest wait for a dial")
	fs.BoolVar(&o.json, "json", false, "print the report as one JSON object")
	fs.IntVar(&o.fill, "fill", 1000, "events stored before the client subscribes (its REQ's result)")
	fs.IntVar(&o.size, "size", 3000, "content size of each stored event in `bytes`")
	fs.IntVar(&o.read, "read", 16000, "bytes a second the client reads")
	fs.IntVar(&o.rcvbuf, "rcvbuf", 0, "SO_RCVBUF of the client in `bytes` (0: the kernel's default)")
	fs.Float64Var(&o.eventRate, "event-rate", 2, "EVENTs a second the client sends")
	fs.Float64Var(&o.countRate, "count-rate", 10, "COUNTs a second the client sends")
	fs.IntVar(&o.eventSize, "event-size", 100, "content size of the client's own events in `bytes`")
	fs.DurationVar(&o.duration, "duration", 150*time.Second, "how long the client sends")
	fs.StringVar(&metrics, "metrics", "", "comma-separated Prometheus `URLs` (go_goroutines, process_resident_memory_bytes) to sample")
	fs.DurationVar(&o.sample, "sample", 10*time.Second, "how often the metrics are sampled")
	fs.DurationVar(&o.probe, "probe", time.Second, "how often the client pings to find out whether it was cut")
	fs.StringVar(&o.filter, "filter", `{"kinds":[1],"limit":1000}`, "the client's REQ filter, a JSON object")
	fs.IntVar(&o.filters, "filters", 1, "copies of -filter in the client's REQ (2: ~6 MB, past a 4 MiB queue)")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if err := checkURL("backlog", o.url); err != nil {
		return nil, err
	}
	for _, m := range strings.Split(metrics, ",") {
		if m = strings.TrimSpace(m); m != "" {
			o.metrics = append(o.metrics, m)
		}
	}
	f, err := parseFilter(o.filter)
	if err != nil {
		return nil, usagef("backlog: %v", err)
	}
	o.filter = string(f)
	switch {
	case o.fill < 0 || o.size < 0 || o.rcvbuf < 0 || o.eventSize < 0:
		return nil, usagef("backlog: -fill, -size, -rcvbuf and -event-size must not be negative")
	case o.filters < 1:
		return nil, usagef("backlog: -filters must be at least 1, got %d", o.filters)
	case o.read < 1:
		return nil, usagef("backlog: -read must be at least 1 byte a second, got %d", o.read)
	case o.eventRate < 0 || o.countRate < 0 || o.eventRate+o.countRate == 0:
		return nil, usagef("backlog: -event-rate and -count-rate must not be negative, nor both 0")
	case o.duration <= 0 || o.timeout <= 0 || o.sample <= 0 || o.probe <= 0:
		return nil, usagef("backlog: -duration, -timeout, -sample and -probe must be positive")
	}
	return o, nil
}

// runBacklog runs the backlog scenario: one client asks for the whole
// stored set (-fill events) and stays subscribed, reads at -read bytes a
// second so that what the relay owes it stays behind, and meanwhile sends
// EVENTs and COUNTs at their rates for -duration; every -metrics endpoint
// is sampled throughout.
func runBacklog(ctx context.Context, o *backlogOpts) (*backlogReport, error) {
	rep := &backlogReport{
		Mode: "backlog", URL: o.url,
		Params: map[string]any{
			"fill": o.fill, "size": o.size, "read": o.read, "rcvbuf": o.rcvbuf, "event_rate": o.eventRate,
			"count_rate": o.countRate, "event_size": o.eventSize, "duration": o.duration.String(), "filter": o.filter, "filters": o.filters,
		},
	}
	if err := fill(ctx, o.url, o.fill, o.size, o.xff, o.timeout); err != nil {
		return nil, err
	}
	nEvents := int(o.eventRate*o.duration.Seconds()) + 1
	evs, err := presign(&publishOpts{common: common{conns: 1}, events: nEvents, size: o.eventSize, kind: 1})
	if err != nil {
		return nil, err
	}
	sd := &slowDialer{url: o.url, timeout: o.timeout, rcvbuf: o.rcvbuf, rate: o.read}
	xff := ""
	if o.xff {
		xff = "10.255.255.253"
	}
	c, sc, err := sd.dial(ctx, xff)
	if err != nil {
		return nil, fmt.Errorf("the client: %w", err)
	}
	defer c.Close()

	start := time.Now()
	stop := make(chan struct{})
	samplers := make([]*sampler, len(o.metrics))
	var swg sync.WaitGroup
	for i, u := range o.metrics {
		samplers[i] = &sampler{}
		swg.Add(1)
		go func() {
			defer swg.Done()
			samplers[i].run(ctx, u, start, o.sample, stop)
		}()
	}

	if err := c.WriteMessage(websocket.TextMessage, reqFrame("backlog", json.RawMessage(o.filter), o.filters)); err != nil {
		close(stop)
		swg.Wait()
		return nil, fmt.Errorf("the client's REQ: %w", err)
	}
	var oks, counts, events atomic.Int64
	cut := make(chan cutEvent, 2)
	go func() {
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				cut <- cutEvent{time.Now(), "read: " + closeKey(err)}
				return
			}
			if isEvent(b) {
				events.Add(1)
				continue
			}
			if m, err := parseMessage(b); err == nil {
				switch m.label {
				case "OK":
					oks.Add(1)
				case "COUNT":
					counts.Add(1)
				}
			}
		}
	}()
	probeEnd := make(chan struct{})
	go func() {
		if t := probeCut(c, o.probe, probeEnd); !t.IsZero() {
			cut <- cutEvent{t, "probe: the relay closed the socket"}
		}
	}()

	// The sender: EVENTs and COUNTs on their own schedules, one writer.
	var eventsSent, countsSent int
	var nextEv, nextCount time.Time = start, start
	evInterval := rateInterval(o.eventRate)
	countInterval := rateInterval(o.countRate)
	end := start.Add(o.duration)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var how string
	var at time.Time
send:
	for {
		due := end
		if evInterval > 0 && nextEv.Before(due) {
			due = nextEv
		}
		if countInterval > 0 && nextCount.Before(due) {
			due = nextCount
		}
		timer.Reset(time.Until(due))
		select {
		case <-ctx.Done():
			break send
		case e := <-cut:
			at, how = e.at, e.how
			break send
		case <-timer.C:
		}
		now := time.Now()
		if !now.Before(end) {
			break
		}
		_ = c.SetWriteDeadline(end)
		var err error
		switch {
		case evInterval > 0 && !now.Before(nextEv) && eventsSent < len(evs[0]):
			err = c.WriteMessage(websocket.TextMessage, evs[0][eventsSent].frame)
			if err == nil {
				eventsSent++
			}
			nextEv = nextEv.Add(evInterval)
		case countInterval > 0 && !now.Before(nextCount):
			err = c.WriteMessage(websocket.TextMessage, []byte(`["COUNT","n`+strconv.Itoa(countsSent)+`",{"kinds":[1]}]`))
			if err == nil {
				countsSent++
			}
			nextCount = nextCount.Add(countInterval)
		default:
			nextEv = nextEv.Add(evInterval)
		}
		if err != nil && time.Now().Before(end) {
			select {
			case e := <-cut:
				at, how = e.at, e.how
			case <-time.After(2 * o.probe):
				at, how = time.Now(), "write: "+errKey(err)
			}
			break
		}
	}
	rep.ElapsedS = time.Since(start).Seconds()
	close(probeEnd)
	close(stop)
	swg.Wait()
	if how != "" {
		rep.Cut, rep.CutHow, rep.CutAfterS = true, how, at.Sub(start).Seconds()
	}
	rep.EventsSent, rep.CountsSent = eventsSent, countsSent
	rep.OKs, rep.Counts, rep.Events = int(oks.Load()), int(counts.Load()), int(events.Load())
	rep.BytesRead = sc.read.Load()
	for i, u := range o.metrics {
		rep.Procs = append(rep.Procs, samplers[i].summary(u))
	}
	return rep, nil
}

// cutEvent is how and when a client found itself cut.
type cutEvent struct {
	at  time.Time
	how string
}

// rateInterval is the time between two sends at rate a second (0: none).
func rateInterval(rate float64) time.Duration {
	if rate <= 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / rate)
}

func (r *backlogReport) writeText(w io.Writer) {
	p := func(f string, a ...any) { fmt.Fprintf(w, f, a...) }
	p("sluice-load backlog %s\n", r.URL)
	p("  params       %s\n", paramsText(r.Params))
	p("  sent         %d EVENTs, %d COUNTs in %.1fs\n", r.EventsSent, r.CountsSent, r.ElapsedS)
	p("  read         %d OKs, %d COUNTs, %d events, %d bytes\n", r.OKs, r.Counts, r.Events, r.BytesRead)
	if r.Cut {
		p("  cut          after %.1fs (%s)\n", r.CutAfterS, r.CutHow)
	} else {
		p("  cut          no\n")
	}
	for _, pr := range r.Procs {
		pr.writeText(w, "process")
		p("               %s\n", pr.URL)
	}
}
