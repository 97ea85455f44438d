package relay

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// admitConn returns a conn with no sockets, enough to drive admit: its
// replies land in its bridge's queue (c.queued).
func admitConn(t testing.TB, opts Options) *conn {
	t.Helper()
	g := newGate(t, opts)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &conn{g: g, ctx: ctx, cancel: cancel, closing: make(chan struct{}), who: "203.0.113.7", addr: netip.MustParseAddr("203.0.113.7")}
	c.side = &bridge{c: c, out: newOutQueue(defaultQueueBytes)}
	c.subs.release = func(n int) { g.filterBytes.release(c.who, n) } // as the gate's connections do
	return c
}

// queued is the queue admitConn's replies land in.
func (c *conn) queued() *outQueue { return c.side.(*bridge).out }

// pop takes the oldest queued frame, for tests.
func (q *outQueue) pop() (outFrame, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.frames) == 0 {
		return outFrame{}, false
	}
	f := q.frames[0]
	q.frames = append(q.frames[:0], q.frames[1:]...)
	q.bytes -= len(f.data)
	return f, true
}

// reply takes the oldest reply admit queued.
func (c *conn) reply(t testing.TB) string {
	t.Helper()
	f, ok := c.queued().pop()
	if !ok {
		t.Fatal("no reply queued")
	}
	return string(f.data)
}

// downStore fails every decision, as a Redis outage does.
type downStore struct{ calls atomic.Int64 }

func (s *downStore) Decide(context.Context, string, *ratelimit.Windows, time.Time) (ratelimit.Decision, error) {
	s.calls.Add(1)
	return ratelimit.Decision{}, fmt.Errorf("test: %w", ratelimit.ErrUnavailable)
}

