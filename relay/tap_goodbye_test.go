package relay

import (
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/relay/policy"
)

// A connection being ended (Wrap) never makes the handler's next write to
// it wait: khatru writes each new event to its listeners one after
// another before it answers the publisher, so a write held up here holds
// every publisher. Ended by the gate (a protocol error) with a queue the
// client does not read, the goodbye waits up to a second for the queue to
// drain; ended by the handler's own Close, up to the write timeout. Either
// way the write below must fail at once, not wait for the drain (with a
// write that waits for the write lock, it returns a second, or the write
// timeout, later on the bubble's clock).
func TestTapEndingWritesDoNotWait(t *testing.T) {
	for _, by := range []string{"gate", "handler"} {
		t.Run(by, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				filled := make(chan struct{})
				closing := make(chan struct{})
				write := make(chan struct{})
				took := make(chan time.Duration, 1)
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					up := websocket.Upgrader{}
					c, err := up.Upgrade(w, r, nil)
					if err != nil {
						return
					}
					defer c.Close()
					if _, _, err := c.ReadMessage(); err != nil {
						return
					}
					// 32 KiB the client does not read: queued in the tap,
					// under the low mark, so the gate reads on.
					_ = c.WriteMessage(websocket.TextMessage, []byte(`["NOTICE","`+strings.Repeat("x", 32<<10)+`"]`))
					close(filled)
					// Reads on, as khatru's read loop does: the gate reads
					// the client inside the handler's reads.
					go func() {
						for {
							if _, _, err := c.ReadMessage(); err != nil {
								return
							}
						}
					}()
					if by == "handler" {
						<-closing
						go func() { _ = c.UnderlyingConn().Close() }() // khatru's kill
					}
					<-write
					start := time.Now()
					_ = c.WriteMessage(websocket.TextMessage, []byte(`["EVENT","s",{}]`)) // a broadcast
					took <- time.Since(start)
				})
				g := newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}})
				pn, url := servePipe(t, g.Wrap(h))
				c := pn.dialWS(t, url)
				if err := c.WriteMessage(websocket.TextMessage, []byte(`["REQ","s",{}]`)); err != nil {
					t.Fatal(err)
				}
				<-filled
				synctest.Wait()
				if by == "gate" {
					// An unmasked frame: a protocol error, which the gate
					// ends the connection for, with a close frame after
					// the queue.
					go func() { _, _ = c.UnderlyingConn().Write([]byte{0x81, 0x01, 'x'}) }()
				} else {
					close(closing)
				}
				synctest.Wait() // the goodbye is draining the queue
				close(write)
				if d := <-took; d != 0 {
					t.Fatalf("the handler's write to a connection being ended waited %v for its goodbye", d)
				}
			})
		})
	}
}
