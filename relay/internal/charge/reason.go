package charge

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// QuotaReason is the refusal of an EVENT whose actor has spent q, its
// quota, for wait: "rate-limited:" as for every limit, then which budget
// refused, so that a client (and its user) can tell a spent quota, which
// lasts the rest of its window, from a message rate, which lasts seconds:
//
//	rate-limited: quota: 600 events per 60s for this pubkey; retry in 43s
//
// The gate and the hooks answer with it alike. A nil q gives
// scan.RateLimitedReason.
func QuotaReason(q ratelimit.ActorQuota, wait time.Duration) string {
	if q == nil {
		return scan.RateLimitedReason(wait)
	}
	return fmt.Sprintf("rate-limited: quota: %d events per %ss for this pubkey; retry in %ds",
		q.Events(), strconv.FormatFloat(q.Window().Seconds(), 'f', -1, 64), scan.RetrySeconds(wait))
}