// TestAdmitRefusalsCarryTheID: admit looks for the id only when it
// refuses, and then every refusal names it: the limits' (rate-limited,
// unavailable), the quota's and the unattributable event's, for an EVENT
// whose id comes late (nostr-tools order) and for a REQ.
func TestAdmitRefusalsCarryTheID(t *testing.T) {
	event := []byte(`["EVENT",` + nostrToolsEvent + `]`)
	req := []byte(`["REQ","sub:1",{"kinds":[1]}]`)
	one := func(typ wire.Type) *policy.Limits {
		var l policy.Limits
		l.Message[typ] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
		return &l
	}
	okPrefix := `["OK","` + testID3 + `",false,"`

	c := admitConn(t, Options{Policy: policy.Config{Limits: one(wire.TypeEVENT)}})
	if !c.admit(event) {
		t.Fatal("first EVENT refused")
	}
	if c.admit(event) {
		t.Fatal("second EVENT admitted past a burst of 1")
	}
	if got, want := c.reply(t), okPrefix+"rate-limited: slow down; retry in "; len(got) < len(want) || got[:len(want)] != want {
		t.Errorf("rate-limited EVENT reply %s, want prefix %s", got, want)
	}

	c = admitConn(t, Options{Policy: policy.Config{Limits: one(wire.TypeREQ)}})
	c.admit(req)
	c.admit(req)
	if got, want := c.reply(t), `["CLOSED","sub:1","rate-limited: slow down; retry in `; len(got) < len(want) || got[:len(want)] != want {
		t.Errorf("rate-limited REQ reply %s, want prefix %s", got, want)
	}

	c = admitConn(t, Options{Policy: policy.Config{Limits: one(wire.TypeEVENT)}, Limiter: ratelimit.NewLimiter(&downStore{}, nil)})
	c.admit(event)
	if got, want := c.reply(t), okPrefix+scan.ReasonUnavailable+`"]`; got != want {
		t.Errorf("unavailable EVENT reply %s, want %s", got, want)
	}

	q, err := ratelimit.NewQuota(1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	_, _ = q.WithClock(func() time.Time { return now }).Add(context.Background(), "6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93", "", 0)
	c = admitConn(t, Options{Limiter: ratelimit.NewLimiter(nil, func() time.Time { return now }), Policy: policy.Config{Limits: &policy.Limits{}, Quota: q.WithClock(func() time.Time { return now })}})
	if c.admit(event) {
		t.Fatal("EVENT admitted past its author's quota")
	}
	if got, want := c.reply(t), okPrefix+"rate-limited: quota: 1 events per 3600s for this pubkey; retry in "; len(got) < len(want) || got[:len(want)] != want {
		t.Errorf("quota reply %s, want prefix %s", got, want)
	}
	twoIDs := []byte(`["EVENT",{"id":"` + testID3 + `","id":"` + testID3 + `","pubkey":"6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93"}]`)
	if c.admit(twoIDs) {
		t.Fatal("EVENT with two ids admitted under a quota")
	}
	if got, want := c.reply(t), okPrefix+"invalid: event must have exactly the fields id, pubkey, created_at, kind, tags, content and sig, each once, in NIP-01's types"+`"]`; got != want {
		t.Errorf("unattributable reply %s, want %s", got, want)
	}
}

// TestAdmitRefusalAllocs: refusing a frame for a limit costs one
// allocation, the reply itself, and a blocked client's flood no more.
func TestAdmitRefusalAllocs(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
	c := admitConn(t, Options{Policy: policy.Config{Limits: &l}})
	event := []byte(`["EVENT",` + goNostrEvent + `]`)
	c.admit(event)
	allocs := testing.AllocsPerRun(100, func() {
		c.admit(event)
		c.queued().pop()
	})
	if allocs != 1 {
		t.Errorf("a rate-limited EVENT costs %v allocations, want 1", allocs)
	}
	if fr := scan.Peek(event).Frame(); len(scan.AppendRefusal(nil, fr, scan.ReasonUnavailable)) > cap(replyBuf(fr)) {
		t.Errorf("replyBuf too small for the unavailable reply")
	}
}

// TestReadFrameDropsLargeBuffers: the buffer of one large frame is not
// reused for the next, so a client cannot pin a read-limit-sized buffer per
// connection with one frame, even one the gate refuses (a refused frame's
// path must drop it too).
func TestReadFrameDropsLargeBuffers(t *testing.T) {
	small := make([]byte, 0, 4096)
	buf, err := readFrame(strings.NewReader(`["REQ","s"]`), small, newControlMeter())
	if err != nil || string(buf) != `["REQ","s"]` || &buf[:1][0] != &small[:1][0] {
		t.Fatalf("small buffer not reused: %q %v", buf, err)
	}
	big := make([]byte, 0, defaultReadLimit)
	buf, err = readFrame(strings.NewReader(`["REQ","s"]`), big, newControlMeter())
	if err != nil || string(buf) != `["REQ","s"]` {
		t.Fatalf("readFrame: %q %v", buf, err)
	}
	if cap(buf) > maxKeptFrameBuf {
		t.Errorf("a %d-byte buffer was kept for a %d-byte frame", cap(buf), len(buf))
	}
	frame := strings.Repeat("x", 200<<10)
	if buf, err = readFrame(strings.NewReader(frame), buf, newControlMeter()); err != nil || string(buf) != frame {
		t.Fatalf("large frame read wrong: %d bytes, %v", len(buf), err)
	}
	if buf, err = readFrame(strings.NewReader("y"), buf, newControlMeter()); err != nil || string(buf) != "y" || cap(buf) > maxKeptFrameBuf {
		t.Fatalf("frame after a large one: %q (cap %d), %v", buf, cap(buf), err)
	}
}

// BenchmarkAdmit is the gate's per-frame decision without the sockets: an
// admitted EVENT (id late, as nostr-tools writes it) and REQ, with and
// without the actor quota, and an EVENT from a client already refused
// (answered from the Limiter's local table).
//
//	go test ./relay/ -run '^$' -bench Admit -benchtime 200000x -count 1
func BenchmarkAdmit(b *testing.B) {
	event := []byte(`["EVENT",` + nostrToolsEvent + `]`)
	req := []byte(`["REQ","sub:1",{"kinds":[1],"limit":10}]`)
	wide := func() *policy.Limits {
		var l policy.Limits
		l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1e12, time.Second), ratelimit.PerPeriod(1e12, time.Minute)}
		l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(1e12, time.Second)}
		return &l
	}
	quota, err := ratelimit.NewQuota(bigQuota, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	tight := func() *policy.Limits {
		var l policy.Limits
		l.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
		return &l
	}
	for _, bm := range []struct {
		name  string
		opts  Options
		frame []byte
		admit bool
		sub   string // the REQ's subscription, closed after each
	}{
		{"EVENT", Options{Policy: policy.Config{Limits: wide()}}, event, true, ""},
		{"EVENT-quota", Options{UpstreamVerifies: true, Policy: policy.Config{Limits: wide(), Quota: quota.WithClock(nil)}}, event, true, ""},
		{"REQ", Options{Policy: policy.Config{Limits: wide()}}, req, true, "sub:1"},
		{"EVENT-blocked", Options{Policy: policy.Config{Limits: tight()}}, event, false, ""},
	} {
		b.Run(bm.name, func(b *testing.B) {
			c := admitConn(b, bm.opts)
			sub := []byte(bm.sub)
			b.ReportAllocs()
			for b.Loop() {
				if c.admit(bm.frame) != bm.admit && bm.admit {
					b.Fatalf("refused: %s", c.reply(b))
				}
				c.queued().pop()
				if len(sub) > 0 {
					// The relay's EOSE and the client's CLOSE: the
					// subscription's place is free for the next REQ.
					c.subs.answered(sub)
					c.subs.remove(sub)
				}
			}
		})
	}
}

