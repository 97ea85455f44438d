package relay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

const (
	idHex = testID
	pkHex = "6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93"
)

func TestPendingBounded(t *testing.T) {
	var p pending
	idOf := func(i int) hex32 { var h hex32; h[0], h[1] = byte(i), byte(i>>8); return h }
	for i := 0; i < 3*maxPending; i++ {
		p.add(idOf(i), pendingEvent{actor: "actor"})
	}
	if n := p.len(); n != maxPending {
		t.Fatalf("pending holds %d ids, want the bound %d", n, maxPending)
	}
	if _, ok := p.take(idOf(0)); ok {
		t.Error("oldest id survived eviction")
	}
	if a, ok := p.take(idOf(3*maxPending - 1)); !ok || a.actor != "actor" {
		t.Error("newest id lost")
	}
	if _, ok := p.take(idOf(3*maxPending - 1)); ok {
		t.Error("id taken twice")
	}
	// An id taken and added again keeps its new slot when its old slot is
	// overwritten.
	var q pending
	q.add(idOf(1000), pendingEvent{actor: "a"})
	q.take(idOf(1000))
	for i := 0; i < maxPending-1; i++ {
		q.add(idOf(i), pendingEvent{actor: "x"})
	}
	q.add(idOf(1000), pendingEvent{actor: "b"}) // the ring wraps: slot 0 next
	q.add(idOf(2000), pendingEvent{actor: "y"}) // evicts slot 0, which once held 1000
	if a, ok := q.take(idOf(1000)); !ok || a.actor != "b" {
		t.Errorf("re-added id evicted with its old slot: %q %v", a.actor, ok)
	}
}

func TestNewValidatesLimits(t *testing.T) {
	l := policy.DefaultLimits()
	l.Message[wire.TypeREQ] = []ratelimit.Limit{{Rate: 1, Period: time.Second}}
	_, err := New(Options{Policy: policy.Config{Limits: &l}})
	if !errors.Is(err, ratelimit.ErrInvalidLimit) || !hasFieldError(err, "Policy.Limits.Message[REQ][0]") {
		t.Fatalf("New with REQ rate 1 cost 1: err = %v, want ErrInvalidLimit naming REQ", err)
	}
	l = policy.Limits{Connection: []ratelimit.Limit{{Rate: 5}}}
	if _, err := New(Options{Policy: policy.Config{Limits: &l}}); !errors.Is(err, ratelimit.ErrInvalidLimit) || !hasFieldError(err, "Policy.Limits.Connection[0]") {
		t.Fatalf("New with a zero connection period: err = %v", err)
	}
	// Two windows of one period would share a store key; more than
	// MaxWindows would leave the memory store's allocation-free path.
	l = policy.DefaultLimits()
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(5, time.Second), ratelimit.PerPeriod(9, 1000*time.Millisecond)}
	if _, err := New(Options{Policy: policy.Config{Limits: &l}}); !errors.Is(err, ratelimit.ErrInvalidLimit) || !hasFieldError(err, "Policy.Limits.Message[REQ][1]") {
		t.Fatalf("New with two REQ windows of one period: err = %v, want ErrInvalidLimit naming REQ", err)
	}
	l = policy.DefaultLimits()
	for i := range ratelimit.MaxWindows + 1 {
		l.Connection = append(l.Connection, ratelimit.PerPeriod(5, time.Duration(i+1)*time.Second))
	}
	if _, err := New(Options{Policy: policy.Config{Limits: &l}}); !errors.Is(err, ratelimit.ErrInvalidLimit) || !hasFieldError(err, fmt.Sprintf("Policy.Limits.Connection[%d]", ratelimit.MaxWindows)) {
		t.Fatalf("New with %d connection windows: err = %v, want ErrInvalidLimit", ratelimit.MaxWindows+1, err)
	}
	d := policy.DefaultLimits()
	if err := (&policy.Config{Limits: &d}).Validate(); err != nil {
		t.Fatalf("DefaultLimits invalid: %v", err)
	}
	if len(d.Message[wire.TypeCLOSE]) != 0 || len(d.Message[wire.TypeOther]) == 0 {
		t.Error("CLOSE must be free and OTHER limited by default")
	}
}

// A frame bound the gate could never apply is refused at construction.
func TestNewValidatesFrameSize(t *testing.T) {
	for _, n := range []int{-1, defaultReadLimit + 1} {
		var fs [wire.NumTypes]int
		fs[wire.TypeREQ] = n
		if _, err := New(Options{FrameSize: fs}); !hasFieldError(err, "FrameSize[REQ]") {
			t.Errorf("FrameSize[REQ] %d: %v, want a FieldError for FrameSize[REQ]", n, err)
		}
	}
}

// A queue bound below the backlog at which a client counts as behind
// would cut it before it is ever held back: refused, the field named.
func TestNewValidatesQueueBytes(t *testing.T) {
	for _, n := range []int{-1, 1, minQueueBytes - 1} {
		if _, err := New(Options{QueueBytes: n}); !hasFieldError(err, "QueueBytes") {
			t.Errorf("QueueBytes %d: %v, want a FieldError for QueueBytes", n, err)
		}
	}
	for _, n := range []int{0, minQueueBytes} {
		o := Options{QueueBytes: n}
		if err := o.Validate(); err != nil {
			t.Errorf("QueueBytes %d: %v", n, err)
		}
	}
}

