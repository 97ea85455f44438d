package redisstore

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/sluice-relay/sluice/ratelimit"
)

// replyErr is an error reply as go-redis hands it back (a redis.Error).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestIsPerKey: errors about one key are told apart from Redis not
// answering, however they are wrapped — the binary's outage log relies on it.
func TestIsPerKey(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"malformed reply", fmt.Errorf("%w: %w: got nil", ratelimit.ErrUnavailable, errBadReply), true},
		{"script refusal", fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, replyErr("ERR sluice ewma: malformed value")), true},
		{"crossslot", fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, replyErr("CROSSSLOT Keys in request don't hash to the same slot")), true},
		{"other reply error", fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, replyErr("LOADING Redis is loading the dataset")), false},
		{"timeout", fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, context.DeadlineExceeded), false},
		{"refused", fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, syscall.ECONNREFUSED), false},
		{"breaker", fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, errBreakerOpen), false},
		{"nil", nil, false},
		{"unwrapped script refusal", replyErr("ERR sluice ewma: x"), true},
		{"prefix elsewhere", errors.New("dial: ERR sluice ewma: x"), false},
	} {
		if got := IsPerKey(c.err); got != c.want {
			t.Errorf("%s: IsPerKey(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
