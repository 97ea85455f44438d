package redisstore

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

var twoWindows = storetest.MustWindows(ratelimit.PerPeriod(10, time.Second), ratelimit.PerPeriod(240, time.Minute))

// sc is a reply's scores as the script packs them: t, then the scores.
func sc(scores ...float64) string { return stored(storetest.T0.UnixMilli(), scores) }

// TestParseReplyHostile: every reply that is not exactly {wait, value
// holding the scores} is an error wrapping errBadReply and ErrUnavailable —
// never a decision, and above all never a zero score.
func TestParseReplyHostile(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for name, reply := range map[string]any{
		"nil":                 nil,
		"string":              "OK",
		"int":                 int64(1),
		"int -1":              int64(-1),
		"int 2^40":            int64(1 << 40),
		"empty":               []any{},
		"wait only":           []any{int64(0)},
		"three elements":      []any{int64(0), sc(1, 1), sc(1, 1)},
		"one score short":     []any{int64(0), sc(1)},
		"cut in a score":      []any{int64(0), sc(1, 1)[:23]},
		"no t":                []any{int64(0), sc(1, 1)[8:]},
		"wait -2":             []any{int64(-2), sc(1, 1)},
		"wait -1, not ours":   []any{int64(-1), "ERR something else"},
		"wait -1, no message": []any{int64(-1), nil},
		"wait -1, a value":    []any{int64(-1), sc(1, 1)},
		"wait string":         []any{"5", sc(1, 1)},
		"wait nil":            []any{nil, sc(1, 1)},
		"refused forever":     []any{int64(1<<40 + 1), sc(1, 1)},
		"scores nil":          []any{int64(0), nil},
		"scores int":          []any{int64(0), int64(1)},
		"score nan":           []any{int64(0), sc(nan, 1)},
		"score inf":           []any{int64(0), sc(1, inf)},
		"score -inf":          []any{int64(0), sc(-inf, 1)},
		"score negative":      []any{int64(0), sc(-0.5, 1)},
		"scores nested":       []any{int64(0), []any{sc(1, 1)}},
		"redis error element": []any{int64(0), redis.Nil},
	} {
		scores := []float64{-1, -1}
		d, err := parseReply(reply, twoWindows.Len(), scores)
		if !errors.Is(err, errBadReply) || !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Errorf("%s: %+v, err = %v; want errBadReply and ErrUnavailable", name, d, err)
		}
		if d != (ratelimit.Decision{}) {
			t.Errorf("%s: a decision came back with the error: %+v", name, d)
		}
		for i, f := range scores {
			if f == 0 {
				t.Errorf("%s: score %d read as zero: %v", name, i, scores)
			}
		}
		if d, err := parseReply(reply, twoWindows.Len(), nil); err == nil || d != (ratelimit.Decision{}) {
			t.Errorf("%s without scores: %+v, %v", name, d, err)
		}
	}
}

// TestParseReplyBareAdmission: the lean script's bare 0 (an admission
// whose scores were not asked for) is admitted without scores, and a bad
// reply when scores were asked for: the script was told to send them.
func TestParseReplyBareAdmission(t *testing.T) {
	if d, err := parseReply(int64(0), twoWindows.Len(), nil); err != nil || d != (ratelimit.Decision{Allowed: true}) {
		t.Fatalf("bare 0 without scores: %+v, %v", d, err)
	}
	scores := []float64{-1, -1}
	if d, err := parseReply(int64(0), twoWindows.Len(), scores); !errors.Is(err, errBadReply) || d != (ratelimit.Decision{}) || scores[0] != -1 {
		t.Fatalf("bare 0 with scores asked: %+v, %v, %v", d, err, scores)
	}
	// The batch script's bare admission: 0, 0 — and nothing like it.
	if d, err := parseReply([]any{int64(0), int64(0)}, twoWindows.Len(), nil); err != nil || d != (ratelimit.Decision{Allowed: true}) {
		t.Fatalf("0, 0 without scores: %+v, %v", d, err)
	}
	for _, bad := range []struct {
		reply  []any
		scores []float64
	}{
		{[]any{int64(0), int64(0)}, scores}, // 0, 0 when the scores were asked for
		{[]any{int64(5), int64(0)}, nil},
		{[]any{int64(0), int64(1)}, nil},
	} {
		if d, err := parseReply(bad.reply, twoWindows.Len(), bad.scores); !errors.Is(err, errBadReply) || d != (ratelimit.Decision{}) {
			t.Errorf("%v (scores asked: %v): %+v, %v, want a bad reply", bad.reply, bad.scores != nil, d, err)
		}
	}
}

func TestParseReplyGood(t *testing.T) {
	scores := make([]float64, twoWindows.Len())
	d, err := parseReply([]any{int64(1234), sc(10, 7.5000000000000009)}, twoWindows.Len(), scores)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Wait != 1234*time.Millisecond || scores[0] != 10 || scores[1] != 7.5000000000000009 {
		t.Errorf("got %+v %v", d, scores)
	}
	// Admitted; request ids after the scores are not scores.
	d, err = parseReply([]any{int64(0), sc(0, 1e-300) + "0123456789abcdef"}, twoWindows.Len(), scores)
	if err != nil || !d.Allowed || d.Wait != 0 || scores[0] != 0 || scores[1] != 1e-300 {
		t.Errorf("got %+v %v %v", d, scores, err)
	}
	// Without a scores slice the decision is the same.
	d, err = parseReply([]any{int64(1234), sc(10, 7.5000000000000009)}, twoWindows.Len(), nil)
	if err != nil || d.Allowed || d.Wait != 1234*time.Millisecond {
		t.Errorf("without scores: got %+v %v", d, err)
	}
}