// Options.Validate reports every bad field at once, a Policy's under
// "Policy.", each with the library's own error.
func TestOptionsValidateJoinsEveryField(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeREQ] = []ratelimit.Limit{{Rate: 1, Period: time.Second}}
	var fs [wire.NumTypes]int
	fs[wire.TypeAUTH] = -1
	o := Options{Policy: policy.Config{Limits: &l, Tiers: []policy.Tier{{Name: "t"}}}, FrameSize: fs, QueueBytes: 1}
	err := o.Validate()
	for _, path := range []string{"Policy.Limits.Message[REQ][0]", "RelayURL", "FrameSize[AUTH]", "QueueBytes"} {
		if !hasFieldError(err, path) {
			t.Errorf("no FieldError for %s in %v", path, err)
		}
	}
	if !errors.Is(err, ratelimit.ErrInvalidLimit) {
		t.Errorf("%v does not wrap ratelimit.ErrInvalidLimit", err)
	}
	if _, nerr := New(o); nerr == nil || nerr.Error() != err.Error() {
		t.Errorf("New: %v, want Validate's error", nerr)
	}
}

// hasFieldError reports whether err holds a *policy.FieldError for path.
func hasFieldError(err error, path string) bool {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else if err != nil {
		errs = []error{err}
	}
	for _, e := range errs {
		if fe, ok := e.(*policy.FieldError); ok && fe.Path == path {
			return true
		}
	}
	return false
}

func TestProxyRejectsBadURL(t *testing.T) {
	g, err := New(Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"http://example.com", "ws://", "::", "example.com"} {
		if _, err := g.Proxy(u); !errors.Is(err, errUpstream) {
			t.Errorf("Proxy(%q) err = %v, want errUpstream", u, err)
		}
	}
}

func TestOutcomeString(t *testing.T) {
	seen := map[string]bool{}
	for o := policy.Outcome(0); o <= policy.Unmatched; o++ {
		s := o.String()
		if s == "" || s == "unknown" || seen[s] {
			t.Errorf("Outcome(%d).String() = %q", o, s)
		}
		seen[s] = true
	}
}

// serve starts an httptest server for h and returns its ws:// URL.
func serve(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// pipeNet is an in-memory network for tests inside a testing/synctest
// bubble: each dial is a net.Pipe, whose reads, writes and deadlines block
// durably and run on the bubble's clock, so the gate's timers (settling,
// draining, write timeouts) can be driven without a real socket or a
// sleep. A pipe has no file descriptor, so the tap writes everything
// through its queue, as on a connection without one.
type pipeNet struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	port  atomic.Int32
}

// servePipe serves h on a new pipeNet and returns it with a ws:// URL for
// its dial; the server closes at cleanup.
func servePipe(t testing.TB, h http.Handler) (*pipeNet, string) {
	t.Helper()
	pn := &pipeNet{conns: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(pn) }()
	t.Cleanup(func() { _ = srv.Close() })
	return pn, "ws://127.0.0.1:7777"
}

// pipeConn is one end of a pipe with the addresses of a loopback TCP
// connection, which the gate's identity reads.
type pipeConn struct {
	net.Conn
	local, remote net.Addr
}

func (c pipeConn) LocalAddr() net.Addr  { return c.local }
func (c pipeConn) RemoteAddr() net.Addr { return c.remote }

