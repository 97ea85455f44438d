//go:build !race

package relay

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-relay/sluice/internal/nostrtest"
	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// heapInUse returns the live heap and goroutine stacks after a
// collection: khatru runs a goroutine per filter, so stacks are a good
// part of what a REQ makes it hold.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// A client within the default limits cannot make khatru hold more than 64
// MiB with large REQs. The client sends REQs of 10,000 filters each and
// then the largest REQs the gate forwards (DefaultMaxFilters filters, each
// of hundreds of authors, up to defaultFilterFrameSize), as fast as it
// can, and keeps every subscription open; the heap is read once every REQ
// has been answered. A gate that charges a REQ once whatever its filters,
// or forwards REQs unbounded in filters, lets khatru hold every one of
// them and fails the bound. The bound is generous, not a timing.
func TestE2ELargeREQsBoundHeap(t *testing.T) {
	clk := nostrtest.NewClock()
	url := serve(t, newGate(t, Options{Limiter: memLimiter(clk)}).Wrap(negKhatru(t)))
	c := dialRaw(t, url)
	if got := readText(t, c); !strings.HasPrefix(got, `["AUTH",`) {
		t.Fatalf("first frame %s", got)
	}
	before := heapInUse()

	many := `["REQ","many%d",` + strings.TrimSuffix(strings.Repeat(`{},`, 10_000), ",") + `]`
	var authors strings.Builder
	for i := range 600 {
		if i > 0 {
			authors.WriteByte(',')
		}
		fmt.Fprintf(&authors, `"%064x"`, i)
	}
	filter := `{"authors":[` + authors.String() + `],"kinds":[1]}`
	wide := `["REQ","wide%d"` + strings.Repeat(","+filter, 10) + `]`
	if len(wide) > defaultFilterFrameSize {
		// Ten filters of 600 authors are over the frame bound: the largest
		// forwardable REQ has as many filters as fit.
		n := (defaultFilterFrameSize - 32) / (len(filter) + 1)
		wide = `["REQ","wide%d"` + strings.Repeat(","+filter, n) + `]`
	}
	// Three rounds of each, a minute apart: what a client may send in three
	// minutes, every budget full at the start of each round. Every REQ
	// gets one answer: CLOSED from the gate, or EOSE from khatru.
	const perRound, rounds = 40, 3
	var refusedMany, admittedWide int
	for r := range 2 * rounds {
		req := many
		if r >= rounds {
			req = wide
		}
		clk.Advance(time.Minute)
		for i := range perRound {
			if err := c.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, req, r*perRound+i)); err != nil {
				t.Fatal(err)
			}
		}
		for range perRound {
			got := readText(t, c)
			switch {
			case strings.HasPrefix(got, `["CLOSED","many`):
				if !strings.Contains(got, scan.ReasonFilters) && !strings.Contains(got, "rate-limited:") {
					t.Errorf("many-filter REQ answered %s", got)
				}
				refusedMany++
			case strings.HasPrefix(got, `["EOSE","wide`):
				admittedWide++
			case strings.HasPrefix(got, `["EOSE","many`): // counted below
			case strings.HasPrefix(got, `["CLOSED","wide`):
			default:
				t.Fatalf("unexpected answer %s", got)
			}
		}
	}
	after := heapInUse()
	grew := int64(after) - int64(before)
	t.Logf("heap %d -> %d MiB (%d wide REQs admitted)", before>>20, after>>20, admittedWide)
	if grew > 64<<20 {
		t.Errorf("the relay's heap grew by %d MiB, want at most 64", grew>>20)
	}
	if refusedMany != perRound*rounds {
		t.Errorf("%d of %d REQs of 10,000 filters were refused", refusedMany, perRound*rounds)
	}
	if admittedWide == 0 {
		t.Error("no wide REQ within the limits was admitted: the test measures nothing")
	}
}
