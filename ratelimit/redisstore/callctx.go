package redisstore

import (
	"context"
	"time"
)

// callContext returns the context a round trip runs under: the caller's
// values and the call's own deadline, but not the caller's cancellation.
// go-redis reads only its deadline (for the socket) and its Done channel
// (waiting for a pooled connection, sleeping between retries), so a call
// whose caller gave up still ends by its own deadline, at most the store's
// Timeout later, and its result is dropped. The store judges a caller's
// cancellation on the caller's own context (see Store.direct). It is an
// ordinary context: a client hook may keep it and read it after the call.
func callContext(parent context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.WithoutCancel(parent), deadline)
}