// dial connects to the server: its end is accepted, the client's returned.
func (pn *pipeNet) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	cl, sv := net.Pipe()
	srvAddr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7777}
	cliAddr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000 + int(pn.port.Add(1))}
	select {
	case pn.conns <- pipeConn{sv, srvAddr, cliAddr}:
		return pipeConn{cl, cliAddr, srvAddr}, nil
	case <-pn.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// dialWS opens a WebSocket to the server, closed at cleanup.
func (pn *pipeNet) dialWS(t testing.TB, url string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{NetDialContext: pn.dial, HandshakeTimeout: 5 * time.Second}
	c, _, err := d.Dial(url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Accept implements net.Listener.
func (pn *pipeNet) Accept() (net.Conn, error) {
	select {
	case c := <-pn.conns:
		return c, nil
	case <-pn.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (pn *pipeNet) Close() error {
	pn.once.Do(func() { close(pn.done) })
	return nil
}

// Addr implements net.Listener.
func (pn *pipeNet) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7777} }

// serveSelf serves the handler build makes of a new gate with opts, and
// returns the URL it is served at, which is also the gate's RelayURL
// unless opts names one: a policy that grants by NIP-42 pubkey needs one
// (ErrNoRelayURL), and AUTHs signed for that URL name this relay.
func serveSelf(t testing.TB, opts Options, build func(*Gate) http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	url := "ws://" + srv.Listener.Addr().String()
	if opts.RelayURL == "" {
		opts.RelayURL = url
	}
	srv.Config.Handler = build(newGate(t, opts))
	srv.Start()
	t.Cleanup(srv.Close)
	return url
}

// newGate returns a gate whose Shutdown runs at cleanup.
func newGate(t testing.TB, opts Options) *Gate {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	g, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := g.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return g
}

// memLimiter returns a limiter over a memory store on clock c.
func memLimiter(c *nostrtest.Clock) *ratelimit.Limiter {
	return ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), c.Now)
}

// The refusal on the wire: the OK carries the event id exactly as sent,
// and nothing reaches the relay.
func TestGateRefusalWire(t *testing.T) {
	clk := nostrtest.NewClock()
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.6, time.Second)}
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(1.6, time.Second)}
	rec := newRecorder()
	var mu sync.Mutex
	seen := map[string]int{}
	var open atomic.Int64
	obs := &policy.Observer{
		Frame: func(_ string, ty wire.Type, o policy.Outcome) {
			mu.Lock()
			seen[ty.String()+" "+o.String()]++
			mu.Unlock()
		},
		Open: func(d int) { open.Add(int64(d)) },
	}
	g := newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &l}, Observer: obs})
	c := dialRaw(t, serve(t, g.Wrap(rec)))

	frames := []string{
		`["EVENT",` + goNostrEvent + `]`,
		` [ "\u0045VENT" , { "id" : "` + idHex + `" } ]`,
		`["REQ","a",{}]`,
		`["REQ","b\"",{}]`,
	}
	for _, f := range frames {
		if err := c.WriteMessage(websocket.TextMessage, []byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		`["OK","` + idHex + `",false,"rate-limited: slow down; retry in 1s"]`,
		`["CLOSED","b\"","rate-limited: slow down; retry in 1s"]`,
	}
	for _, w := range want {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, got, err := c.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != w {
			t.Errorf("reply %s, want %s", got, w)
		}
	}
	if got := rec.frames(2); got[0] != frames[0] || got[1] != frames[2] {
		t.Errorf("relay got %q, want only the admitted frames", got)
	}
	mu.Lock()
	wantSeen := map[string]int{"EVENT admitted": 1, "EVENT rate_limited": 1, "REQ admitted": 1, "REQ rate_limited": 1}
	if fmt.Sprint(seen) != fmt.Sprint(wantSeen) {
		t.Errorf("observer saw %v, want %v", seen, wantSeen)
	}
	mu.Unlock()
	if n := open.Load(); n != 1 {
		t.Errorf("observer counts %d open connections, want 1", n)
	}
	c.Close()
	for i := 0; i < 200 && open.Load() != 0; i++ {
		time.Sleep(10 * time.Millisecond) // polls, up to 2 s: the gate sees the real socket's close on its own goroutine
	}
	if n := open.Load(); n != 0 {
		t.Errorf("observer counts %d open connections after close, want 0", n)
	}
}

// (g) connection limit and store outage on upgrade.
func TestGateConnectionLimit(t *testing.T) {
	clk := nostrtest.NewClock()
	store := &nostrtest.OutageStore{Store: ratelimit.NewMemoryStore(0)}
	l := policy.Limits{Connection: []ratelimit.Limit{ratelimit.PerPeriod(2, 10*time.Second)}}
	var outcomes [policy.Unmatched + 1]atomic.Int64
	obs := &policy.Observer{Connection: func(_ string, o policy.Outcome) { outcomes[o].Add(1) }}
	g := newGate(t, Options{
		Limiter:  ratelimit.NewLimiter(store, clk.Now),
		Policy:   policy.Config{Limits: &l},
		Observer: obs,
	})
	url := serve(t, g.Wrap(newRecorder()))
	for range 2 {
		dialRaw(t, url)
	}
	_, resp, err := websocket.DefaultDialer.Dial(url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third connection: err %v resp %v, want 429", err, resp)
	}
	// Two at rest under 2/10s: the third waits 10s·log2(2/1) = 10s.
	if ra := resp.Header.Get("Retry-After"); ra != "10" {
		t.Errorf("Retry-After = %q, want 10", ra)
	}

	// Past the wait the limiter must ask the store again (it answers a
	// known-blocked client locally until then).
	clk.Advance(11 * time.Second)
	store.Down.Store(true)
	_, resp, err = websocket.DefaultDialer.Dial(url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("store down: err %v resp %v, want 503", err, resp)
	}
	body, _ := io.ReadAll(resp.Body)
	if strings.TrimSpace(string(body)) != scan.ReasonUnavailable {
		t.Errorf("503 body %q, want %q", body, scan.ReasonUnavailable)
	}
	if outcomes[policy.Admitted].Load() != 2 || outcomes[policy.RateLimited].Load() != 1 || outcomes[policy.Unavailable].Load() != 1 {
		t.Errorf("observer saw admitted %d, rate-limited %d, unavailable %d; want 2, 1, 1",
			outcomes[policy.Admitted].Load(), outcomes[policy.RateLimited].Load(), outcomes[policy.Unavailable].Load())
	}
}

