// Package redisstore is the Redis ratelimit.Store: every window of one key
// is decided in one atomic Lua script (package scripts) on a go-redis v9
// UniversalClient, so a standalone, Sentinel or Cluster deployment shares
// one budget per client across every gate instance. NewClient builds a
// client from a URL; New makes the Store; NewQuota builds on it the actor
// quota, one budget per actor shared by every instance.
//
// The Redis encoding lives here and nowhere else: a decision's windows
// share one key, "<prefix>{<client>}:message:<TYPE>:<period_ms>…:bin",
// whose value packs the instant of the last write and one score per window
// as little-endian doubles; the script's arguments are packed the same
// way. Time is Redis TIME, the one clock every instance shares, unless the
// caller passes an instant (tests do).
//
// Every call has its own deadline (Options.Timeout), and any failure — a
// timeout, a refused connection, an open breaker, a reply that is not the
// script's — is an error wrapping ratelimit.ErrUnavailable, never a
// refusal and never a score of zero: the caller fails closed. The script
// is idempotent by request id, so go-redis's retries never charge a client
// twice; a call that Redis runs past its deadline's cutoff writes nothing.
// A deadline counts only the time the gate ran: after a stall of the
// gate's own process, a call is given the time lost back, once (see
// stallMeter).
//
// A breaker that counts round trips, not decisions, stops calling Redis
// during an outage and probes until it answers again; on a Cluster each
// master has its own, so one master's failure refuses only the clients
// whose slots it serves. With Options.Batch, concurrent decisions share
// round trips and, on one Redis or one Cluster master, script calls, each
// still bounded by its own deadline.
//
// docs/redis.md describes the keys, the arguments, the breaker, the
// Cluster handling and the batching for operators. A Store is safe for
// concurrent use; the client stays the caller's to close.
package redisstore
