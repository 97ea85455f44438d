//go:build !race

package relay

import (
	"testing"

	"github.com/gorilla/websocket"
	"github.com/sluice-relay/sluice/relay/policy"
)

// Connections through Wrap release their memory when they close: nothing
// of a closed connection stays reachable, such as a deadline timer that
// holds it until it fires (a ping interval on), which short-lived clients
// would pile up by the hundred thousand.
func TestE2EChurnReleasesMemory(t *testing.T) {
	url := serve(t, newGate(t, Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxConnections: -1}).Wrap(newKhatru(t)))
	churn := func(n int) {
		for range n {
			c, _, err := websocket.DefaultDialer.Dial(url, nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.WriteMessage(websocket.TextMessage, []byte(`["REQ","s",{"limit":1}]`))
			_, _, _ = c.ReadMessage()
			_ = c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
			_, _, _ = c.ReadMessage()
			c.Close()
		}
	}
	churn(200) // warm up pools and buffers
	before := heapInUse()
	churn(3000)
	after := heapInUse()
	t.Logf("heap %d -> %d KiB after 3,000 connections opened and closed (%d B each)", before>>10, after>>10, (int64(after)-int64(before))/3000)
	// khatru alone, and the gate in proxy mode, keep next to nothing a
	// connection; a timer holding each closed one keeps far more than
	// the bound.
	if grew := int64(after) - int64(before); grew > 3000*256 {
		t.Errorf("the heap grew by %d KiB: more than 256 B per closed connection is still reachable", grew>>10)
	}
}
