package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/relay"
)

// ExampleGate_Wrap puts a gate in front of a relay served in the same
// process: a toy relay that answers every REQ with its EOSE. An admitted
// REQ reaches the relay; a frame no relay should read is answered by the
// gate itself and never reaches it.
func ExampleGate_Wrap() {
	eoseRelay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			_, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			var req []json.RawMessage
			if json.Unmarshal(msg, &req) == nil && len(req) > 1 && string(req[0]) == `"REQ"` {
				_ = c.WriteMessage(websocket.TextMessage, []byte(`["EOSE",`+string(req[1])+`]`))
			}
		}
	})

	// The zero Options are the defaults: the default limits, on a memory
	// store in this process.
	gate, err := relay.New(relay.Options{})
	if err != nil {
		panic(err)
	}
	defer gate.Shutdown(context.Background())
	srv := httptest.NewServer(gate.Wrap(eoseRelay))
	defer srv.Close()

	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	for _, frame := range []string{
		`["REQ","feed",{"kinds":[1],"limit":10}]`,
		`["REQ","feed"]`, // no filter: not in NIP-01's shape, not forwarded
	} {
		if err := c.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
			panic(err)
		}
		_, reply, err := c.ReadMessage()
		if err != nil {
			panic(err)
		}
		fmt.Println(string(reply))
	}
	// Output:
	// ["EOSE","feed"]
	// ["CLOSED","feed","invalid: frame is not in NIP-01's exact shape"]
}
