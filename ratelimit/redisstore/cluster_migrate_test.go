package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// TestClusterMigrationRefusesNoOneElse: slots move by hand between two
// masters of a real 3-master cluster (SETSLOT IMPORTING and MIGRATING,
// MIGRATE, SETSLOT NODE) while two batched Stores decide for clients of
// every master, a few of them in the moving slots. Batches mix the moving
// clients' decisions, which the source answers ASK (key moved, slot still
// migrating) or MOVED (slot given away, slot map not yet reloaded), with
// the others'. No decision of a client outside the moving slots may be
// refused or answered unavailable, and the moved clients are decided again
// after the move, with the budgets their keys carried (each spent, so
// refused with a wait; never admitted past its burst).
//
// The cluster client's retry backoff is set far above the stores'
// Timeout (min_retry_backoff, a URL option; read_timeout above the
// Timeout, as the client's own bound): go-redis, following a
// redirect inside a pipeline, sleeps that backoff first, with the whole
// pipeline waiting, and when the sleep would outlast the context it fails
// every command of the pipeline with the context's error, the answered
// ones too. With its default backoff (10 to 90 ms over three redirects)
// that happens when a batch's deadline is near; with this one it happens to
// every batch that holds a redirected decision, so the test does not
// depend on how loaded the machine is. A redirect followed alone, outside
// the batch's pipeline, sleeps no backoff (go-redis follows MOVED and ASK
// at once).
func TestClusterMigrationRefusesNoOneElse(t *testing.T) {
	masters := redistest.StartCluster(t)
	const from, to = 0, 1
	ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	masterOf := func(slot int) int {
		for m, r := range ranges {
			if slot >= r[0] && slot <= r[1] {
				return m
			}
		}
		return -1
	}
	// 4 clients in slots of their own that move from master 0 to master
	// 1; 6 more of master 0 and 3 of each other master, whose slots stay.
	var moving, steady []string
	slots := map[int]bool{}
	perMaster := [3]int{}
	for i := 0; len(moving) < 4 || perMaster[0] < 6 || perMaster[1] < 3 || perMaster[2] < 3; i++ {
		name := "client-" + strconv.Itoa(i)
		slot := keySlot(messageKey(name, "EVENT"))
		m := masterOf(slot)
		switch {
		case slots[slot]:
		case m == from && len(moving) < 4:
			moving = append(moving, name)
		case m == from && perMaster[m] < 6, m != from && perMaster[m] < 3:
			steady = append(steady, name)
			perMaster[m]++
		default:
			continue
		}
		slots[slot] = true
	}
	isMoving := map[string]bool{}
	for _, name := range moving {
		isMoving[name] = true
	}
	all := append(append([]string{}, moving...), steady...)

	var addrs []string
	for _, s := range masters {
		addrs = append(addrs, s.Addr())
	}
	url := "redis+cluster://" + strings.Join(addrs, ",") + "?min_retry_backoff=5s&max_retry_backoff=5s&read_timeout=3s"
	limits := storetest.MustWindows(ratelimit.PerPeriod(burst, time.Hour))
	var stores []*Store
	for range 2 {
		c, err := NewClient(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		// One round trip in flight before decisions queue: batches form
		// from three concurrent decisions on.
		// A Timeout of a second, so that a starved machine (2 shared
		// cores, 3 nodes and 24 callers) does not refuse a decision on
		// its own.
		s := newStore(t, c, Options{Timeout: time.Second, Batch: 32, batchWorkers: 1})
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}

	// Every client's burst spent, from one store, before the move: from
	// then on every decision is a refusal with a wait, and an admission
	// would say a moved key lost its score.
	ctx := context.Background()
	for _, name := range all {
		admitted := 0
		for range 3 * burst {
			d, err := stores[0].Decide(ctx, messageKey(name, "EVENT"), limits, time.Time{})
			if err != nil {
				t.Fatalf("spending %s: %v", name, err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != burst {
			t.Fatalf("%s: %d admitted of %d tries, want its burst %d", name, admitted, 3*burst, burst)
		}
	}

	type tally struct{ decided, refused int }
	var (
		mu        sync.Mutex
		steadyT   tally
		movingT   tally
		lies      []string
		refusals  []string
		movingErr = map[string]int{}
		moved     atomic.Bool
		after     = map[string]bool{} // store/name decided after the move
		stopped   atomic.Bool
		wg        sync.WaitGroup
	)
	for si, s := range stores {
		for w := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(2 * time.Millisecond)
				defer tick.Stop()
				for n := w; !stopped.Load(); n++ {
					name := all[n%len(all)]
					if w%3 == 0 {
						name = moving[(n/3)%len(moving)] // a third of the callers on the moving clients: most batches hold one
					}
					done := moved.Load()
					d, err := s.Decide(ctx, messageKey(name, "EVENT"), limits, time.Time{})
					mu.Lock()
					tl := &steadyT
					if isMoving[name] {
						tl = &movingT
					}
					switch {
					case err != nil && !errors.Is(err, ratelimit.ErrUnavailable):
						lies = append(lies, fmt.Sprintf("%s: error not wrapping ErrUnavailable: %v", name, err))
					case err != nil:
						tl.refused++
						if isMoving[name] {
							msg := err.Error()
							movingErr[msg[max(0, len(msg)-60):]]++
						} else if len(refusals) < 10 {
							refusals = append(refusals, fmt.Sprintf("%s (store %d): %v", name, si, err))
						}
					case d.Allowed, d.Wait <= 0:
						lies = append(lies, fmt.Sprintf("%s: %+v, but its burst was spent", name, d))
					default:
						tl.decided++
						if done {
							after[strconv.Itoa(si)+"/"+name] = true
						}
					}
					mu.Unlock()
					<-tick.C
				}
			}()
		}
	}
	stop := func() { stopped.Store(true); wg.Wait() }
	defer stop()
	time.Sleep(200 * time.Millisecond) // load before the move, on real processes
	begin := time.Now()

	// Each moving client's slot in turn: marked, its keys carried over,
	// a while with the source answering ASK for them, then given to the
	// target, and a while with the stores' slot maps answered MOVED.
	for _, name := range moving {
		slot := keySlot(messageKey(name, "EVENT"))
		mig := redistest.BeginMigration(t, masters, masters[from], masters[to], slot)
		time.Sleep(100 * time.Millisecond) // decisions on the marked slot, keys still on the source
		mig.Move()
		time.Sleep(300 * time.Millisecond) // decisions answered ASK, on real processes
		mig.End()
		time.Sleep(300 * time.Millisecond) // decisions answered MOVED until the slot maps reload
	}
	moved.Store(true)
	movedIn := time.Since(begin)
	poll(t, 20*time.Second, "every client decided again in every store after the move", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(after) == len(all)*len(stores)
	})
	healed := time.Since(begin) - movedIn
	stop()

	redirects := map[string]string{}
	stats, _ := client(t, masters[from].Addr()).Info(ctx, "errorstats").Result()
	for _, f := range strings.Fields(stats) {
		for _, e := range []string{"ASK", "MOVED", "TRYAGAIN"} {
			if v, ok := strings.CutPrefix(f, "errorstat_"+e+":count="); ok {
				redirects[e] = v
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var batched, splits, redirected int64
	for _, s := range stores {
		batched += s.batch.pipelines.Load()
		splits += s.batch.splits.Load()
		redirected += s.batch.redirected.Load()
	}
	t.Logf("clients outside the moving slots: %d decided, %d refused; moving clients: %d decided, %d refused (%v); the source answered %v; %d batched round trips, %d cluster calls split, %d decisions redirected out of a batch; moved in %v, every client decided again %v after",
		steadyT.decided, steadyT.refused, movingT.decided, movingT.refused, movingErr, redirects, batched, splits, redirected, movedIn.Round(time.Millisecond), healed.Round(time.Millisecond))
	for _, lie := range lies[:min(len(lies), 10)] {
		t.Error(lie)
	}
	for _, r := range refusals {
		t.Errorf("refused a client outside the moving slots: %s", r)
	}
	if steadyT.refused > 0 {
		t.Errorf("%d decisions of clients outside the moving slots refused, want none", steadyT.refused)
	}
	if redirects["ASK"] == "" || redirects["MOVED"] == "" || batched == 0 {
		t.Errorf("the load met no redirect in a batch (the source answered %v; %d batched round trips): the test tested nothing", redirects, batched)
	}
	// The moved keys are the target's, with their scores.
	for _, name := range moving {
		slot := keySlot(messageKey(name, "EVENT"))
		n, err := client(t, masters[to].Addr()).ClusterCountKeysInSlot(ctx, slot).Result()
		if err != nil || n == 0 {
			t.Errorf("%s: slot %d holds %d keys on the target (%v), want its budget", name, slot, n, err)
		}
	}
}
