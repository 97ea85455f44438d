// Command storebench compares the eventstore backends sluice relay could
// use, on the machine it runs on: the time to save N signed events one by
// one (as a relay does), query latency by author, kind and tag, and disk
// use. "badger" is badger as sluice relay opens it (writes reach the OS,
// no fsync per event); "badger-sync" adds an fsync per write, the
// durability LMDB's commit gives by default.
//
//	cd cmd/sluice/storebench && go run . -n 20000 -queries 2000
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"
	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/eventstore/badger"
	"github.com/fiatjaf/eventstore/lmdb"
	"github.com/nbd-wtf/go-nostr"
)

func main() {
	n := flag.Int("n", 20000, "events to save")
	authors := flag.Int("authors", 100, "distinct authors")
	queries := flag.Int("queries", 2000, "queries of each kind")
	dir := flag.String("dir", "", "scratch directory (default: a temp dir)")
	flag.Parse()
	if *dir == "" {
		d, err := os.MkdirTemp("", "storebench")
		check(err)
		defer os.RemoveAll(d)
		*dir = d
	}

	keys := make([]string, *authors)
	pubs := make([]string, *authors)
	for i := range keys {
		keys[i] = nostr.GeneratePrivateKey()
		pubs[i], _ = nostr.GetPublicKey(keys[i])
	}
	events := make([]*nostr.Event, *n)
	base := nostr.Timestamp(time.Now().Add(-24 * time.Hour).Unix())
	for i := range events {
		ev := &nostr.Event{
			CreatedAt: base + nostr.Timestamp(i),
			Kind:      []int{1, 1, 1, 7}[i%4],
			Tags:      nostr.Tags{{"t", fmt.Sprintf("topic%d", i%50)}, {"p", pubs[(i+1)%len(pubs)]}},
			Content:   fmt.Sprintf("event %d: the quick brown fox jumps over the lazy dog", i),
		}
		check(ev.Sign(keys[i%len(keys)]))
		events[i] = ev
	}

	for _, name := range []string{"lmdb", "badger", "badger-sync"} {
		path := filepath.Join(*dir, name)
		var st eventstore.Store
		switch name {
		case "lmdb":
			st = &lmdb.LMDBBackend{Path: path}
		case "badger":
			st = &badger.BadgerBackend{Path: path, BadgerOptionsModifier: quiet}
		case "badger-sync":
			// badger with an fsync per write, durable like lmdb's commit
			st = &badger.BadgerBackend{Path: path, BadgerOptionsModifier: func(o badgerdb.Options) badgerdb.Options {
				return quiet(o).WithSyncWrites(true)
			}}
		}
		check(st.Init())
		ctx := context.Background()

		t0 := time.Now()
		for _, ev := range events {
			check(st.SaveEvent(ctx, ev))
		}
		save := time.Since(t0)

		qa := measure(*queries, func(i int) int {
			return drain(st, ctx, nostr.Filter{Authors: []string{pubs[i%len(pubs)]}, Limit: 50})
		})
		qk := measure(*queries, func(i int) int {
			return drain(st, ctx, nostr.Filter{Kinds: []int{7}, Limit: 50})
		})
		qt := measure(*queries, func(i int) int {
			return drain(st, ctx, nostr.Filter{Tags: nostr.TagMap{"t": {fmt.Sprintf("topic%d", i%50)}}, Limit: 50})
		})
		st.Close()
		fmt.Printf("%-11s save %d events: %v (%.0f/s)  query author p50 %v p99 %v  kind p50 %v p99 %v  tag p50 %v p99 %v  disk %s\n",
			name, len(events), save.Round(time.Millisecond), float64(len(events))/save.Seconds(),
			qa.p50, qa.p99, qk.p50, qk.p99, qt.p50, qt.p99, du(path))
	}
}

type lat struct{ p50, p99 time.Duration }

func measure(n int, f func(i int) int) lat {
	d := make([]time.Duration, n)
	for i := range d {
		t := time.Now()
		if got := f(i); got == 0 {
			panic("query returned nothing")
		}
		d[i] = time.Since(t)
	}
	sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
	return lat{d[n/2].Round(time.Microsecond), d[n*99/100].Round(time.Microsecond)}
}

func drain(st eventstore.Store, ctx context.Context, f nostr.Filter) int {
	ch, err := st.QueryEvents(ctx, f)
	check(err)
	n := 0
	for range ch {
		n++
	}
	return n
}

func du(path string) string {
	var total int64
	filepath.Walk(path, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				total += st.Blocks * 512 // allocated, not apparent: lmdb's file is sparse
			}
		}
		return nil
	})
	return fmt.Sprintf("%.1f MiB", float64(total)/(1<<20))
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

func quiet(o badgerdb.Options) badgerdb.Options { return o.WithLogger(nil) }