// recorder is an upstream WebSocket endpoint that records what it
// receives, obeys the commands of recorderCmd (echo, bye, stall, flood),
// and remembers the forwarding headers it was given. Its commands
// are shaped as Nostr messages, since the gate forwards nothing else.
type recorder struct {
	// answerOK, when set, makes the recorder answer every EVENT and AUTH
	// with ["OK",id,answerOK(id),""], as a relay would.
	answerOK func(id hex32) bool
	// okReason, when set, gives the reason of those OKs.
	okReason func(id hex32) string
	// discard keeps nothing of what arrives (benchmarks).
	discard bool
	// challenge, when set, is sent as ["AUTH",challenge] on every
	// connection (NIP-42), as sluice relay does.
	challenge string
	// eose makes the recorder answer every REQ with ["EOSE",<id>] (and
	// every COUNT with a count of 0), as a
	// NIP-01 relay does (after the command's answer, for a command).
	eose bool

	mu       sync.Mutex
	closes   []int // close codes received
	got      []string
	types    []int
	hdr      http.Header // of the WebSocket handshake
	plainHdr http.Header // of the last plain HTTP request
	remote   string
	cond     *sync.Cond
}

func newRecorder() *recorder {
	r := &recorder{}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !websocket.IsWebSocketUpgrade(r) {
		rec.mu.Lock()
		rec.plainHdr = r.Header.Clone()
		rec.mu.Unlock()
		fmt.Fprint(w, "plain http")
		return
	}
	// Recorded before the handshake completes, so a client whose dial
	// returned can read it.
	rec.mu.Lock()
	rec.hdr, rec.remote = r.Header.Clone(), r.RemoteAddr
	rec.mu.Unlock()
	up := websocket.Upgrader{}
	c, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer c.Close()
	if rec.challenge != "" {
		_ = c.WriteMessage(websocket.TextMessage, []byte(`["AUTH","`+rec.challenge+`"]`))
	}
	for {
		typ, data, err := c.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				rec.mu.Lock()
				rec.closes = append(rec.closes, ce.Code)
				rec.cond.Broadcast()
				rec.mu.Unlock()
			}
			return
		}
		if !rec.discard {
			rec.mu.Lock()
			rec.got = append(rec.got, string(data))
			rec.types = append(rec.types, typ)
			rec.cond.Broadcast()
			rec.mu.Unlock()
		}
		cmd, arg := recorderCommand(data)
		var eose []byte
		if rec.eose {
			switch f, reason := scan.Scan(data, nil); {
			case reason == "" && scan.Peek(data).Type == wire.TypeREQ:
				eose = []byte(`["EOSE",` + string(f.SubID) + `]`)
			case reason == "" && scan.Peek(data).Type == wire.TypeCOUNT:
				eose = []byte(`["COUNT",` + string(f.SubID) + `,{"count":0}]`)
			}
		}
		switch {
		case cmd == "bye": // close 4000, after arg's frame if any
			if arg != "" {
				_ = c.WriteMessage(websocket.TextMessage, []byte(arg))
			}
			_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(4000, "bye"))
			return
		case cmd == "echo": // answer arg
			_ = c.WriteMessage(websocket.TextMessage, []byte(arg))
		case cmd == "echo-behind": // answer arg after a NOTICE of 256 KiB
			_ = c.WriteMessage(websocket.TextMessage, []byte(`["NOTICE","`+strings.Repeat("x", 256<<10)+`"]`))
			_ = c.WriteMessage(websocket.TextMessage, []byte(arg))
		case cmd == "echo-binary":
			_ = c.WriteMessage(websocket.BinaryMessage, []byte(arg))
		case cmd == "stall": // stop reading: no pongs, nothing
			<-r.Context().Done()
			return
		case cmd == "burst": // 8 MiB in 64 KiB binary frames, then nothing
			big := make([]byte, 64<<10)
			for range 128 {
				if c.WriteMessage(websocket.BinaryMessage, big) != nil {
					return
				}
			}
		case cmd == "flood":
			big := make([]byte, 64<<10)
			for {
				if err := c.WriteMessage(websocket.BinaryMessage, big); err != nil {
					rec.mu.Lock()
					rec.closes = append(rec.closes, floodCut)
					rec.cond.Broadcast()
					rec.mu.Unlock()
					return
				}
			}
		case rec.answerOK != nil:
			if f, reason := scan.Scan(data, nil); reason == "" && (scan.Peek(data).Type == wire.TypeEVENT || scan.Peek(data).Type == wire.TypeAUTH) {
				id := f.Event.ID
				reason := ""
				if rec.okReason != nil {
					reason = rec.okReason(id)
				}
				reply := fmt.Sprintf(`["OK","%x",%v,"%s"]`, id[:], rec.answerOK(id), reason)
				_ = c.WriteMessage(websocket.TextMessage, []byte(reply))
			}
		}
		if eose != nil {
			_ = c.WriteMessage(websocket.TextMessage, eose)
		}
	}
}

// recorderCmd returns the recorder's command of a frame: a REQ whose sub id
// names the command and whose one filter's search string is its argument,
// as recorderCmd builds it (the gate forwards only canonical frames).
func recorderCommand(frame []byte) (cmd, arg string) {
	var req struct {
		label, sub string
		filter     struct{ Search string }
	}
	var elems []json.RawMessage
	if json.Unmarshal(frame, &elems) != nil || len(elems) != 3 {
		return "", ""
	}
	if json.Unmarshal(elems[0], &req.label) != nil || req.label != "REQ" || json.Unmarshal(elems[1], &req.sub) != nil {
		return "", ""
	}
	_ = json.Unmarshal(elems[2], &req.filter)
	return req.sub, req.filter.Search
}

