package wire

import (
	"net/http"
	"strings"
)

// IsUpgrade reports whether r asks for a WebSocket: a GET whose Connection
// header lists the token "upgrade" and whose Upgrade header lists the token
// "websocket", both case-insensitive, as RFC 6455 and gorilla's upgrader
// read them (websocket.IsWebSocketUpgrade, plus the method, which the
// upgrader refuses otherwise). It is the one such check: the gate, the
// hooks, the NIP-11 router and sluice's front all ask it, so none can see
// an upgrade the others do not. Every other request is plain HTTP.
func IsUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet &&
		hasToken(r.Header, "Connection", "upgrade") && hasToken(r.Header, "Upgrade", "websocket")
}

// hasToken reports whether the comma-separated values of header name list
// token.
func hasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
