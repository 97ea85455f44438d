package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluice-relay/sluice/ratelimit/redisstore"
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
	errs.observe(redisReply("ERR sluice ewma: bad window count in limit list 1"))
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

// pingingLog is an outageLog whose ping always answers, whose breaker is
// in state breaker, and whose round trips and failed ones so far are
// *trips and *failures; it logs into buf.
func pingingLog(breaker string, trips, failures *uint64) (o *outageLog, errs *storeErrors, buf *bytes.Buffer) {
	errs, buf = new(storeErrors), new(bytes.Buffer)
	o = &outageLog{
		errs:    errs,
		ping:    func(context.Context) error { return nil },
		trips:   func() (uint64, uint64) { return *trips, *failures },
		breaker: func() string { return breaker },
		logger:  slog.New(slog.NewTextHandler(buf, nil)),
	}
	return o, errs, buf
}

// TestOutageLogTrustsDecisions: while decisions keep failing the log does
// not say "answers again", even though a ping answers (a Redis too slow
// for every decision still answers a ping given two seconds); it does once
// round trips succeed with none failing. Decisions that expired in
// sluice's own queue are logged as its overload, not as an outage.
func TestOutageLogTrustsDecisions(t *testing.T) {
	var trips, failures uint64
	o, errs, buf := pingingLog("closed", &trips, &failures)
	ctx := context.Background()

	errs.observe(fmt.Errorf("decide: %w", redisstore.ErrOverloaded))
	o.step(ctx)
	if out := buf.String(); strings.Contains(out, "store unavailable") || !strings.Contains(out, "overloaded") || !strings.Contains(out, "expired=1") {
		t.Fatalf("own-queue expiry not logged as overload:\n%s", out)
	}
	buf.Reset()

	errs.observe(context.DeadlineExceeded)
	trips, failures = 10, 10
	o.step(ctx)
	if !strings.Contains(buf.String(), "store unavailable") {
		t.Fatalf("outage not logged:\n%s", buf.String())
	}
	buf.Reset()
	// The ping answers, but decisions fail: still an outage.
	errs.observe(context.DeadlineExceeded)
	trips, failures = 20, 20
	o.step(ctx)
	if strings.Contains(buf.String(), "answers again") {
		t.Fatalf("logged recovery while decisions fail:\n%s", buf.String())
	}
	trips = 30 // ten answered, none failed
	o.step(ctx)
	if !strings.Contains(buf.String(), "answers again") {
		t.Fatalf("recovery not logged when round trips succeed:\n%s", buf.String())
	}
}

// TestOutageLogOnce: one outage is one "unavailable" line and one "answers
// again" line, even while the breaker refuses without round trips and a
// ping answers (before a1c28de a ping alone said "answers again", and the
// next refused decision began a second outage: two of each per outage).
func TestOutageLogOnce(t *testing.T) {
	var trips, failures uint64
	o, errs, buf := pingingLog("open", &trips, &failures)
	ctx := context.Background()
	fail := func(n int) {
		for range n {
			errs.observe(context.DeadlineExceeded)
		}
	}
	fail(5) // round trips time out; the breaker opens
	trips, failures = 5, 5
	o.step(ctx)
	for range 3 { // the breaker refuses without calling Redis
		fail(10)
		o.step(ctx)
	}
	trips, failures = 6, 5 // its probe succeeds
	o.step(ctx)
	trips = 40 // decisions flow again
	o.step(ctx)
	o.step(ctx) // idle: the ping answers, nothing to say
	out := buf.String()
	if n := strings.Count(out, "store unavailable"); n != 1 {
		t.Errorf("%d \"unavailable\" lines, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "answers again"); n != 1 {
		t.Errorf("%d \"answers again\" lines, want 1:\n%s", n, out)
	}
}
