package wire

import (
	"net/http"
	"testing"

	"github.com/gorilla/websocket"
)

// TestIsUpgradeAgreesWithGorilla: the one upgrade check reads every header
// set as gorilla's upgrader (which the gate serves with) reads it.
func TestIsUpgradeAgreesWithGorilla(t *testing.T) {
	for _, h := range []http.Header{
		{},
		{"Upgrade": {"websocket"}},
		{"Connection": {"Upgrade"}},
		{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}},
		{"Connection": {"keep-alive, Upgrade"}, "Upgrade": {"WebSocket"}},
		{"Connection": {"keep-alive", "upgrade"}, "Upgrade": {"h2c, websocket"}},
		{"Connection": {"upgraded"}, "Upgrade": {"websocket"}},
		{"Connection": {"Upgrade"}, "Upgrade": {"websockets"}},
		{"Connection": {" Upgrade "}, "Upgrade": {" websocket "}},
	} {
		want := websocket.IsWebSocketUpgrade(&http.Request{Header: h})
		if got := IsUpgrade(h); got != want {
			t.Errorf("IsUpgrade(%v) = %v, gorilla says %v", h, got, want)
		}
	}
}
