package charge

import "strings"

// Aggregates returns the prefixes of the aggregates the address of an
// address Subject falls in ("2001:db8:1::/48"), as the penalty box keys
// them: none for a member's Subject, an allow-listed one, or an address of
// the other family.
func (s *Subject) Aggregates() []string {
	var out []string
	for _, a := range s.aggs {
		if pfx, ok := strings.CutPrefix(a.label, "prefix "); ok {
			out = append(out, pfx)
		}
	}
	return out
}
