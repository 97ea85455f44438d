package wire

// Defaults of Bounds, each what a zero field means (DefaultBounds).
const (
	// defaultMaxFilters is the most filter objects one REQ may hold: every
	// filter is a query the relay runs, and clients send one to a few.
	defaultMaxFilters = 10
	// defaultMaxTags is the most tags one event may carry: strfry's
	// maxNumTags. An event store that indexes every tag can pay for each
	// tag once per other tag (eventstore's badger looks each one up among
	// all of them), so the count must be bounded, not only the bytes.
	defaultMaxTags = 2000
	// defaultMaxTagValueBytes is the longest value, in bytes as written,
	// of a tag named by one letter, the tags relays index: strfry's
	// maxTagValSize.
	defaultMaxTagValueBytes = 1024
	// defaultMaxFilterValues is the most values one field of a filter may
	// list (ids, authors, kinds, each #<letter>). A follow feed lists the
	// follows as authors: a few hundred for most accounts, a few thousand
	// for the largest, so 5,000 passes every one we know of (the gate's
	// default 64 KiB REQ already holds fewer than 1,000 authors). It
	// stops short values: 16,000 kinds fit a 64 KiB REQ.
	defaultMaxFilterValues = 5000
	// defaultMaxFanout is the most index scans one filter may make the
	// relay's store open (see Fanout): a follow feed of 2,500 authors
	// over 20 kinds, or 5,000 over 10. Clients (nostr-tools, NDK,
	// Amethyst-class feeds) ask one to two thousand authors over a handful
	// of kinds, so they pass by a margin; a filter of every author it can
	// fit over thousands of kinds, millions of scans, does not.
	defaultMaxFanout = 50000
)

// Bounds are what Scan lets one frame ask of the relay behind the gate,
// beyond its shape. A zero field means its default (DefaultBounds); a nil
// *Bounds means every default. A Bounds is only read by Scan.
type Bounds struct {
	// MaxFilters bounds the filters of a REQ (a COUNT and a NEG-OPEN hold
	// exactly one).
	MaxFilters int
	// MaxTags bounds the tags of an EVENT or AUTH event.
	MaxTags int
	// MaxTagValueBytes bounds the value (the second element), in bytes as
	// written between its quotes, of a tag whose name is one ASCII letter.
	MaxTagValueBytes int
	// MaxFilterValues bounds the values of each field of a filter: ids,
	// authors, kinds and each #<letter>.
	MaxFilterValues int
	// MaxFanout bounds the index scans one filter asks for, counted as
	// Fanout counts them.
	MaxFanout int
}

// DefaultBounds returns the Bounds a zero field or a nil *Bounds means:
// 10 filters per REQ, 2,000 tags per event, 1,024 bytes per one-letter
// tag value, 5,000 values per filter field and 50,000 index scans per
// filter.
func DefaultBounds() Bounds {
	return Bounds{
		MaxFilters:       defaultMaxFilters,
		MaxTags:          defaultMaxTags,
		MaxTagValueBytes: defaultMaxTagValueBytes,
		MaxFilterValues:  defaultMaxFilterValues,
		MaxFanout:        defaultMaxFanout,
	}
}

// resolved returns b with every zero field at its default.
func (b *Bounds) resolved() Bounds {
	var r Bounds
	if b != nil {
		r = *b
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&r.MaxFilters, defaultMaxFilters)
	def(&r.MaxTags, defaultMaxTags)
	def(&r.MaxTagValueBytes, defaultMaxTagValueBytes)
	def(&r.MaxFilterValues, defaultMaxFilterValues)
	def(&r.MaxFanout, defaultMaxFanout)
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
