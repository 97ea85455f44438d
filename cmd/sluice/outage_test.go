package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluice-relay/sluice/ratelimit"
)

// redisReply stands in for a go-redis error reply (redis.Error).
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

// TestOutageLogPerKey: errors about one key (a corrupt value, CROSSSLOT, a
// malformed reply) and a client leaving mid-decision are not an outage;
// a timeout or refused connection is, until a ping answers.
func TestOutageLogPerKey(t *testing.T) {
	var buf bytes.Buffer
	errs := new(storeErrors)
	pingErr := errors.New("dial tcp: connection refused")
	o := &outageLog{
		errs:    errs,
		ping:    func(context.Context) error { return pingErr },
		breaker: func() string { return "open" },
		logger:  slog.New(slog.NewTextHandler(&buf, nil)),
	}
	ctx := context.Background()

	errs.observe(nil)
	errs.observe(redisReply("ERR sluice ewma: malformed stored value"))
	errs.observe(redisReply("CROSSSLOT Keys in request don't hash to the same slot"))
	errs.observe(fmt.Errorf("%w: reply is not a list", ratelimit.ErrBadReply))
	errs.observe(fmt.Errorf("decide: %w", context.Canceled))
	o.step(ctx)
	out := buf.String()
	if strings.Contains(out, "unavailable:") || strings.Contains(out, "level=ERROR") {
		t.Fatalf("per-key errors logged as an outage:\n%s", out)
	}
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "refused_calls=3") {
		t.Fatalf("per-key errors not logged as 3 refused calls at warn:\n%s", out)
	}

	// The same count again: no new line.
	buf.Reset()
	o.step(ctx)
	if buf.Len() != 0 {
		t.Fatalf("nothing new, yet logged:\n%s", buf.String())
	}

	errs.observe(redisReply("LOADING Redis is loading the dataset in memory"))
	errs.observe(context.DeadlineExceeded)
	o.step(ctx)
	if out := buf.String(); !strings.Contains(out, "store unavailable") || !strings.Contains(out, "failed_calls=2") {
		t.Fatalf("outage not logged with 2 failed calls:\n%s", out)
	}
	buf.Reset()
	o.step(ctx) // ping fails: still failing, nothing logged
	if buf.Len() != 0 {
		t.Fatalf("still failing, yet logged:\n%s", buf.String())
	}
	pingErr = nil
	o.step(ctx)
	if !strings.Contains(buf.String(), "answers again") {
		t.Fatalf("recovery not logged:\n%s", buf.String())
	}
}