// recorderCmd builds the REQ that asks the recorder to do cmd with arg.
func recorderCmd(cmd, arg string) []byte {
	b, _ := json.Marshal([]any{"REQ", cmd, map[string]string{"search": arg}})
	return b
}

// floodCut is recorded as the close code when a flood's write fails: the
// gate cut the connection.
const floodCut = -1

// waitLocked waits, for at most 5s, until done reports true; it is called
// and returns with rec.mu held.
func (rec *recorder) waitLocked(done func() bool) {
	deadline := time.AfterFunc(5*time.Second, func() {
		rec.mu.Lock()
		rec.cond.Broadcast()
		rec.mu.Unlock()
	})
	defer deadline.Stop()
	for start := time.Now(); !done() && time.Since(start) < 5*time.Second; {
		rec.cond.Wait()
	}
}

// closed waits for the close frame of an upstream connection and returns
// its code, or 0 if none came within 5s.
func (rec *recorder) closed() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.waitLocked(func() bool { return len(rec.closes) > 0 })
	if len(rec.closes) == 0 {
		return 0
	}
	return rec.closes[0]
}

// frames waits until n frames have arrived (at most 5s) and returns them.
func (rec *recorder) frames(n int) []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.waitLocked(func() bool { return len(rec.got) >= n })
	return append([]string(nil), rec.got...)
}

