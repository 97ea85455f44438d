package scan_test

import (
	"fmt"
	"time"

	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// A frame is peeked for its type, then scanned once; a refusal is answered in the shape NIP-01 wants
// for its type, with the wait rounded up to whole seconds.
func ExampleScan() {
	frame := []byte(`["REQ","feed",{"kinds":[1],"limit":20}]`)
	p := scan.Peek(frame)
	f, reason := scan.Scan(frame, nil)
	if reason != "" {
		fmt.Println("refused:", reason)
		return
	}
	fmt.Printf("%v %s, %d filter(s)\n", p.Type, f.SubID, f.Filters)
	reply := scan.AppendRateLimited(nil, p.Frame(), 17*time.Second+time.Millisecond)
	fmt.Printf("%s\n", reply)
	// Output:
	// REQ "feed", 1 filter(s)
	// ["CLOSED","feed","rate-limited: slow down; retry in 18s"]
}
