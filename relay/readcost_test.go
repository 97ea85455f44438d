package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// A REQ is charged its price by shape in the frame's own decision: a
// scrape ten times an author-scoped filter (policy.ReadCost).
func TestAdmitPricesShape(t *testing.T) {
	var l policy.Limits
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(25, time.Hour)}
	c := admitConn(t, Options{Policy: policy.Config{Limits: &l}})
	scrape := []byte(`["REQ","s",{"kinds":[1],"limit":500}]`)
	for i := range 2 {
		if !c.admit(scrape) {
			t.Fatalf("scrape %d refused within a burst of 25", i)
		}
	}
	author := []byte(`["REQ","a",{"authors":["` + strings.Repeat("1", 64) + `"],"limit":20}]`)
	for i := range 4 {
		if !c.admit(author) {
			t.Fatalf("author-scoped REQ %d refused with 5 left", i)
		}
	}
	if c.admit(scrape) {
		t.Fatal("a third scrape of price 10 admitted with 1 left")
	}
	if got := c.reply(t); !strings.HasPrefix(got, `["CLOSED","s","rate-limited: slow down; retry in `) {
		t.Errorf("reply %s", got)
	}
}
