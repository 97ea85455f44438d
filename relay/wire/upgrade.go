package wire

import (
	"net/http"
	"strings"
)

// IsUpgrade reports whether a request with header h asks for a WebSocket:
// its Connection header lists the token "upgrade" and its Upgrade header
// the token "websocket", both case-insensitive, as RFC 6455 and gorilla's
// upgrader read them. It is the one such check: the gate, the hooks and the
// NIP-11 router all ask it, so none can see an upgrade the others do not.
func IsUpgrade(h http.Header) bool {
	return hasToken(h, "Connection", "upgrade") && hasToken(h, "Upgrade", "websocket")
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
