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

// MaxSubIDBytes is the longest subscription id a canonical frame may
// carry: NIP-01's 64 characters, counted in bytes (a canonical id is
// written without escapes, and is ASCII in every client we know).
const MaxSubIDBytes = 64
