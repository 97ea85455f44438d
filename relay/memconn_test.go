package relay

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"testing/synctest"
	"time"
)

func memPair() (*memEnd, *memEnd) { return newMemPipe(pipeAddr("a"), pipeAddr("b")) }

// A write returns before the other end reads (up to maxMemBuffered), and
// what was written before a Close is still read, then io.EOF.
func TestMemPipeBuffersAndDrainsAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := memPair()
		msg := bytes.Repeat([]byte("x"), maxMemBuffered)
		if n, err := a.Write(msg); n != len(msg) || err != nil {
			t.Fatalf("Write = %d, %v; want it buffered without a reader", n, err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(b)
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("read %d bytes, %v; want the %d written before Close, then EOF", len(got), err, len(msg))
		}
		if _, err := b.Write([]byte("late")); !errors.Is(err, io.ErrClosedPipe) {
			t.Errorf("Write to a closed peer: %v, want io.ErrClosedPipe", err)
		}
		if _, err := a.Read(make([]byte, 1)); !errors.Is(err, io.ErrClosedPipe) {
			t.Errorf("Read on a closed end: %v, want io.ErrClosedPipe", err)
		}
	})
}

// A writer past the buffer waits for the reader, and only for as long as
// its write deadline: a relay that stops reading holds up that writer, for
// WriteTimeout at most.
func TestMemPipeWriteBlocksUntilReadOrDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := memPair()
		defer a.Close()
		big := make([]byte, maxMemBuffered+100)
		done := make(chan error, 1)
		go func() { _, err := a.Write(big); done <- err }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Write of more than the buffer returned (%v) with no reader", err)
		default:
		}
		if _, err := io.ReadFull(b, make([]byte, len(big))); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Write: %v", err)
		}

		_ = a.SetWriteDeadline(time.Now().Add(time.Second))
		start := time.Now()
		_, err := a.Write(big)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write to a stalled reader: %v, want os.ErrDeadlineExceeded", err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("Write gave up after %v, want its deadline, 1s", waited)
		}
	})
}

// A Read waits until its deadline, and a deadline moved while it waits is
// the one honoured.
func TestMemPipeReadDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := memPair()
		defer a.Close()
		_ = b.SetReadDeadline(time.Now().Add(time.Hour))
		start := time.Now()
		done := make(chan error, 1)
		go func() { _, err := b.Read(make([]byte, 8)); done <- err }()
		synctest.Wait()
		_ = b.SetReadDeadline(time.Now().Add(time.Minute))
		if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read: %v, want os.ErrDeadlineExceeded", err)
		}
		if waited := time.Since(start); waited != time.Minute {
			t.Errorf("Read gave up after %v, want the moved deadline, 1m", waited)
		}
		// A cleared deadline waits for data.
		_ = b.SetReadDeadline(time.Time{})
		go func() { _, err := b.Read(make([]byte, 8)); done <- err }()
		time.Sleep(2 * time.Hour)
		if _, err := a.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Read with no deadline: %v", err)
		}
	})
}

// Closing either end stops every deadline timer of both: a closed
// connection must not stay reachable from a pending timer (net.Pipe's did,
// ~1.5 KB each for two ping intervals, and churn took sluice relay to
// ~900 MiB).
func TestMemPipeCloseStopsTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := memPair()
		// Arm all four: a Read waiting on each end, then a Write waiting
		// on each (it feeds the Read a byte, then fills the buffer).
		for _, e := range []*memEnd{a, b} {
			_ = e.SetDeadline(time.Now().Add(time.Hour))
			go func() { _, _ = e.Read(make([]byte, 1)) }()
		}
		synctest.Wait()
		for _, e := range []*memEnd{a, b} {
			go func() { _, _ = e.Write(make([]byte, 2*maxMemBuffered)) }()
		}
		synctest.Wait()
		for _, e := range []*memEnd{a, b} {
			if e.rd.timer == nil || e.wd.timer == nil {
				t.Fatal("a waiting Read or Write armed no timer")
			}
		}
		_ = b.Close()
		synctest.Wait() // the writers return
		for _, e := range []*memEnd{a, b} {
			for _, d := range []*memDeadline{&e.rd, &e.wd} {
				if d.timer.Stop() {
					t.Error("a deadline timer was still pending after Close")
				}
			}
		}
	})
}
