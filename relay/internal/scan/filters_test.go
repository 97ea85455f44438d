package scan

import (
	"github.com/sluice-relay/sluice/relay/wire"
	"slices"
	"strings"
	"testing"
)

// Filters reads each filter's shape as Scan read it, and nothing of a
// frame that holds no filters.
func TestFilters(t *testing.T) {
	id := `"0000000000000000000000000000000000000000000000000000000000000001"`
	for _, c := range []struct {
		frame string
		want  []Filter
	}{
		{`["REQ","s",{"ids":[` + id + `]},{"kinds":[1],"limit":500,"since":10,"until":20},{"#t":["x"],"authors":[]}]`, []Filter{
			{IDs: true, Limit: -1, Since: -1, Until: -1},
			{Limit: 500, Since: 10, Until: 20},
			{Tags: true, Limit: -1, Since: -1, Until: -1},
		}},
		{`["COUNT","c",{"authors":[` + id + `],"limit":0}]`, []Filter{{Authors: true, Limit: 0, Since: -1, Until: -1}}},
		{`["NEG-OPEN","n",{"kinds":[1]},"6100000200"]`, []Filter{{Limit: -1, Since: -1, Until: -1}}},
		{`["EVENT",{}]`, nil},
		{`["CLOSE","s"]`, nil},
		{`[`, nil},
		{``, nil},
	} {
		got := slices.Collect(Filters([]byte(c.frame), nil))
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.frame, got, c.want)
		}
		// What Scan keeps of a canonical frame is what Filters reads.
		if facts, reason := Scan([]byte(c.frame), nil); reason == "" {
			if shapes, ok := facts.Shapes(); !ok || !slices.Equal(shapes, c.want) {
				t.Errorf("%s: Scan kept %+v (%v), want %+v", c.frame, shapes, ok, c.want)
			}
		}
	}
	n := 0
	for range Filters([]byte(`["REQ","s",{},{},{}]`), nil) {
		n++
		break
	}
	if n != 1 {
		t.Errorf("a loop that breaks read %d filters", n)
	}
}

// A frame with more filters than Facts keeps (a MaxFilters above the
// default) has no kept shapes: its price reads them again.
func TestShapesPastKept(t *testing.T) {
	frame := []byte(`["REQ","s"` + strings.Repeat(`,{"limit":1}`, wire.DefaultBounds().MaxFilters+1) + `]`)
	facts, reason := Scan(frame, &wire.Bounds{MaxFilters: wire.DefaultBounds().MaxFilters + 1})
	if reason != "" {
		t.Fatal(reason)
	}
	if _, ok := facts.Shapes(); ok {
		t.Error("Shapes reports filters it did not keep")
	}
	if n := len(slices.Collect(Filters(frame, &wire.Bounds{MaxFilters: wire.DefaultBounds().MaxFilters + 1}))); n != wire.DefaultBounds().MaxFilters+1 {
		t.Errorf("Filters read %d filters", n)
	}
}
