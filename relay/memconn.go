package relay

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// An in-memory connection joins the gate to an in-process relay (Wrap).
// net.Pipe did this before, at a cost the churn and publish benchmarks
// showed: every Write waited for the other side's Read (two goroutine
// switches per frame, a writer parked behind a busy run queue), and every
// deadline, which gorilla sets before each frame it writes, was a new
// time.AfterFunc timer that Close did not stop (it kept each closed
// connection reachable until the deadline; 200,000 short-lived clients took
// sluice relay to ~900 MiB).
//
// A memPipe buffers up to maxMemBuffered bytes in each direction, so a
// writer goes on while the bytes fit and blocks (within its write
// deadline) only when the reader has fallen that far behind: a relay that
// stops reading still holds up the gate's writer of that connection alone.
// A deadline is a stored instant; a timer is armed only while a Read or a
// Write actually waits past it, one per end and direction, created once
// and reset after, and the first Close of either end stops them all: no
// timer outlives a closed connection. Bytes written before a Close are
// still read by the other end, then io.EOF, as on a socket.

// maxMemBuffered bounds the bytes waiting in one direction of a memPipe.
const maxMemBuffered = 16 << 10

// memChunkSize is the storage a direction takes from memChunks when bytes
// start to wait; it goes back when they have all been read, so an idle
// connection holds none.
const memChunkSize = 4 << 10

var memChunks = sync.Pool{New: func() any { b := make([]byte, 0, memChunkSize); return &b }}

// memPipe is the shared state of a pair of memEnds.
type memPipe struct {
	mu   sync.Mutex
	dirs [2]memDir // dirs[i] carries what end i writes to end 1-i
	ends [2]memEnd
	shut bool // an end has closed: no timer is armed again
}

// memDir is one direction: its waiting bytes and who waits on them.
type memDir struct {
	b        []byte // unread bytes are b[r:]; nil when none wait
	r        int
	readable sync.Cond // the reader waits for bytes, EOF, a close or its deadline
	writable sync.Cond // the writer waits for room
	readers  int       // goroutines waiting on readable
	writers  int       // goroutines waiting on writable
}

func (d *memDir) buffered() int { return len(d.b) - d.r }

// put copies what fits of p and returns how much that was.
func (d *memDir) put(p []byte) int {
	n := min(len(p), maxMemBuffered-d.buffered())
	if n <= 0 {
		return 0
	}
	if d.b == nil {
		d.b = (*memChunks.Get().(*[]byte))[:0]
	}
	if d.r > 0 && len(d.b)+n > cap(d.b) {
		m := copy(d.b, d.b[d.r:])
		d.b, d.r = d.b[:m], 0
	}
	d.b = append(d.b, p[:n]...)
	return n
}

// get copies waiting bytes into p, giving the storage back once they have
// all been read.
func (d *memDir) get(p []byte) int {
	n := copy(p, d.b[d.r:])
	d.r += n
	if d.r == len(d.b) {
		d.release()
	}
	return n
}

func (d *memDir) release() {
	if d.b != nil && cap(d.b) == memChunkSize {
		b := d.b[:0]
		memChunks.Put(&b)
	}
	d.b, d.r = nil, 0
}

// memDeadline is one end's deadline for reading or for writing.
type memDeadline struct {
	t     time.Time   // zero: none
	armed time.Time   // the deadline timer is set for; zero: none
	timer *time.Timer // created on the first wait past a deadline
}

// expired reports whether the deadline has passed.
func (d *memDeadline) expired() bool { return !d.t.IsZero() && !time.Now().Before(d.t) }

// memEnd is one end of a memPipe: a net.Conn. Safe for concurrent use as
// net.Conn requires.
type memEnd struct {
	p             *memPipe
	i             int
	closed        bool // guarded by p.mu
	rd, wd        memDeadline
	local, remote net.Addr
}

// newMemPipe returns the two ends of an in-memory connection; a's
// LocalAddr is aAddr and its RemoteAddr bAddr, and b's the other way round.
func newMemPipe(aAddr, bAddr net.Addr) (a, b *memEnd) {
	p := &memPipe{}
	for i := range p.dirs {
		p.dirs[i].readable.L = &p.mu
		p.dirs[i].writable.L = &p.mu
	}
	p.ends[0] = memEnd{p: p, i: 0, local: aAddr, remote: bAddr}
	p.ends[1] = memEnd{p: p, i: 1, local: bAddr, remote: aAddr}
	return &p.ends[0], &p.ends[1]
}

