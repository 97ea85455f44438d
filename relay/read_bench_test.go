//go:build !race

package relay

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// pubSub is a publisher and a live subscriber through one gate.
type pubSub struct {
	pub, sub *websocket.Conn
	frames   [][]byte
	oks      []string
}

func newPubSub(b *testing.B, read []ratelimit.Limit) *pubSub {
	l := policy.Limits{Read: read}
	g := newGate(b, Options{Policy: policy.Config{Limits: &l}, MaxConnections: -1})
	url := serve(b, g.Wrap(newKhatru(b)))
	ps := &pubSub{frames: make([][]byte, b.N), oks: make([]string, b.N)}
	sk := nostr.GeneratePrivateKey()
	content := strings.Repeat("x", 1<<10)
	for i := range b.N {
		ev := nostrtest.Note(b, sk, fmt.Sprint(i, content))
		ps.frames[i], _ = nostr.EventEnvelope{Event: ev}.MarshalJSON()
		ps.oks[i] = `["OK","` + ev.ID + `",true`
	}
	ps.sub, ps.pub = dialRaw(b, url), dialRaw(b, url)
	_ = ps.sub.WriteMessage(websocket.TextMessage, []byte(`["REQ","live",{"kinds":[1],"limit":0}]`))
	if _, m, err := ps.sub.ReadMessage(); err != nil || !strings.HasPrefix(string(m), `["EOSE"`) {
		b.Fatalf("subscribe: %s %v", m, err)
	}
	return ps
}

// one publishes event i, waits for its OK and for its delivery to the
// subscriber, and returns how long that took.
func (ps *pubSub) one(b *testing.B, i int) time.Duration {
	start := time.Now()
	roundTrip(b, ps.pub, ps.frames[i], ps.oks[i])
	if _, m, err := ps.sub.ReadMessage(); err != nil || !strings.HasPrefix(string(m), `["EVENT","live"`) {
		b.Fatalf("delivery %d: %.60s %v", i, m, err)
	}
	return time.Since(start)
}

// BenchmarkReadMetering is publish/subscribe (an event of 1 KiB published,
// answered OK and delivered to a live subscriber) through two gates of the
// same binary, in Wrap mode on the memory store: one with the read budget
// on (every byte the subscriber gets counted and settled, in a budget it
// never reaches), one with it off (no limits.read). Each op runs one
// event through each, alternating, so both see the same machine; it
// reports each side's ns per event and their ratio, metered/off:
//
//	go test ./relay -run '^$' -bench ReadMetering -benchtime 5000x -count 3
func BenchmarkReadMetering(b *testing.B) {
	on := newPubSub(b, []ratelimit.Limit{ratelimit.PerPeriod(1<<50, time.Minute)})
	off := newPubSub(b, nil)
	b.ResetTimer()
	meteredOff(b, "event", func(i int) time.Duration { return on.one(b, i) }, func(i int) time.Duration { return off.one(b, i) })
}

// meteredOff runs on and off once per op each, alternating which goes
// first so that both see the same machine, and reports each side's ns per
// unit and their ratio, metered/off.
func meteredOff(b *testing.B, unit string, on, off func(i int) time.Duration) {
	var tOn, tOff time.Duration
	for i := range b.N {
		if i%2 == 0 {
			tOn += on(i)
			tOff += off(i)
		} else {
			tOff += off(i)
			tOn += on(i)
		}
	}
	b.ReportMetric(float64(tOn.Nanoseconds())/float64(b.N), "metered-ns/"+unit)
	b.ReportMetric(float64(tOff.Nanoseconds())/float64(b.N), "off-ns/"+unit)
	b.ReportMetric(float64(tOn)/float64(tOff), "metered/off")
}