// A REQ is charged its filters' prices (here narrow ones, 1 each), so a
// many-filter REQ cannot ride on one charge; a REQ dearer than its windows
// admit at once is charged what they admit; one past the filter bound is
// refused; and each type has its own frame bound.
func TestAdmitChargesPerFilter(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(10.5, time.Hour)}
	c := admitConn(t, Options{Policy: policy.Config{Limits: &l}})
	narrow := `{"limit":0}`
	five := []byte(`["REQ","s",` + strings.Repeat(narrow+",", 4) + narrow + `]`)
	for i := range 2 {
		if !c.admit(five) {
			t.Fatalf("5-filter REQ %d refused within a burst of 10", i)
		}
	}
	if c.admit([]byte(`["REQ","s",` + narrow + `]`)) {
		t.Fatal("a REQ admitted after 10 filters were charged")
	}
	if got := c.reply(t); !strings.HasPrefix(got, `["CLOSED","s","rate-limited: `) {
		t.Errorf("reply %s", got)
	}
	if got := c.g.current().p.MaxFilters(); got != wire.DefaultBounds().MaxFilters {
		t.Errorf("MaxFilters %d, want %d", got, wire.DefaultBounds().MaxFilters)
	}

	// Under a burst of 3 a 4-filter REQ is not refused for its size: it is
	// charged what the window admits at once (3), and a REQ past the
	// Bounds is refused as too many filters.
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(3.5, time.Hour)}
	c = admitConn(t, Options{Policy: policy.Config{Limits: &l, Bounds: wire.Bounds{MaxFilters: 4}}})
	if got := c.g.current().p.MaxFilters(); got != 4 {
		t.Fatalf("MaxFilters under a burst of 3: %d, want the bound 4", got)
	}
	four := []byte(`["REQ","s",` + strings.Repeat(narrow+",", 3) + narrow + `]`)
	if !c.admit(four) {
		t.Fatalf("4-filter REQ refused from rest under a burst of 3: %s", c.reply(t))
	}
	if c.admit([]byte(`["REQ","t",` + narrow + `]`)) {
		t.Fatal("a REQ admitted after the 4-filter REQ took the burst")
	}
	if got := c.reply(t); !strings.HasPrefix(got, `["CLOSED","t","rate-limited: `) {
		t.Errorf("reply %s", got)
	}
	c = admitConn(t, Options{Policy: policy.Config{Limits: &l, Bounds: wire.Bounds{MaxFilters: 4}}})
	if c.admit([]byte(`["REQ","s",{},{},{},{},{}]`)) {
		t.Fatal("5-filter REQ admitted past a bound of 4")
	}
	if got := c.reply(t); got != `["CLOSED","s","`+scan.ReasonFilters+` (at most 4)"]` {
		t.Errorf("reply %s", got)
	}

	c = admitConn(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
	big := `{"authors":["` + strings.Repeat("a", defaultFilterFrameSize) + `"]}`
	if c.admit([]byte(`["REQ","s",` + big + `]`)) {
		t.Fatal("REQ over its frame bound admitted")
	}
	if got := c.reply(t); got != `["CLOSED","s","invalid: REQ frame is larger than 65536 bytes"]` {
		t.Errorf("reply %s", got)
	}
	event := withID(`["EVENT",` + strings.Replace(goNostrEvent, `"hello`, `"`+strings.Repeat("a", defaultFilterFrameSize), 1) + `]`)
	if !c.admit([]byte(event)) {
		t.Fatalf("EVENT of %d bytes refused: %s", len(event), c.reply(t))
	}
}

// Refusals reach Observer.Frame with the client's key and the outcome that
// says what refused them.
func TestObserverRefusal(t *testing.T) {
	refusals := map[string]int{}
	refused := func(client string, _ wire.Type, o policy.Outcome) {
		if o == policy.RateLimited || o == policy.Invalid {
			refusals[client]++
		}
	}
	var l policy.Limits
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(1.5, time.Hour)}
	c := admitConn(t, Options{Policy: policy.Config{Limits: &l}, Observer: &policy.Observer{Frame: refused}})
	for range 5 {
		c.admit([]byte(`["REQ","s",{}]`))
	}
	c.admit([]byte(`["HELLO"]`)) // OTHER is free here: refused as invalid
	if len(refusals) != 1 || refusals["203.0.113.7"] != 5 {
		t.Fatalf("refusals %v, want 203.0.113.7 with 4 rate-limited REQs and 1 invalid frame", refusals)
	}
}

// BenchmarkWatch: what the relay reader spends on each relay frame looking
// for the few it acts on, for the frames a relay sends most (an EVENT of a
// subscription, an EOSE) and one it acts on (an OK), with a quota on (so
// OKs and AUTHs are watched).
func BenchmarkWatch(b *testing.B) {
	quota, err := ratelimit.NewQuota(bigQuota, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	c := admitConn(b, Options{Policy: policy.Config{Limits: &policy.Limits{}, Quota: quota.WithClock(nil)}})
	for _, bm := range []struct{ name, frame string }{
		{"EVENT", `["EVENT","sub:1",` + nostrToolsEvent + `]`},
		{"EOSE", `["EOSE","sub:1"]`},
		{"OK", `["OK","` + testID + `",true,""]`},
	} {
		b.Run(bm.name, func(b *testing.B) {
			frame := []byte(bm.frame)
			b.ReportAllocs()
			for b.Loop() {
				c.watch(frame)
			}
		})
	}
}

// bigQuota is the largest events-per-window a quota takes.
const bigQuota = 1<<22 - 1
