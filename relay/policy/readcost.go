package policy

import (
	"fmt"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
)

// ReadCost prices a read by its shape before it reaches the relay: each
// filter of a REQ, COUNT or NEG-OPEN costs one of three prices, and the
// frame is charged the sum to its type's windows in the same decision as
// the frame (a REQ of price n costs what n one-filter REQs do; the sum is
// capped just under the smallest burst of the type's windows, so every
// frame is admissible from rest). Each zero field means its default.
//
//	shape                                                  price
//	ids; or authors or a #tag, limit absent or ≤ ScrapeLimit   Narrow (1)
//	authors or a #tag with a limit above ScrapeLimit          Wide   (2)
//	none of these, limit ≤ ScrapeLimit and span ≤ ScrapeSpan  Wide   (2)
//	none of these, limit above ScrapeLimit or span above      Scrape (10)
//	ScrapeSpan (until − since; no since: open-ended)
//
// A filter with "limit": 0 asks for no stored events and is Narrow. The
// scrape is chorus's definition: an index narrows nothing and the relay
// reads many events or a long stretch of time.
type ReadCost struct {
	// Narrow, Wide and Scrape are the prices, each at least 1 and
	// Narrow ≤ Wide ≤ Scrape ≤ 1000. Defaults 1, 2, 10.
	Narrow, Wide, Scrape int
	// ScrapeLimit is the largest limit that is not a scrape: default 100.
	ScrapeLimit int
	// ScrapeSpan is the longest span that is not a scrape: default 2h.
	ScrapeSpan time.Duration
}

// Resolved returns r with every zero field at its default: the table in
// force, for `sluice check` and NIP-11.
func (r ReadCost) Resolved() ReadCost {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&r.Narrow, 1)
	def(&r.Wide, 2)
	def(&r.Scrape, 10)
	def(&r.ScrapeLimit, 100)
	if r.ScrapeSpan == 0 {
		r.ScrapeSpan = 2 * time.Hour
	}
	return r
}

// maxReadPrice bounds a price: a filter costs at most this many REQs.
const maxReadPrice = 1000

func (r ReadCost) validate(errs *fieldErrors, path string) {
	res := r.Resolved()
	for _, f := range []struct {
		name string
		v    int
	}{{"Narrow", r.Narrow}, {"Wide", r.Wide}, {"Scrape", r.Scrape}} {
		if f.v < 0 || f.v > maxReadPrice {
			errs.addf(path+"."+f.name, "must be between 0 (its default) and %d, got %d", maxReadPrice, f.v)
		}
	}
	if res.Narrow > res.Wide || res.Wide > res.Scrape {
		errs.addf(path, "prices must rise: narrow %d ≤ wide %d ≤ scrape %d", res.Narrow, res.Wide, res.Scrape)
	}
	if r.ScrapeLimit < 0 {
		errs.addf(path+".ScrapeLimit", "must not be negative, got %d", r.ScrapeLimit)
	}
	if r.ScrapeSpan < 0 {
		errs.addf(path+".ScrapeSpan", "must not be negative, got %v", r.ScrapeSpan)
	}
}

// minReadRate is the smallest rate of a read window (Limits.Read), in
// bytes: the gate settles what it sent in charges of up to half of it,
// and one must be admissible from rest.
const minReadRate = 1 << 20

// checkRead checks the read windows at path: windows as every budget's,
// each with a rate of at least minReadRate bytes and cost 1 (a byte).
func checkRead(errs *fieldErrors, path string, ls []ratelimit.Limit) {
	checkWindows(errs, path, ls)
	for i, l := range ls {
		if l.Rate < minReadRate {
			errs.addf(fmt.Sprintf("%s[%d].Rate", path, i), "a read window allows at least %d bytes, got %v", minReadRate, l.Rate)
		}
		if l.Cost != 0 && l.Cost != 1 {
			errs.addf(fmt.Sprintf("%s[%d].Cost", path, i), "a read window is charged by the byte: cost 1, got %v", l.Cost)
		}
	}
}
