//go:build ignore

// delayproxy is a TCP proxy that delays every chunk from the target back to the
// client by -d (order kept), for measuring a slower Redis: go run
// docs/bench/delayproxy/main.go -target 127.0.0.1:PORT -listen 127.0.0.1:PORT2 -d 5ms
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "")
	target := flag.String("target", "", "")
	d := flag.Duration("d", 5*time.Millisecond, "")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			t, err := net.Dial("tcp", *target)
			if err != nil {
				c.Close()
				return
			}
			go func() { io.Copy(t, c); t.Close() }()
			type chunk struct {
				b  []byte
				at time.Time
			}
			q := make(chan chunk, 4096)
			go func() {
				for ch := range q {
					time.Sleep(time.Until(ch.at))
					if _, err := c.Write(ch.b); err != nil {
						return
					}
				}
				c.Close()
			}()
			buf := make([]byte, 64<<10)
			for {
				n, err := t.Read(buf)
				if n > 0 {
					q <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(*d)}
				}
				if err != nil {
					close(q)
					return
				}
			}
		}()
	}
}
