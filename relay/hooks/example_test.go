package hooks_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/hooks"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// khatruRelay has the hook fields of khatru.Relay (v0.19.1) that sluice
// fills, with the same types, so that this example needs no khatru. With a
// real relay, write rl := khatru.NewRelay() and the same appends.
type khatruRelay struct {
	RejectConnection          []func(r *http.Request) bool
	OnConnect                 []func(ctx context.Context)
	RejectEvent               []func(ctx context.Context, event *nostr.Event) (reject bool, msg string)
	RejectFilter              []func(ctx context.Context, filter nostr.Filter) (reject bool, msg string)
	RejectCountFilter         []func(ctx context.Context, filter nostr.Filter) (reject bool, msg string)
	OnEventSaved              []func(ctx context.Context, event *nostr.Event)
	OverwriteRelayInformation []func(ctx context.Context, r *http.Request, info nip11.RelayInformationDocument) nip11.RelayInformationDocument
}

// verdict renders a khatru hook's answer.
func verdict(reject bool, msg string) string {
	if reject {
		return "refused, " + msg
	}
	return "passed"
}

// frozen is a clock that stands still, so that the output is exact.
func frozen() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }

func ExampleHooks_Khatru() {
	limits := policy.DefaultLimits()
	limits.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(3, 10*time.Second)}
	limits.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(7, 10*time.Second)}
	h, err := hooks.New(hooks.Options{
		Limiter: ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), frozen),
		Policy:  policy.Config{Limits: &limits},
	})
	if err != nil {
		panic(err)
	}
	ip := func(ctx context.Context) string { return "203.0.113.7" } // khatru.GetIP
	k := h.Khatru(ip, nil, nil)                                     // khatru.GetIPFromRequest, khatru.GetAuthed

	var rl khatruRelay
	rl.RejectConnection = append(rl.RejectConnection, k.RejectConnection)
	rl.OnConnect = append(rl.OnConnect, k.OnConnect)
	rl.RejectEvent = append(rl.RejectEvent, k.RejectEvent)
	rl.RejectFilter = append(rl.RejectFilter, k.RejectFilter)
	rl.RejectCountFilter = append(rl.RejectCountFilter, k.RejectCountFilter)
	rl.OverwriteRelayInformation = append(rl.OverwriteRelayInformation, k.OverwriteRelayInformation)

	// What khatru does with them: one context per connection …
	conn, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	rl.OnConnect[0](conn)
	for i := 1; i <= 4; i++ {
		reject, msg := rl.RejectEvent[0](conn, &nostr.Event{})
		fmt.Printf("EVENT %d: %s\n", i, verdict(reject, msg))
	}
	// … and one per REQ, under which RejectFilter runs once per filter:
	// each filter is charged its price by shape, as a Gate charges it
	// (one id: the least price, 1; a scrape costs 10).
	byID := nostr.Filter{IDs: []string{"0000000000000000000000000000000000000000000000000000000000000001"}}
	for i := 1; i <= 3; i++ {
		req, closeReq := context.WithCancel(conn)
		for f := 1; f <= 3; f++ {
			reject, msg := rl.RejectFilter[0](req, byID)
			fmt.Printf("REQ %d filter %d: %s\n", i, f, verdict(reject, msg))
			if reject {
				break // khatru stops at the first refused filter
			}
		}
		closeReq()
	}
	// Output:
	// EVENT 1: passed
	// EVENT 2: passed
	// EVENT 3: passed
	// EVENT 4: refused, rate-limited: slow down; retry in 6s
	// REQ 1 filter 1: passed
	// REQ 1 filter 2: passed
	// REQ 1 filter 3: passed
	// REQ 2 filter 1: passed
	// REQ 2 filter 2: passed
	// REQ 2 filter 3: passed
	// REQ 3 filter 1: passed
	// REQ 3 filter 2: refused, rate-limited: slow down; retry in 3s
}

// relyClient stands in for rely.Client; with rely, write
// func(c rely.Client) string { return c.IP().String() }.
type relyClient struct{ addr string }

func (c relyClient) ip() string { return c.addr }

func ExampleRely() {
	limits := policy.DefaultLimits()
	limits.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(7, 10*time.Second)}
	h, err := hooks.New(hooks.Options{
		Limiter: ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), frozen),
		Policy:  policy.Config{Limits: &limits},
	})
	if err != nil {
		panic(err)
	}
	// With rely: r := hooks.Rely[rely.Client, rely.Stats](h, ip, nil), then
	// relay.Reject.Connection.Prepend(r.Connection),
	// relay.Reject.Event.Prepend(r.Event), relay.Reject.Req.Prepend(r.Req),
	// relay.Reject.Count.Prepend(r.Count).
	r := hooks.Rely[relyClient, struct{}](h, relyClient.ip, nil)

	c := relyClient{addr: "2001:db8::1"}
	author := "0000000000000000000000000000000000000000000000000000000000000002"
	for i := 1; i <= 3; i++ {
		// rely passes all filters at once; each costs its price, here 1.
		err := r.Req(c, nostr.Filters{{Authors: []string{author}}, {Authors: []string{author}}, {Authors: []string{author}}})
		fmt.Printf("REQ %d: %v (rate-limited: %v)\n", i, err, errors.Is(err, hooks.ErrRateLimited))
	}
	// Output:
	// REQ 1: <nil> (rate-limited: false)
	// REQ 2: <nil> (rate-limited: false)
	// REQ 3: rate-limited: slow down; retry in 6s (rate-limited: true)
}
