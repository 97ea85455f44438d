//go:build !race

package relay

import (
	"testing"

	"github.com/gorilla/websocket"
	"github.com/sluice-relay/sluice/relay/policy"
)

// Connections through Wrap release their memory when they close: the
// in-process pipes' deadline timers used to keep every closed connection
// reachable for a ping interval (~60 s), so 200,000 short-lived clients
// took sluice relay to ~900 MiB where khatru alone stayed at ~110 MiB.
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
	// khatru alone, and the gate in proxy mode, keep ~0 B a connection;
	// the pipes' timers kept ~1.5 KB each.
	if grew := int64(after) - int64(before); grew > 3000*256 {
		t.Errorf("the heap grew by %d KiB: more than 256 B per closed connection is still reachable", grew>>10)
	}
}
