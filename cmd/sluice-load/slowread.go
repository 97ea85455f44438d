package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

type slowreadOpts struct {
	url     string
	xff     bool
	timeout time.Duration
	json    bool

	fill     int
	size     int
	read     int
	rcvbuf   int
	filter   string
	duration time.Duration
	probe    time.Duration
}

// slowreadReport is what the slowread mode measured: whether a client
// reading its REQ's result at a steady, slow rate got all of it.
type slowreadReport struct {
	Mode   string         `json:"mode"`
	URL    string         `json:"url"`
	Params map[string]any `json:"params"`

	Events    int   `json:"events_received"`
	BytesRead int64 `json:"bytes_read"`
	// EOSE says whether the whole result was read, and EOSEAfterS when.
	EOSE       bool    `json:"eose"`
	EOSEAfterS float64 `json:"eose_after_s,omitempty"`
	// Cut says whether the relay ended the connection first, CutAfterS
	// when (seconds after the REQ), and CutHow how the client found out.
	Cut       bool    `json:"cut"`
	CutAfterS float64 `json:"cut_after_s,omitempty"`
	CutHow    string  `json:"cut_how,omitempty"`
	// ElapsedS is how long the client read: to its EOSE, its cut or
	// -duration.
	ElapsedS float64 `json:"elapsed_s"`
}

func parseSlowread(args []string, stderr io.Writer) (*slowreadOpts, error) {
	o := &slowreadOpts{}
	fs := newFlagSet("slowread", stderr)
	fs.StringVar(&o.url, "url", "", "relay `URL`, ws:// or wss:// (required)")
	fs.BoolVar(&o.xff, "xff", false, "give the fill's connections their own X-Forwarded-For")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "the longest wait for a dial")
	fs.BoolVar(&o.json, "json", false, "print the report as one JSON object")
	fs.IntVar(&o.fill, "fill", 1000, "events stored before the client subscribes")
	fs.IntVar(&o.size, "size", 3000, "content size of each stored event in `bytes`")
	fs.IntVar(&o.read, "read", 16000, "bytes a second the client reads")
	fs.IntVar(&o.rcvbuf, "rcvbuf", 0, "SO_RCVBUF of the client in `bytes` (0: the kernel's default)")
	fs.StringVar(&o.filter, "filter", `{"kinds":[1],"limit":1000}`, "the client's REQ filter, a JSON object")
	fs.DurationVar(&o.duration, "duration", 0, "stop reading after this long (0: at the EOSE or the cut)")
	fs.DurationVar(&o.probe, "probe", time.Second, "how often the client pings to find out whether it was cut")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if err := checkURL("slowread", o.url); err != nil {
		return nil, err
	}
	f, err := parseFilter(o.filter)
	if err != nil {
		return nil, usagef("slowread: %v", err)
	}
	o.filter = string(f)
	switch {
	case o.fill < 0 || o.size < 0 || o.rcvbuf < 0:
		return nil, usagef("slowread: -fill, -size and -rcvbuf must not be negative")
	case o.read < 1:
		return nil, usagef("slowread: -read must be at least 1 byte a second, got %d", o.read)
	case o.duration < 0 || o.timeout <= 0 || o.probe <= 0:
		return nil, usagef("slowread: -duration must not be negative, -timeout and -probe must be positive")
	}
	return o, nil
}

// runSlowread runs the slowest-steady-reader scenario: the store filled
// with -fill events, one client sends one REQ and reads its result at
// -read bytes a second, until its EOSE, its cut or -duration.
func runSlowread(ctx context.Context, o *slowreadOpts) (*slowreadReport, error) {
	rep := &slowreadReport{
		Mode: "slowread", URL: o.url,
		Params: map[string]any{"fill": o.fill, "size": o.size, "read": o.read, "rcvbuf": o.rcvbuf, "filter": o.filter, "duration": o.duration.String()},
	}
	if err := fill(ctx, o.url, o.fill, o.size, o.xff, o.timeout); err != nil {
		return nil, err
	}
	sd := &slowDialer{url: o.url, timeout: o.timeout, rcvbuf: o.rcvbuf, rate: o.read}
	xff := ""
	if o.xff {
		xff = "10.255.255.252"
	}
	c, sc, err := sd.dial(ctx, xff)
	if err != nil {
		return nil, fmt.Errorf("the client: %w", err)
	}
	defer c.Close()
	start := time.Now()
	if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","slow",`+o.filter+`]`)); err != nil {
		return nil, fmt.Errorf("the client's REQ: %w", err)
	}
	eose := make(chan time.Time, 1)
	cut := make(chan cutEvent, 2)
	events := 0 // the reader's until it sends on eose or cut
	go func() {
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				cut <- cutEvent{time.Now(), "read: " + closeKey(err)}
				return
			}
			if isEvent(b) {
				events++
				continue
			}
			if m, err := parseMessage(b); err == nil {
				switch m.label {
				case "EOSE":
					eose <- time.Now()
					return
				case "CLOSED":
					cut <- cutEvent{time.Now(), "CLOSED " + m.str(1)}
					return
				}
			}
		}
	}()
	probeEnd := make(chan struct{})
	defer close(probeEnd)
	go func() {
		if t := probeCut(c, o.probe, probeEnd); !t.IsZero() {
			cut <- cutEvent{t, "probe: the relay closed the socket"}
		}
	}()
	var limit <-chan time.Time
	if o.duration > 0 {
		tm := time.NewTimer(o.duration)
		defer tm.Stop()
		limit = tm.C
	}
	select {
	case t := <-eose:
		rep.EOSE, rep.EOSEAfterS = true, t.Sub(start).Seconds()
		rep.Events = events
	case e := <-cut:
		rep.Cut, rep.CutAfterS, rep.CutHow = true, e.at.Sub(start).Seconds(), e.how
		// The reader may still be reading; its count is not read here.
		rep.Events = -1
		if !strings.HasPrefix(e.how, "probe") {
			rep.Events = events
		}
	case <-limit:
		rep.Events = -1
	case <-ctx.Done():
		rep.Events = -1
	}
	rep.ElapsedS = time.Since(start).Seconds()
	rep.BytesRead = sc.read.Load()
	return rep, nil
}

func (r *slowreadReport) writeText(w io.Writer) {
	p := func(f string, a ...any) { fmt.Fprintf(w, f, a...) }
	p("sluice-load slowread %s\n", r.URL)
	p("  params       %s\n", paramsText(r.Params))
	p("  read         %d bytes in %.1fs (%.0f B/s)", r.BytesRead, r.ElapsedS, float64(r.BytesRead)/max(r.ElapsedS, 1e-9))
	if r.Events >= 0 {
		p(", %d events", r.Events)
	}
	p("\n")
	switch {
	case r.EOSE:
		p("  result       whole: EOSE after %.1fs, not cut\n", r.EOSEAfterS)
	case r.Cut:
		p("  result       CUT after %.1fs (%s)\n", r.CutAfterS, r.CutHow)
	default:
		p("  result       not cut within %.1fs (stopped reading before the EOSE)\n", r.ElapsedS)
	}
}