func (e *memEnd) peer() *memEnd { return &e.p.ends[1-e.i] }

// wait blocks on c until it is signalled or the deadline d passes, arming
// d's timer when it is not already set for d.t. p.mu is held.
func (e *memEnd) wait(c *sync.Cond, d *memDeadline) {
	if !d.t.IsZero() && !e.p.shut && !d.armed.Equal(d.t) {
		d.armed = d.t
		if d.timer == nil {
			p := e.p
			d.timer = time.AfterFunc(time.Until(d.t), func() {
				p.mu.Lock()
				d.armed = time.Time{}
				c.Broadcast()
				p.mu.Unlock()
			})
		} else {
			d.timer.Reset(time.Until(d.t))
		}
	}
	c.Wait()
}

// Read implements net.Conn.
func (e *memEnd) Read(b []byte) (int, error) {
	p := e.p
	in := &p.dirs[1-e.i]
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		switch {
		case e.closed:
			return 0, io.ErrClosedPipe
		case in.buffered() > 0:
			if len(b) == 0 {
				return 0, nil
			}
			n := in.get(b)
			if in.writers > 0 {
				in.writable.Signal()
			}
			return n, nil
		case e.peer().closed:
			return 0, io.EOF
		case e.rd.expired():
			return 0, os.ErrDeadlineExceeded
		case len(b) == 0:
			return 0, nil
		}
		in.readers++
		e.wait(&in.readable, &e.rd)
		in.readers--
	}
}

// Write implements net.Conn. It returns once all of b waits for the
// other end, or with the error that stopped it.
func (e *memEnd) Write(b []byte) (int, error) {
	p := e.p
	out := &p.dirs[e.i]
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for {
		switch {
		case e.closed || e.peer().closed:
			return n, io.ErrClosedPipe
		case e.wd.expired():
			return n, os.ErrDeadlineExceeded
		}
		if k := out.put(b[n:]); k > 0 {
			n += k
			if out.readers > 0 {
				out.readable.Signal()
			}
		}
		if n == len(b) {
			return n, nil
		}
		out.writers++
		e.wait(&out.writable, &e.wd)
		out.writers--
	}
}

// Close implements net.Conn. The first Close of either end stops every
// deadline timer of both; bytes this end had written are still read by
// the other, bytes waiting for this end are dropped.
func (e *memEnd) Close() error {
	p := e.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if !p.shut {
		p.shut = true
		for i := range p.ends {
			for _, d := range []*memDeadline{&p.ends[i].rd, &p.ends[i].wd} {
				if d.timer != nil {
					d.timer.Stop()
				}
				d.armed = time.Time{}
			}
		}
	}
	p.dirs[1-e.i].release()
	for i := range p.dirs {
		p.dirs[i].readable.Broadcast()
		p.dirs[i].writable.Broadcast()
	}
	return nil
}

// SetReadDeadline implements net.Conn. A Read waiting is woken to honour
// the new deadline.
func (e *memEnd) SetReadDeadline(t time.Time) error {
	e.p.mu.Lock()
	defer e.p.mu.Unlock()
	e.rd.t = t
	if in := &e.p.dirs[1-e.i]; in.readers > 0 {
		in.readable.Broadcast()
	}
	return nil
}

// SetWriteDeadline implements net.Conn. A Write waiting is woken to honour
// the new deadline.
func (e *memEnd) SetWriteDeadline(t time.Time) error {
	e.p.mu.Lock()
	defer e.p.mu.Unlock()
	e.wd.t = t
	if out := &e.p.dirs[e.i]; out.writers > 0 {
		out.writable.Broadcast()
	}
	return nil
}

// SetDeadline implements net.Conn.
func (e *memEnd) SetDeadline(t time.Time) error {
	_ = e.SetReadDeadline(t)
	return e.SetWriteDeadline(t)
}

// LocalAddr implements net.Conn.
func (e *memEnd) LocalAddr() net.Addr { return e.local }

// RemoteAddr implements net.Conn.
func (e *memEnd) RemoteAddr() net.Addr { return e.remote }
