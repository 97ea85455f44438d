package charge

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// failingQuota is an actor quota whose store is down.
type failingQuota struct{ ratelimit.ActorQuota }

func (failingQuota) Exceeded(context.Context, string) (bool, time.Duration, error) {
	return false, 0, fmt.Errorf("test: %w", ratelimit.ErrUnavailable)
}

// fullRoomQuota is a quota whose room is read with the frame's budgets
// (as redisstore.Quota's) and whose memory knows the actor is full: the
// room must not be asked for then (on a Cluster it costs the frame a
// window written and refunded, and a round trip).
type fullRoomQuota struct {
	ratelimit.ActorQuota
	rooms *int
}

func (fullRoomQuota) Exceeded(context.Context, string) (bool, time.Duration, error) {
	return true, time.Minute, nil
}

func (q fullRoomQuota) Room(string, *ratelimit.Limiter) (ratelimit.Budget, bool) {
	*q.rooms++
	return ratelimit.Budget{}, false
}

// TestEvent: the EVENT rule step by step, on a clock that stands still
// (the relay-level table, TestE2EEventRule in package relay, runs the same
// rule through a gate and the hooks). Each admitted event with an actor is
// settled (charged) as the relay's OK would have it.
func TestEvent(t *testing.T) {
	const (
		allowed = "1111111111111111111111111111111111111111111111111111111111111111"
		author  = "2222222222222222222222222222222222222222222222222222222222222222"
		session = "3333333333333333333333333333333333333333333333333333333333333333"
	)
	type step struct {
		authed, author string
		out            policy.Outcome
		wait           time.Duration // of a refusal
		actor          string        // to settle; "" none
	}
	// The quota hashes actors into 1,024 slots with a seed of its own, so
	// author and session share a budget in one quota of 1,024 (the test
	// failed so, about once in a thousand runs): a quota where they do
	// not, found on a day no step uses.
	var q *ratelimit.Quota
	for range 100 {
		var err error
		if q, err = ratelimit.NewQuota(2, time.Minute); err != nil {
			t.Fatal(err)
		}
		probe := q.WithClock(func() time.Time { return t0.Add(-1000 * 24 * time.Hour) })
		_, _ = probe.Add(context.Background(), author, "", 0)
		_, _ = probe.Add(context.Background(), author, "", 0)
		if full, _, _ := probe.Exceeded(context.Background(), session); !full {
			break
		}
	}
	var l policy.Limits
	l.Message[wire.TypeEVENT] = lims(ratelimit.PerPeriod(3, time.Hour))
	const windowWait = 2106 * time.Second // 3 an hour, past its burst
	rooms := 0                            // rooms asked of fullRoomQuota
	for _, tc := range []struct {
		name  string
		quota ratelimit.ActorQuota // nil: q on the frozen clock
		steps []step
	}{{
		name: "the author's quota",
		steps: []step{
			{author: author, out: policy.Admitted, actor: author},
			{author: author, out: policy.Admitted, actor: author},
			{author: author, out: policy.QuotaExceeded, wait: time.Minute},
		},
	}, {
		// The quota answers first, from memory: its refusal charges the
		// windows nothing (the third window is still there for session).
		name: "quota before windows",
		steps: []step{
			{author: author, out: policy.Admitted, actor: author},
			{author: author, out: policy.Admitted, actor: author},
			{author: author, out: policy.QuotaExceeded, wait: time.Minute},
			{author: author, out: policy.QuotaExceeded, wait: time.Minute},
			{author: session, out: policy.Admitted, actor: session},
			{author: session, out: policy.RateLimited, wait: windowWait},
		},
	}, {
		name: "allow-listed author: exempt from the quota, not the windows",
		steps: []step{
			{author: allowed, out: policy.Allowlisted},
			{author: allowed, out: policy.Allowlisted},
			{author: allowed, out: policy.Allowlisted},
			{author: allowed, out: policy.RateLimited, wait: windowWait},
		},
	}, {
		name: "the session's quota, whoever the author",
		steps: []step{
			{authed: session, author: author, out: policy.Admitted, actor: session},
			{authed: session, author: allowed, out: policy.Admitted, actor: session},
			{authed: session, author: session, out: policy.QuotaExceeded, wait: time.Minute},
		},
	}, {
		name:  "quota unavailable",
		quota: failingQuota{},
		steps: []step{{author: author, out: policy.Unavailable}},
	}, {
		// Memory first, then the room: an actor known full asks no room.
		name:  "quota with a room, known full",
		quota: fullRoomQuota{rooms: &rooms},
		steps: []step{{author: author, out: policy.QuotaExceeded, wait: time.Minute}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			quota := tc.quota
			if quota == nil {
				quota = q.WithClock(func() time.Time { return t0.Add(time.Duration(len(tc.name)) * 24 * time.Hour) })
			}
			p, err := Compile(policy.Config{Limits: &l, Quota: quota, Identity: policy.Identity{AllowPubkeys: []string{allowed}}})
			if err != nil {
				t.Fatal(err)
			}
			lim := frozenLimiter()
			ctx := context.Background()
			for i, st := range tc.steps {
				a, _ := scan.DecodeHex32(st.author)
				sub := p.CallSubject("203.0.113.7", netip.MustParseAddr("203.0.113.7"), false, st.authed)
				v, actor := sub.Event(ctx, lim, 1, st.authed, &a)
				if v.Outcome() != st.out || v.Wait.Round(time.Second) != st.wait || actor != st.actor {
					t.Fatalf("step %d: %v wait %v actor %.8s, want %v wait %v actor %.8s", i, v.Outcome(), v.Wait, actor, st.out, st.wait, st.actor)
				}
				if st.out == policy.Unavailable && !errors.Is(v.Err, ratelimit.ErrUnavailable) {
					t.Errorf("step %d: error %v, want ErrUnavailable", i, v.Err)
				}
				// EventActor names, for the settlement, the actor Event
				// asked.
				if q, settle, _ := sub.EventActor(st.authed, &a); v.Pass() && (settle != actor || (q == nil) != (actor == "")) {
					t.Errorf("step %d: EventActor says %.8s, Event %.8s", i, settle, actor)
				}
				if actor != "" {
					_, _ = quota.Add(ctx, actor, "", 0)
				}
			}
		})
	}

	if rooms != 0 {
		t.Errorf("the room was asked for %d times of an actor known full", rooms)
	}

	// A free payer pays nothing, whatever the store says.
	p, err := Compile(policy.Config{Limits: &l, Quota: failingQuota{}})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := scan.DecodeHex32(author)
	v, actor := p.AddressSubject("203.0.113.7", netip.MustParseAddr("203.0.113.7"), true).Event(context.Background(), frozenLimiter(), 1, "", &a)
	if v.Outcome() != policy.Allowlisted || actor != "" {
		t.Errorf("free payer: %v, actor %q", v.Outcome(), actor)
	}
	// No author (an event whose pubkey is not 64 hex digits): no actor,
	// the windows only.
	if v, actor := p.AddressSubject("x", netip.Addr{}, false).Event(context.Background(), frozenLimiter(), 1, "", nil); !v.Pass() || actor != "" {
		t.Errorf("no author: %+v, actor %q", v, actor)
	}
}