func dialRaw(t testing.TB, url string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// settle waits, up to 5 s, for the goroutine count to come back to at
// most base: the goroutines of real sockets' connections end on their own
// schedule after a close.
func settle(t *testing.T, base int) {
	t.Helper()
	var n int
	for i := 0; i < 200; i++ {
		runtime.GC()
		if n = runtime.NumGoroutine(); n <= base {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	t.Fatalf("goroutines: %d, baseline %d\n%s", n, base, buf)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// readText reads one frame with a deadline.
func readText(t *testing.T, c *websocket.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, b, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

// Frames pass byte for byte in both directions, with their message type,
// in both upstream modes; the relay is told the client's address and not
// what the client claimed; plain HTTP passes.
func TestGateForwardsByteForByte(t *testing.T) {
	for _, mode := range []string{"wrap", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			rec := newRecorder()
			g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
			var url string
			if mode == "wrap" {
				url = serve(t, g.Wrap(rec))
			} else {
				h, err := g.Proxy(serve(t, rec) + "/base")
				if err != nil {
					t.Fatal(err)
				}
				url = serve(t, h)
			}
			spoof := http.Header{
				"X-Forwarded-For":   {"6.6.6.6"},
				"X-Real-Ip":         {"6.6.6.6"},
				"True-Client-Ip":    {"6.6.6.6"},
				"Cf-Connecting-Ip":  {"6.6.6.6"},
				"Forwarded":         {"for=6.6.6.6"},
				"X-Forwarded-Proto": {"https"},
				"X-Forwarded-Host":  {"evil.example"},
				"X-Custom":          {"kept"},
			}
			c, _, err := websocket.DefaultDialer.Dial(url+"/x?y=1", spoof)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			sent := []struct {
				typ  int
				data string
			}{
				{websocket.TextMessage, `["REQ", "x" , { "kinds" : [ 1 ] } ] ` + "\n"},
				{websocket.TextMessage, withID(`["EVENT",` + strings.Replace(goNostrEvent, `"hello`, `"\u00e9 é ☃ hello`, 1) + `]`)},
				// Binary, but canonical: forwarded as the text it is.
				{websocket.BinaryMessage, `["CLOSE","x"]`},
				{websocket.TextMessage, string(recorderCmd("echo", `["NOTICE","é\u0000"]`))},
				{websocket.TextMessage, string(recorderCmd("echo-binary", "\x00bin"))},
			}
			for _, f := range sent {
				if err := c.WriteMessage(f.typ, []byte(f.data)); err != nil {
					t.Fatal(err)
				}
			}
			got := rec.frames(len(sent))
			rec.mu.Lock()
			types := append([]int(nil), rec.types...)
			hdr, remote := rec.hdr, rec.remote
			rec.mu.Unlock()
			for i, f := range sent {
				if i >= len(got) || got[i] != f.data || types[i] != websocket.TextMessage {
					t.Fatalf("relay got %q (types %v), want every frame as sent", got, types)
				}
			}
			for _, want := range []struct {
				typ  int
				data string
			}{{websocket.TextMessage, `["NOTICE","é\u0000"]`}, {websocket.BinaryMessage, "\x00bin"}} {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				typ, b, err := c.ReadMessage()
				if err != nil || typ != want.typ || string(b) != want.data {
					t.Fatalf("client got %d %q %v, want %d %q", typ, b, err, want.typ, want.data)
				}
			}
			checkForwarded := func(what string, hdr http.Header) {
				t.Helper()
				if hdr.Get("X-Forwarded-For") != "127.0.0.1" || hdr.Get("X-Real-Ip") != "127.0.0.1" {
					t.Errorf("%s: relay told X-Forwarded-For %q, X-Real-IP %q; want the client's 127.0.0.1", what, hdr.Get("X-Forwarded-For"), hdr.Get("X-Real-Ip"))
				}
				for _, k := range []string{"True-Client-Ip", "Cf-Connecting-Ip", "Forwarded"} {
					if v := hdr.Get(k); v != "" {
						t.Errorf("%s: the client's %s: %s reached the relay", what, k, v)
					}
				}
				if hdr.Get("X-Forwarded-Proto") != "http" || !strings.HasPrefix(hdr.Get("X-Forwarded-Host"), "127.0.0.1:") {
					t.Errorf("%s: relay told proto %q host %q, want what the untrusted client really used", what, hdr.Get("X-Forwarded-Proto"), hdr.Get("X-Forwarded-Host"))
				}
				if hdr.Get("X-Custom") != "kept" {
					t.Errorf("%s: other headers dropped", what)
				}
			}
			checkForwarded("upgrade", hdr)
			if mode == "wrap" && !strings.HasPrefix(remote, "127.0.0.1:") {
				t.Errorf("in-process RemoteAddr %q, want the client's address", remote)
			}

			req, _ := http.NewRequest("GET", "http"+strings.TrimPrefix(url, "ws")+"/", nil)
			req.Header = spoof
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "plain http" {
				t.Errorf("plain GET through the gate: %q", body)
			}
			rec.mu.Lock()
			plain := rec.plainHdr
			rec.mu.Unlock()
			checkForwarded("plain GET", plain)
		})
	}
}

// A close on either side closes the other with the same code.
func TestGateClosePropagates(t *testing.T) {
	rec := newRecorder()
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	url := serve(t, g.Wrap(rec))

	c := dialRaw(t, url)
	_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(4001, "done"))
	if code := rec.closed(); code != 4001 {
		t.Errorf("relay saw close %d, want the client's 4001", code)
	}

	// The relay's last words arrive before its close.
	c = dialRaw(t, url)
	_ = c.WriteMessage(websocket.TextMessage, recorderCmd("bye", `["NOTICE","going"]`))
	if got := readText(t, c); got != `["NOTICE","going"]` {
		t.Errorf("relay's last frame: %q", got)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err := c.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != 4000 || ce.Text != "bye" {
		t.Errorf("client got %v, want the relay's close 4000 bye", err)
	}
}

// Many connections, closed from either side, cleanly or not, leave no
// goroutine behind, in both upstream modes, and Shutdown returns with
// none.
func TestGateNoGoroutineLeak(t *testing.T) {
	t.Run("wrap", func(t *testing.T) { leakCheck(t, false) })
	t.Run("proxy", func(t *testing.T) { leakCheck(t, true) })
}

func leakCheck(t *testing.T, proxy bool) {
	rec := newRecorder()
	g, err := New(Options{Policy: policy.Config{Limits: &policy.Limits{}}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler
	var upSrv *httptest.Server
	if proxy {
		upSrv = httptest.NewServer(rec)
		if h, err = g.Proxy("ws" + strings.TrimPrefix(upSrv.URL, "http")); err != nil {
			t.Fatal(err)
		}
	} else {
		h = g.Wrap(rec)
	}
	srv := httptest.NewServer(h)
	url := "ws" + strings.TrimPrefix(srv.URL, "http")
	base := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _, err := websocket.DefaultDialer.Dial(url, nil)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			_ = c.WriteMessage(websocket.TextMessage, recorderCmd("echo", "hi"))
			_, _, _ = c.ReadMessage()
			switch i % 4 {
			case 0: // client closes cleanly
				_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
			case 1: // client vanishes
				c.NetConn().Close()
			case 2, 3: // relay closes
				_ = c.WriteMessage(websocket.TextMessage, recorderCmd("bye", ""))
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				for {
					if _, _, err := c.ReadMessage(); err != nil {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	settle(t, base)

	// Open connections at shutdown are closed and waited for.
	for range 5 {
		c, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if proxy {
		upSrv.Close()
	}
	if proxy {
		settle(t, base-2) // the upstream server and httptest's own are gone too
	} else {
		settle(t, base-1) // httptest's own is gone too; an idle Wrap runs none
	}
}

// Shutdown says goodbye to both sides and refuses new upgrades.
func TestGateShutdown(t *testing.T) {
	rec := newRecorder()
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	url := serve(t, g.Wrap(rec))
	c := dialRaw(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err := c.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
		t.Errorf("client got %v, want close 1001", err)
	}
	if code := rec.closed(); code != websocket.CloseGoingAway {
		t.Errorf("relay got close %d, want 1001", code)
	}
	_, resp, err := websocket.DefaultDialer.Dial(url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("upgrade after Shutdown: %v %v, want 503", err, resp)
	}
	if err := g.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown: %v, want nil (the drain is over)", err)
	}
}

// A client that stops reading while the relay floods it is cut as a slow
// reader once its backlog would pass the queue's bound: the relay's writer
// never waits for it (memory stays at the bound), its flood ends with the
// cut, and other clients are unaffected.
func TestGateSlowClientDisconnected(t *testing.T) {
	rec := newRecorder()
	var cuts atomic.Int64
	obs := &policy.Observer{Cut: func(r string) {
		if r == "slow_reader" {
			cuts.Add(1)
		}
	}}
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, QueueBytes: 256 << 10, WriteTimeout: 2 * time.Second, Observer: obs})
	url := serve(t, g.Wrap(rec))
	slow := dialRaw(t, url)
	if err := slow.WriteMessage(websocket.TextMessage, recorderCmd("flood", "")); err != nil {
		t.Fatal(err)
	}
	if code := rec.closed(); code != floodCut {
		t.Fatalf("relay side: %d, want its flood cut off", code)
	}
	if n := cuts.Load(); n != 1 {
		t.Errorf("%d slow-reader cuts reported, want 1", n)
	}
	other := dialRaw(t, url)
	_ = other.WriteMessage(websocket.TextMessage, recorderCmd("echo", "ok"))
	if got := readText(t, other); got != "ok" {
		t.Fatalf("other client got %q", got)
	}
}

// A client that reads, however slowly, is not cut while its backlog stays
// under the queue's bound: 8 MiB, far more than the write timeout's worth
// of a fast client, reaches a client that pauses for most of the write
// timeout now and then, whole and in order. A gate that times a whole
// write, or a batch, rather than the socket's progress cuts it. In a
// synctest bubble over pipes, whose writes make progress only as the
// client reads: the pauses are exact, with no kernel buffer to hide them.
func TestGateSlowReaderNotCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 500 * time.Millisecond
		rec := newRecorder()
		g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, QueueBytes: 16 << 20, WriteTimeout: timeout})
		pn, url := servePipe(t, g.Wrap(rec))
		c := pn.dialWS(t, url)
		if err := c.WriteMessage(websocket.TextMessage, recorderCmd("burst", "")); err != nil {
			t.Fatal(err)
		}
		// 8 MiB in 64 KiB frames, read 2 MiB at a time
		// with a pause just short of the write timeout between.
		for i := range 128 {
			if i%32 == 31 {
				time.Sleep(timeout - time.Millisecond) // the bubble's clock: a pause, not a stop
			}
			typ, data, err := c.ReadMessage()
			if err != nil || typ != websocket.BinaryMessage || len(data) != 64<<10 {
				t.Fatalf("frame %d: %d bytes, %v", i, len(data), err)
			}
		}
	})
}

// Binary frames are classified like text frames (khatru reads them as
// text); unknown labels are charged to OTHER and forwarded; frames not
// shaped as a Nostr message are charged to OTHER and answered by the gate,
// never forwarded; an oversized frame closes the connection with 1009.
func TestGateOtherBucketAndReadLimit(t *testing.T) {
	clk := nostrtest.NewClock()
	var l policy.Limits
	l.Message[wire.TypeOther] = []ratelimit.Limit{ratelimit.PerPeriod(2.5, time.Second)}
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
	rec := newRecorder()
	g := newGate(t, Options{Limiter: memLimiter(clk), Policy: policy.Config{Limits: &l}, ReadLimit: 1024})
	c := dialRaw(t, serve(t, g.Wrap(rec)))
	event := `["EVENT",` + goNostrEvent + `]`
	_ = c.WriteMessage(websocket.BinaryMessage, []byte(`["REQ","a",{}]`)) // REQ: free here
	_ = c.WriteMessage(websocket.BinaryMessage, []byte(event))            // EVENT: the one of its burst
	// Unknown labels are charged to OTHER and answered, never forwarded.
	_ = c.WriteMessage(websocket.TextMessage, []byte(`["HELLO"]`))     // OTHER 1
	_ = c.WriteMessage(websocket.BinaryMessage, []byte(`["HELLO",1]`)) // OTHER 2
	for range 2 {
		if got := readText(t, c); got != `["NOTICE","`+"invalid: unknown message type"+`"]` {
			t.Errorf("unknown label answered %s", got)
		}
	}
	_ = c.WriteMessage(websocket.TextMessage, []byte(`[1,"X"]`)) // OTHER 3: refused
	if got := readText(t, c); got != `["NOTICE","rate-limited: slow down; retry in 1s"]` {
		t.Errorf("third OTHER frame answered %s", got)
	}
	_ = c.WriteMessage(websocket.BinaryMessage, []byte(event))
	if got, want := readText(t, c), `["OK","`+idHex+`",false,"rate-limited: slow down; retry in `; !strings.HasPrefix(got, want) {
		t.Errorf("second binary EVENT answered %s, want it charged as an EVENT", got)
	}
	clk.Advance(time.Second)
	for _, frame := range []string{`[1,"X"]`, `[0,"EVENT",{}]`, "\x01[\"EVENT\",{}]", "[\"EVENT\"\x01,{}]", `{"EVENT":1}`, `["EVENT" {}]`, `["EVENT`, `[",",1]`, `["NEG-OPENx,y","s",{},"00"]`} {
		_ = c.WriteMessage(websocket.TextMessage, []byte(frame))
		if got := readText(t, c); got != `["NOTICE","`+"invalid: not a Nostr message"+`"]` {
			t.Errorf("%q answered %s", frame, got)
		}
		clk.Advance(time.Second)
	}
	if got := rec.frames(2); len(got) != 2 {
		t.Errorf("relay got %q, want the first two", got)
	}
	_ = c.WriteMessage(websocket.TextMessage, make([]byte, 2048))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err := c.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseMessageTooBig {
		t.Errorf("oversized frame: %v, want close 1009", err)
	}
	if code := rec.closed(); code == 0 {
		t.Error("relay side not closed after the client was")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.got) != 2 {
		t.Errorf("relay got %q, want only the REQ and the first EVENT", rec.got)
	}
}

// A relay that refuses the handshake is answered for: the client sees its
// status, Retry-After and body, not a gate error.
func TestGateRelayRefusalPassesThrough(t *testing.T) {
	refuser := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, "relay says slow down")
	})
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	_, resp, err := websocket.DefaultDialer.Dial(serve(t, g.Wrap(refuser)), nil)
	if err == nil || resp == nil {
		t.Fatalf("dial: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "7" || string(body) != "relay says slow down" {
		t.Fatalf("got %d Retry-After %q body %q", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// A relay behind Proxy that stops answering (no frames, no pongs) is
// dropped after two ping intervals, and the client is told. (In Wrap mode
// the relay serves the client's socket itself: its keepalive is its own.)
func TestGateStalledRelayDropped(t *testing.T) {
	rec := newRecorder()
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, PingInterval: 50 * time.Millisecond})
	h, err := g.Proxy(serve(t, rec))
	if err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, serve(t, h))
	_ = c.WriteMessage(websocket.TextMessage, recorderCmd("stall", ""))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for err == nil {
		_, _, err = c.ReadMessage() // answers the gate's pings meanwhile
	}
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
		t.Fatalf("client got %v, want close 1001 (relay lost)", err)
	}
}

