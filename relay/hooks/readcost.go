package hooks

import (
	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// price is what filter costs by its shape (policy.ReadCost), as a Gate
// prices the same filter. Hooks see no more than the filter: what the
// relay then sends back is not seen here, so the read budget
// (policy.Limits.Read) is not charged through hooks; only the shape is.
func (h *Hooks) price(f *nostr.Filter) int {
	shape := scan.Filter{
		IDs:     len(f.IDs) > 0,
		Authors: len(f.Authors) > 0,
		Limit:   -1, Since: -1, Until: -1,
	}
	for _, vs := range f.Tags {
		shape.Tags = shape.Tags || len(vs) > 0
	}
	if f.Limit > 0 || f.LimitZero {
		shape.Limit = int64(f.Limit)
	}
	if f.Since != nil {
		shape.Since = int64(*f.Since)
	}
	if f.Until != nil {
		shape.Until = int64(*f.Until)
	}
	return h.p.PriceFilter(shape, h.lim.Now())
}

// prices is the sum of the prices of filters, at least 1.
func (h *Hooks) prices(filters nostr.Filters) int {
	n := 0
	for i := range filters {
		n += h.price(&filters[i])
	}
	return max(n, 1)
}
