package scan

import "github.com/sluice-relay/sluice/relay/wire"

// resolve returns b with every zero field at its default (a nil b: all
// of them).
func resolve(b *wire.Bounds) wire.Bounds {
	var r wire.Bounds
	if b != nil {
		r = *b
	}
	d := wire.DefaultBounds()
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&r.MaxFilters, d.MaxFilters)
	def(&r.MaxTags, d.MaxTags)
	def(&r.MaxTagValueBytes, d.MaxTagValueBytes)
	def(&r.MaxFilterValues, d.MaxFilterValues)
	def(&r.MaxFanout, d.MaxFanout)
	return r
}

// filterCounts are the values a filter lists, per field, as far as its
// index fan-out depends on them.
type filterCounts struct {
	ids, authors, kinds int
	// tags: the filter has a #<letter> field; narrow: one whose letter
	// eventstore's planner prefers to authors and kinds (narrowTag).
	// tagMax and narrowMax are the most values of any such field.
	tags, narrow      bool
	tagMax, narrowMax int
}

// narrowTag reports whether eventstore's badger planner ranks a tag of
// letter c above authors and kinds (a "goodness" of 3 or more in
// ChooseNarrowestTag): it then scans that tag's index and reads authors
// and kinds as a post-filter.
func narrowTag(c byte) bool {
	switch c {
	case 'e', 'E', 'q', 'a', 'A', 'i', 'I', 'g', 'r', 'd', 'h', 't', 'l', 'k', 'K':
		return true
	}
	return false
}

// fanout is the number of index scans (iterators) eventstore's badger
// query planner opens for a filter with these counts (prepareQueries in
// eventstore v0.17.2, badger/query_planner.go):
//
//   - ids: one scan per id, whatever else the filter says;
//   - else, with a narrow tag field, or with tag fields and neither
//     authors nor kinds: one scan per value of the one tag field it picks.
//     It ranks the letters in a map's order, so among equals fanout counts
//     the field with the most values;
//   - else authors × kinds, authors, kinds, or one scan of everything.
//
// Counting the planner's figure rather than a product of every field
// passes the filters whose narrow tag makes authors and kinds a
// post-filter. (Its lmdb planner also crosses a tag's values with kinds;
// both factors are bounded by MaxFilterValues.)
func (c *filterCounts) fanout() int {
	switch {
	case c.ids > 0:
		return c.ids
	case c.narrow:
		return c.narrowMax
	case c.tags && c.authors == 0 && c.kinds == 0:
		return c.tagMax
	case c.authors > 0 && c.kinds > 0:
		return c.authors * c.kinds
	case c.authors > 0:
		return c.authors
	case c.kinds > 0:
		return c.kinds
	}
	return 1
}
