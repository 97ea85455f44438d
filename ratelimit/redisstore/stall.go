package redisstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// A deadline measures Redis only while the gate runs. When the gate's own
// process does not run — its machine paused (a VM's stolen time), its CPU
// taken by another process — the time passes all the same: a decision
// whose reply was waiting in the socket times out on the gate's first
// instant back, and Redis, paused with it on a shared machine, runs the
// call past its cutoff and writes nothing ("late"). Either way the client
// was told "unavailable" while Redis answered everything it was sent in
// time: a pause of 150 ms every 0.7 s of the gate and its Redis together
// did that to up to 316 of 16,000 EVENTs at 256 connections in a run
// (docs/bench/redisstall.sh).
//
// So the store keeps a heartbeat (stalls): a tick every stallTick, and
// each gap between ticks longer than stallTick by stallMin or more is a
// stall, the time the process did not run. After a stall in a call's
// wait, once each: the call's context deadline is put off by the time
// lost (callCtx), a read that timed out reads on that long past its
// deadline (stallConn.Read), and a decision Redis refused as late, which
// wrote nothing, is sent again (Store.decideReq, and DecideAll's call on
// one Redis) — its late answer not counted against Redis by the breaker
// (heard). None of it happens without a stall, so a Redis slow while the
// gate runs is failed by its deadline as before. After a stall a decision
// waits at most its deadline plus the time lost, and once more its
// deadline when it is sent again.

const (
	stallTick = 10 * time.Millisecond
	stallMin  = 20 * time.Millisecond
	stallKeep = 16 // stalls remembered, the newest
)

// stallMeter is the heartbeat. It runs while a Store is open (hold); its
// record is the process's, read by every connection of NewClient's clients
// and every Store.
type stallMeter struct {
	mu    sync.Mutex
	users int
	stop  chan struct{}
	gaps  [stallKeep]span // the newest stalls, a ring, under mu
	next  int
	last  atomic.Int64 // the newest tick (monoNow), written under mu; 0: not running
}

// span is a stall: the last tick before it and the first after, in monoNow's
// nanoseconds.
type span struct{ from, to int64 }

var stalls stallMeter

// monoBase makes monotonic instants plain numbers (monoNow).
var monoBase = time.Now()

func monoAt(t time.Time) int64 { return int64(t.Sub(monoBase)) }
func monoNow() int64           { return monoAt(time.Now()) }

// hold starts the heartbeat if it is not running; release (once) stops it
// when no Store holds it any more.
func (m *stallMeter) hold() (release func()) {
	m.mu.Lock()
	m.users++
	if m.users == 1 {
		m.stop = make(chan struct{})
		m.last.Store(monoNow())
		go m.run(m.stop)
	}
	m.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			m.users--
			if m.users == 0 {
				close(m.stop)
				m.last.Store(0)
			}
			m.mu.Unlock()
		})
	}
}

func (m *stallMeter) run(stop chan struct{}) {
	t := time.NewTicker(stallTick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			m.tick(monoNow())
		}
	}
}

// tick notes the heartbeat at now: a gap since the tick before of more
// than stallTick+stallMin is a stall.
func (m *stallMeter) tick(now int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.users == 0 {
		return // released while this tick was on its way: last stays 0
	}
	if prev := m.last.Load(); now-prev >= int64(stallTick+stallMin) {
		m.note(prev, now)
	}
	m.last.Store(now)
}

// note records a stall from (the last tick before it) to (the first
// after). Under mu.
func (m *stallMeter) note(from, to int64) {
	m.gaps[m.next%stallKeep] = span{from, to}
	m.next++
}

// since is how long, at the longest, the process did not run between t
// and now, counting a stall still in progress (the heartbeat late now);
// 0 when it ran throughout, within stallMin, or when no Store holds the
// heartbeat.
func (m *stallMeter) since(t time.Time) time.Duration {
	return m.lost(monoAt(t), monoNow())
}

func (m *stallMeter) lost(from, now int64) time.Duration {
	last := m.last.Load()
	if last == 0 {
		return 0
	}
	var g int64
	if now-last >= int64(stallTick+stallMin) {
		g = now - max(last, from) - int64(stallTick)
	}
	m.mu.Lock()
	for _, s := range m.gaps {
		if s.to > from && s.to-max(s.from, from)-int64(stallTick) > g {
			g = s.to - max(s.from, from) - int64(stallTick)
		}
	}
	m.mu.Unlock()
	if g < int64(stallMin) {
		return 0
	}
	return time.Duration(g)
}
