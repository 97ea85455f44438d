package scan

import "github.com/sluice-relay/sluice/relay/wire"

import "iter"

// Filter is the shape of one filter as Scan read it: what prices a read
// (a REQ, COUNT or NEG-OPEN filter) before the relay runs it.
type Filter struct {
	// IDs, Authors and Tags say the filter lists at least one id, author
	// or value of a #<letter> tag: an index narrows what the relay reads.
	IDs, Authors, Tags bool
	// Limit, Since and Until are those fields' values, -1 when absent.
	Limit, Since, Until int64
}

// Shapes returns the shape of each filter of a REQ, COUNT or NEG-OPEN
// that Scan found canonical, as Filters yields them, without reading the
// frame again; ok is false when the frame held more filters than Facts
// keeps (a MaxFilters above the default): Filters reads those.
func (f *Facts) Shapes() (shapes []Filter, ok bool) {
	if f.Filters > len(f.shapes) {
		return nil, false
	}
	return f.shapes[:f.Filters], true
}

// Filters yields the shape of each filter of frame, a REQ, COUNT or
// NEG-OPEN that Scan found canonical under b; of any other frame it
// yields nothing or what it read before the frame's fault. It runs Scan's
// own filter reader over the frame again, so the two cannot disagree on
// what a filter asks.
func Filters(frame []byte, b *wire.Bounds) iter.Seq[Filter] {
	return func(yield func(Filter) bool) {
		p := Peek(frame)
		switch {
		case !p.shaped:
			return
		case p.Type != wire.TypeREQ && p.Type != wire.TypeCOUNT && p.Type != wire.TypeNEGOPEN:
			return
		}
		if len(frame) < len(prefixes[p.Type]) {
			return
		}
		s := scanner{b: frame, i: len(prefixes[p.Type]), lim: resolve(b)}
		s.ws()
		if _, reason := s.subID(); reason != "" {
			return
		}
		for {
			s.ws()
			if !s.eat(',') {
				return
			}
			s.ws()
			if s.b[min(s.i, len(s.b)-1)] != '{' || s.filter() != "" {
				return // a NEG-OPEN's payload follows its one filter
			}
			if !yield(s.shape) {
				return
			}
		}
	}
}