// replaceReply is a go-redis hook that lets the script run and then
// replaces its reply with v, as a server speaking another protocol would.
type replaceReply struct{ v any }

func (h replaceReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h replaceReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h replaceReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && err == nil {
			c.SetVal(h.v)
		}
		return err
	}
}

// TestWrongShapeThroughClient: a wrong-shaped reply arriving through a real
// client is an error, and counts as a failure for the breaker.
func TestWrongShapeThroughClient(t *testing.T) {
	m, _ := realRedis(t)
	for name, v := range map[string]any{
		"truncated":   []any{int64(0), sc(1)},
		"integer one": []any{int64(0), int64(1)}, // 0, 0 is a bare admission
		"wait, zero":  []any{int64(7), int64(0)},
		"nan":         []any{int64(0), sc(math.NaN(), 1)},
		"status":      "OK",
	} {
		c := client(t, m.Addr())
		c.AddHook(replaceReply{v})
		s := newStore(t, c, Options{Timeout: slow.Timeout, breaker: breakerOptions{Failures: 2}})
		for i := range 2 {
			d, err := s.Decide(context.Background(), "{shape}:message:EVENT", twoWindows, storetest.T0)
			if !errors.Is(err, errBadReply) || !errors.Is(err, ratelimit.ErrUnavailable) {
				t.Errorf("%s #%d: %+v %v, want errBadReply", name, i, d, err)
			}
		}
		if st := s.breakerNow(); st != breakerOpen {
			t.Errorf("%s: breaker %v after 2 bad replies, want open", name, st)
		}
	}
}

// TestParseReplyRefusal: a -1 flag with the script's own message is that
// decision's refusal — an error wrapping errBadReply that IsPerKey (Redis
// answered) — and a -1 with any other message is not.
func TestParseReplyRefusal(t *testing.T) {
	d, err := parseReply([]any{int64(-1), "ERR sluice ewma: malformed value at k"}, twoWindows.Len(), nil)
	if !errors.Is(err, errBadReply) || !errors.Is(err, ratelimit.ErrUnavailable) || !isScriptRefusal(err) || !IsPerKey(err) || d.Allowed {
		t.Errorf("script refusal: %+v, %v", d, err)
	}
	if _, err := parseReply([]any{int64(-1), "ERR something else"}, twoWindows.Len(), nil); isScriptRefusal(err) {
		t.Errorf("a -1 with another message counted as the script's refusal: %v", err)
	}
}

// TestSplitHostile: a batched call's reply that is not one flat array of
// exactly 2 elements per decision is an error for every decision
// of the call; a well-formed one is cut at the right places.
func TestSplitHostile(t *testing.T) {
	s := newStore(t, client(t, "127.0.0.1:1"), Options{})
	one := storetest.MustWindows(ratelimit.PerPeriod(5, time.Second))
	reqs := []*request{s.request("{a}:message:EVENT", twoWindows, time.Time{}), s.request("{b}:message:REQ", one, time.Time{})}
	for name, reply := range map[string]any{
		"nil":            nil,
		"string":         "OK",
		"empty":          []any{},
		"one decision":   []any{int64(0), sc(1, 1)},
		"one short":      []any{int64(0), sc(1, 1), int64(0)},
		"one too many":   []any{int64(0), sc(1, 1), int64(0), sc(1), int64(0)},
		"nested":         []any{[]any{int64(0), sc(1, 1)}, []any{int64(0), sc(1)}},
		"redis.Nil":      redis.Nil,
		"a map of reply": map[any]any{"a": "b"},
	} {
		cmd := redis.NewCmd(context.Background())
		cmd.SetVal(reply)
		n := 0
		split(cmd, reqs, func(i int, r any, err error) {
			n++
			if !errors.Is(err, errBadReply) || r != nil {
				t.Errorf("%s: decision %d got %v, %v; want errBadReply", name, i, r, err)
			}
		})
		if n != len(reqs) {
			t.Errorf("%s: %d of %d decisions answered", name, n, len(reqs))
		}
	}
	cmd := redis.NewCmd(context.Background())
	cmd.SetVal([]any{int64(0), sc(1, 2), int64(1500), sc(5.5)})
	var got []ratelimit.Decision
	for _, r := range reqs {
		r.scores = make([]float64, r.windows.Len())
	}
	split(cmd, reqs, func(i int, r any, err error) {
		d, err := decision(r, err, reqs[i])
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		got = append(got, d)
	})
	if len(got) != 2 || !got[0].Allowed || reqs[0].scores[0] != 1 || reqs[0].scores[1] != 2 || got[1].Allowed || got[1].Wait != 1500*time.Millisecond || reqs[1].scores[0] != 5.5 {
		t.Errorf("well-formed reply cut as %+v, scores %v %v", got, reqs[0].scores, reqs[1].scores)
	}
	cmd = redis.NewCmd(context.Background())
	cmd.SetErr(context.DeadlineExceeded)
	split(cmd, reqs, func(i int, _ any, err error) {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("call error reached decision %d as %v", i, err)
		}
	})
}
