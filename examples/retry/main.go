// Command retry publishes a note and reads it back through relays that
// may refuse it as rate-limited, waiting out each refusal as the relay
// asks ("retry in Ns", docs/hints.md) with sluice's relay/hint package:
//
//	go run . -relay wss://relay.example.com -n 20
//
// It publishes n notes as fast as the relay takes them and then queries
// them back, the way a client catching up after being offline would. A
// relay behind sluice holds what it can pace (limits.max_delay) and
// refuses the rest with the wait; the program then sends nothing until
// the wait is over. -timeout bounds the whole run.
//
// This program is its own Go module so that sluice's library does not
// depend on what it uses.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/nbd-wtf/go-nostr"

	"github.com/sluice-relay/sluice/relay/hint"
)

func main() {
	url := flag.String("relay", "ws://127.0.0.1:7777", "relay URL")
	n := flag.Int("n", 20, "notes to publish")
	timeout := flag.Duration("timeout", time.Minute, "give up after this long")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	pool := nostr.NewSimplePool(ctx)
	r, err := pool.EnsureRelay(*url)
	if err != nil {
		log.Fatal(err)
	}
	got, err := run(ctx, r, nostr.GeneratePrivateKey(), *n)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("published %d notes and read %d back\n", *n, got)
}

// run publishes n notes signed by sk to r, each retried as the relay asks,
// and returns how many of them r then returns to a query.
func run(ctx context.Context, r *nostr.Relay, sk string, n int) (int, error) {
	pk, err := nostr.GetPublicKey(sk)
	if err != nil {
		return 0, err
	}
	for i := range n {
		ev := nostr.Event{Kind: nostr.KindTextNote, CreatedAt: nostr.Now(), Tags: nostr.Tags{}, Content: fmt.Sprintf("note %d", i)}
		if err := ev.Sign(sk); err != nil {
			return 0, err
		}
		if err := hint.Publish(ctx, r, ev); err != nil {
			return 0, fmt.Errorf("note %d: %w", i, err)
		}
	}
	evs, err := hint.Query(ctx, r, nostr.Filter{Authors: []string{pk}, Kinds: []int{nostr.KindTextNote}, Limit: n})
	return len(evs), err
}
