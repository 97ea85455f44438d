package wire_test

import (
	"fmt"

	"github.com/sluice-relay/sluice/relay/wire"
)

// Types index per-type settings; a Bounds field left zero means its
// default.
func ExampleBounds() {
	var perType [wire.NumTypes]int
	perType[wire.TypeREQ] = 50
	b := wire.Bounds{MaxFilters: 4}
	fmt.Println(wire.TypeREQ, perType[wire.TypeREQ], b.MaxFilters, wire.DefaultBounds().MaxFanout)
	// Output:
	// REQ 50 4 50000
}