// A malformed handshake is refused by the gate without reaching the relay.
func TestGateBadHandshakeNotForwarded(t *testing.T) {
	rec := newRecorder()
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	url := "http" + strings.TrimPrefix(serve(t, g.Wrap(rec)), "ws")
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13") // no key
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d, want 400", resp.StatusCode)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.hdr != nil {
		t.Error("the relay saw a handshake for a malformed upgrade")
	}
}

// Behind a trusted proxy the relay is told the client the proxy saw, and
// the scheme and host the client used at the proxy (NIP-42 relay URL).
func TestGateBehindTrustedProxy(t *testing.T) {
	rec := newRecorder()
	id := &policy.Identity{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}, Identity: *id}})
	hdr := http.Header{
		"X-Forwarded-For":   {"6.6.6.6, 203.0.113.9"},
		"X-Forwarded-Proto": {"https"},
		"X-Forwarded-Host":  {"relay.example"},
		"True-Client-Ip":    {"6.6.6.6"},
	}
	c, _, err := websocket.DefaultDialer.Dial(serve(t, g.Wrap(rec)), hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rec.mu.Lock()
	got, remote := rec.hdr, rec.remote
	rec.mu.Unlock()
	for k, want := range map[string]string{
		"X-Forwarded-For": "203.0.113.9", "X-Real-Ip": "203.0.113.9",
		"X-Forwarded-Proto": "https", "X-Forwarded-Host": "relay.example", "True-Client-Ip": "",
	} {
		if got.Get(k) != want {
			t.Errorf("relay told %s: %q, want %q", k, got.Get(k), want)
		}
	}
	if !strings.HasPrefix(remote, "203.0.113.9:") {
		t.Errorf("in-process RemoteAddr %q, want the client behind the proxy", remote)
	}
}

