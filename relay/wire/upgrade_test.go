package wire

import (
	"net/http"
	"testing"

	"github.com/gorilla/websocket"
)

// TestIsUpgradeAgreesWithGorilla: the one upgrade check reads every header
// set as gorilla's upgrader (which the gate serves with) reads it, and
// only a GET is an upgrade (the upgrader answers anything else 405).
func TestIsUpgradeAgreesWithGorilla(t *testing.T) {
	for _, h := range []http.Header{
		{},
		{"Upgrade": {"websocket"}},
		{"Upgrade": {"anything"}},
		{"Connection": {"Upgrade"}},
		{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}},
		{"Connection": {"keep-alive, Upgrade"}, "Upgrade": {"WebSocket"}},
		{"Connection": {"keep-alive", "upgrade"}, "Upgrade": {"h2c, websocket"}},
		{"Connection": {"upgraded"}, "Upgrade": {"websocket"}},
		{"Connection": {"Upgrade"}, "Upgrade": {"websockets"}},
		{"Connection": {" Upgrade "}, "Upgrade": {" websocket "}},
	} {
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodHead, http.MethodOptions} {
			want := m == http.MethodGet && websocket.IsWebSocketUpgrade(&http.Request{Header: h})
			if got := IsUpgrade(&http.Request{Method: m, Header: h}); got != want {
				t.Errorf("IsUpgrade(%s %v) = %v, want %v", m, h, got, want)
			}
		}
	}
}
