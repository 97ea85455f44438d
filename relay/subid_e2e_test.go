//go:build !race

package relay

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/sluice-relay/sluice/relay/policy"
)

// khatru writes a subscription id back JSON-escaped (U+2028 and U+2029 as
// \u2028, \u2029), so the gate must read every escape to match the
// relay's EOSE to the REQ it forwarded. When it could not, the places of
// such ids were never freed, and 50 REQ/CLOSE rounds left the connection
// refused every REQ for good. Ids the gate cannot match (escapes in the
// client's own id) are refused, never forwarded.
func TestE2ESubIDsReadTheSameBothWays(t *testing.T) {
	for _, mode := range []string{"relay", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			url := hostileTarget(t, mode, newKhatru(t), Options{Policy: policy.Config{Limits: &policy.Limits{}}, MaxSubscriptions: 4})
			c := dialRaw(t, url)
			for i := range 40 {
				id := fmt.Sprintf("s\u2028%d\u2029😀", i)
				req := fmt.Sprintf(`["REQ","%s",{"kinds":[1]}]`, id)
				got := send(t, c, []byte(req))
				if !strings.HasPrefix(got, `["EOSE",`) {
					t.Fatalf("REQ %d (cap 4, the earlier ones closed): %s", i, got)
				}
				if err := c.WriteMessage(websocket.TextMessage, []byte(`["CLOSE","`+id+`"]`)); err != nil {
					t.Fatal(err)
				}
			}
			if got := send(t, c, []byte(`["REQ","a\"b",{}]`)); !strings.HasPrefix(got, `["CLOSED","a\"b","invalid: subscription id`) {
				t.Fatalf("an escaped id: %s, want CLOSED invalid", got)
			}
		})
	}
}