// A handshake the gate does not upgrade gets an HTTP answer: a malformed
// one the upgrader's 400, before the relay is dialed; a dead relay a 502.
func TestGateHandshakeAnswers(t *testing.T) {
	rec := newRecorder()
	url := strings.Replace(serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}).Wrap(rec)), "ws://", "http://", 1)
	for _, tc := range []struct {
		name   string
		header map[string]string
		status int
	}{
		{name: "short key", header: map[string]string{"Sec-WebSocket-Key": "c2hvcnQ="}, status: http.StatusBadRequest},
		{name: "key not base64", header: map[string]string{"Sec-WebSocket-Key": "!!!!!!!!!!!!!!!!!!!!!!=="}, status: http.StatusBadRequest},
		{name: "version 8", header: map[string]string{"Sec-WebSocket-Version": "8"}, status: http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			h := map[string]string{"Host": "x", "Upgrade": "websocket", "Connection": "Upgrade",
				"Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
			for k, v := range tc.header {
				h[k] = v
			}
			req := "GET / HTTP/1.1\r\n"
			for k, v := range h {
				req += k + ": " + v + "\r\n"
			}
			if _, err := io.WriteString(c, req+"\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no HTTP answer: %v", err)
			}
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
		})
	}
	// A dead relay behind Proxy is a 502.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := "ws://" + dead.Listener.Addr().String()
	dead.Close()
	h, err := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}}).Proxy(deadURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, resp, err := websocket.DefaultDialer.Dial(serve(t, h), nil); err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Errorf("upgrade to a dead relay: %v, %v; want 502", resp, err)
	}
}
