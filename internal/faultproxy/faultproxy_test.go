package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo starts a line echo server on loopback.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string) (string, error) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard, not a timing
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func TestForwardsAndFaults(t *testing.T) {
	p := Start(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := roundTrip(t, c, r, "a"); err != nil || got != "a\n" {
		t.Fatalf("plain: %q %v", got, err)
	}
	p.SetLatency(time.Millisecond)
	p.SetRequestLatency(time.Millisecond)
	for _, m := range []string{"b", "c", "d"} { // delayed, still in order
		if got, err := roundTrip(t, c, r, m); err != nil || got != m+"\n" {
			t.Fatalf("delayed: %q %v", got, err)
		}
	}
	p.DropReplies(1)
	if got, err := roundTrip(t, c, r, "lost"); err == nil {
		t.Fatalf("a dropped reply arrived: %q", got)
	}
	if p.Lost() != 1 {
		t.Fatalf("lost %d", p.Lost())
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	r2 := bufio.NewReader(c2)
	if got, err := roundTrip(t, c2, r2, "e"); err != nil || got != "e\n" {
		t.Fatalf("after a drop: %q %v", got, err)
	}
	p.Reset()
	if got, err := roundTrip(t, c2, r2, "f"); err == nil {
		t.Fatalf("answered after Reset: %q", got)
	}
	p.Blackhole(true)
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	_ = c3.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c3.Write([]byte("g\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(c3).ReadString('\n'); err == nil {
		t.Fatal("a black hole answered")
	}
}