// BenchmarkReadMeteringQuery is a client reading stored events: a REQ
// answered with 200 notes of 1 KiB (about 230 KiB) and EOSE, through two
// gates of the same binary over one khatru (badger), in Wrap mode on the memory
// store: one with the read budget on (every byte counted and settled, a
// charge every 64 KiB, in a budget it never reaches), one with it off.
// Each op runs one query through each, alternating which goes first; it
// reports each side's ns per query and their ratio, metered/off:
//
//	go test ./relay -run '^$' -bench ReadMeteringQuery -benchtime 300x -count 8
func BenchmarkReadMeteringQuery(b *testing.B) {
	const notes = 200
	var filters, events atomic.Int64
	kr := badgerKhatru(b, &filters, &events)
	sk := nostr.GeneratePrivateKey()
	content := strings.Repeat("x", 1<<10)
	for i := range notes {
		ev := nostrtest.Note(b, sk, fmt.Sprint(i, content))
		if _, err := kr.AddEvent(context.Background(), &ev); err != nil {
			b.Fatal(err)
		}
	}
	side := func(read []ratelimit.Limit) *websocket.Conn {
		l := policy.Limits{Read: read}
		l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(1e12, time.Second)}
		l.Message[wire.TypeCLOSE] = nil
		g := newGate(b, Options{Policy: policy.Config{Limits: &l}, MaxConnections: -1})
		return dialRaw(b, serve(b, g.Wrap(kr)))
	}
	on := side([]ratelimit.Limit{ratelimit.PerPeriod(1<<60, time.Minute)})
	off := side(nil)
	req := []byte(`["REQ","q",{"kinds":[1],"limit":` + fmt.Sprint(notes) + `}]`)
	run := func(c *websocket.Conn) time.Duration {
		start := time.Now()
		if err := c.WriteMessage(websocket.TextMessage, req); err != nil {
			b.Fatal(err)
		}
		for n := 0; ; n++ {
			_, m, err := c.ReadMessage()
			if err != nil {
				b.Fatal(err)
			}
			if strings.HasPrefix(string(m), `["EOSE"`) {
				if n != notes {
					b.Fatalf("%d events before EOSE, want %d", n, notes)
				}
				break
			}
			if !strings.HasPrefix(string(m), `["EVENT","q"`) {
				b.Fatalf("answered %.80s", m)
			}
		}
		d := time.Since(start)
		_ = c.WriteMessage(websocket.TextMessage, []byte(`["CLOSE","q"]`))
		return d
	}
	b.ResetTimer()
	meteredOff(b, "query", func(int) time.Duration { return run(on) }, func(int) time.Duration { return run(off) })
}

// BenchmarkReadMeteringTrack is the gate's own work on a relay's stream of
// EVENTs in relay mode (tapConn.track, as BenchmarkTapTrack: 64 EVENTs of
// ~400 bytes in one write), for a client with the read budget on (each
// message counted, a charge to the memory store every 64 KiB, in a budget
// it never reaches) and one with it off (no limits.read). Each op runs the
// stream through both, alternating which goes first; it reports each
// side's ns per stream and their ratio, metered/off. Without the sockets
// and the relay, this is the ratio's worst case: the meter's cost against
// the least the gate does with the same bytes.
//
//	go test ./relay -run '^$' -bench ReadMeteringTrack -benchtime 200000x -count 5
func BenchmarkReadMeteringTrack(b *testing.B) {
	var stream []byte
	for i := range 64 {
		ev := fmt.Sprintf(`["EVENT","feed",{"id":"%064d","pubkey":"%064d","created_at":1700000000,"kind":1,"tags":[],"content":"%s","sig":"%0128d"}]`, i, i, strings.Repeat("x", 40), i)
		stream = append(stream, serverFrame(opText, true, []byte(ev))...)
	}
	side := func(read []ratelimit.Limit) *tapConn {
		c := admitConn(b, Options{Policy: policy.Config{Limits: &policy.Limits{Read: read}}})
		if a, _ := c.readAccount(); (a != nil) != (read != nil) {
			b.Fatalf("read account %v with read windows %v", a, read)
		}
		t := newTap(c, 0)
		t.wt.op = 0 // past the 101
		return t
	}
	on := side([]ratelimit.Limit{ratelimit.PerPeriod(1<<60, time.Minute)})
	off := side(nil)
	run := func(t *tapConn) time.Duration {
		start := time.Now()
		if _, err := t.track(stream); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	b.SetBytes(int64(2 * len(stream)))
	b.ReportAllocs()
	meteredOff(b, "stream", func(int) time.Duration { return run(on) }, func(int) time.Duration { return run(off) })
}
