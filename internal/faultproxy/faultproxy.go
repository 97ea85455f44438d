// Package faultproxy is a TCP proxy for tests that stands between a client
// and a server (a redis-server started by internal/redistest) on a loopback
// port and injects the faults a network and a sick server cause: latency
// in either direction, connection resets, a reply lost after the server
// acted on the request, and a black hole that accepts and never answers.
//
// Latency delays each chunk read from one side by the set duration before
// it is written to the other, in order, without limiting throughput (a
// pipeline of requests is delayed as a whole, not request by request): it
// models a slow link or a slow server, not a saturated one. Faults change
// at once for data read after the call; connections stay open unless a
// fault closes them.
package faultproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards every connection accepted on Addr to its target. It is
// safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	replyDelay, requestDelay atomic.Int64 // time.Duration
	dropReply                atomic.Int64 // replies still to lose
	blackhole                atomic.Bool
	lost                     atomic.Int64

	mu    sync.Mutex
	conns map[*link]struct{}
	wg    sync.WaitGroup
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	once           sync.Once
}

func (l *link) close() {
	l.once.Do(func() { l.client.Close(); l.server.Close() })
}

// Start listens on a free loopback port and forwards to target
// ("127.0.0.1:port"); it closes every connection when the test ends.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays every reply (server to client) by d; 0 removes it.
func (p *Proxy) SetLatency(d time.Duration) { p.replyDelay.Store(int64(d)) }

// SetRequestLatency delays every request (client to server) by d.
func (p *Proxy) SetRequestLatency(d time.Duration) { p.requestDelay.Store(int64(d)) }

// DropReplies loses the next n reply chunks: each is swallowed and its
// connection closed, after the server executed the request — what makes a
// blind retry charge twice.
func (p *Proxy) DropReplies(n int) { p.dropReply.Store(int64(n)) }

// Lost returns how many replies DropReplies has lost.
func (p *Proxy) Lost() int64 { return p.lost.Load() }

// Blackhole, while on, accepts connections and reads requests but
// forwards nothing and answers nothing, on new connections and open ones:
// a server that hangs without refusing.
func (p *Proxy) Blackhole(on bool) { p.blackhole.Store(on) }

// Reset closes every open connection with a TCP reset (linger 0), as a
// middlebox or a restarting server would; new connections are accepted as
// usual.
func (p *Proxy) Reset() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		if tc, ok := l.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		l.close()
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Reset()
	p.wg.Wait()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		cl, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			if tc, ok := cl.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // the server refused: so does the proxy
			}
			cl.Close()
			continue
		}
		l := &link{client: cl, server: up}
		p.mu.Lock()
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(l, cl, up, &p.requestDelay, false)
		go p.pump(l, up, cl, &p.replyDelay, true)
	}
}

// chunk is bytes read at one instant, due for writing at another.
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst through a queue, each chunk held until its due
// time; a delayed chunk does not hold back the reading of the next.
func (p *Proxy) pump(l *link, src, dst net.Conn, delay *atomic.Int64, replies bool) {
	defer p.wg.Done()
	q := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var t *time.Timer
		for c := range q {
			if wait := time.Until(c.due); wait > 0 {
				if t == nil {
					t = time.NewTimer(wait)
				} else {
					t.Reset(wait)
				}
				<-t.C
			}
			if _, err := dst.Write(c.b); err != nil {
				l.close()
				for range q {
				}
				return
			}
		}
	}()
	defer func() {
		close(q)
		<-done
		l.close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 && !p.blackhole.Load() {
			if replies && p.dropReply.Load() > 0 && p.dropReply.Add(-1) >= 0 {
				p.lost.Add(1)
				return // the reply is lost with its connection
			}
			q <- chunk{b: buf[:n], due: time.Now().Add(time.Duration(delay.Load()))}
		}
		if err != nil {
			return // EOF or a closed link: the deferred close ends the other side too
		}
	}
}
