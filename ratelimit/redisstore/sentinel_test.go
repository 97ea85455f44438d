package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-relay/sluice/internal/redistest"
	"github.com/sluice-relay/sluice/internal/storetest"
	"github.com/sluice-relay/sluice/ratelimit"
)

// startSentinel starts a redis-server in sentinel mode on a free loopback
// port, monitoring master as "mymaster", and stops it when the test ends.
// (redistest cannot: sentinel mode wants its config file as the first
// argument.)
func startSentinel(t *testing.T, master string) string {
	t.Helper()
	bin := redistest.Binary(t)
	port := redistest.FreePort(t)
	dir := t.TempDir()
	host, mport, err := net.SplitHostPort(master)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster %s %s 1\nsentinel down-after-milliseconds mymaster 1000\n",
		port, dir, host, mport)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "sentinel.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sentinel: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })

	addr := "127.0.0.1:" + strconv.Itoa(port)
	s := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, err := s.GetMasterAddrByName(context.Background(), "mymaster").Result()
		if err == nil && len(a) == 2 && a[1] == mport {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel on %s does not know mymaster: %v %v", addr, a, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConformanceSentinel runs the suite through a client built by
// NewClient from a redis+sentinel URL: the master is found through the
// sentinel, not configured.
func TestConformanceSentinel(t *testing.T) {
	master := redistest.Start(t)
	sentinel := startSentinel(t, master.Addr())
	c, err := NewClient("redis+sentinel://" + sentinel + "/mymaster/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, slow)
	storetest.Run(t, func(t *testing.T) storetest.Scorer { return scorer(s) })

	// The decisions landed on the master.
	direct := client(t, master.Addr())
	if n, err := direct.DBSize(context.Background()).Result(); err != nil || n == 0 {
		t.Errorf("master holds %d keys (%v) after the suite ran through the sentinel", n, err)
	}
}

// TestSentinelFailover: the master dies, the sentinel promotes its replica,
// and the same Store decides again on the new master by itself — failing
// closed, with ErrUnavailable, in between.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("failover takes seconds")
	}
	master := redistest.Start(t)
	host, port, _ := net.SplitHostPort(master.Addr())
	replica := redistest.Start(t, "--replicaof", host, port)
	rc := client(t, replica.Addr())
	waitFor(t, 10*time.Second, "replica in sync", func() bool {
		info, err := rc.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	sentinel := startSentinel(t, master.Addr())
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel})
	defer sc.Close()
	waitFor(t, 15*time.Second, "sentinel knows the replica", func() bool {
		r, err := sc.Replicas(context.Background(), "mymaster").Result()
		return err == nil && len(r) == 1
	})

	c, err := NewClient("redis+sentinel://" + sentinel + "/mymaster")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// A generous deadline: the first call also discovers the master through
	// the sentinel and loads the script, and CI runs this under -race.
	s := newStore(t, c, Options{Timeout: 2 * time.Second, breaker: breakerOptions{CoolDown: 100 * time.Millisecond}})
	limits := storetest.MustWindows(ratelimit.PerPeriod(1000, time.Second))
	if _, err := s.Decide(context.Background(), "{fo}:message:EVENT", limits, time.Time{}); err != nil {
		t.Fatal(err)
	}

	master.Kill()
	var unavailable int
	waitFor(t, 60*time.Second, "decisions on the promoted replica", func() bool {
		_, err := s.Decide(context.Background(), "{fo}:message:EVENT", limits, time.Time{})
		if err != nil && !errors.Is(err, ratelimit.ErrUnavailable) {
			t.Fatalf("during failover: %v does not wrap ErrUnavailable", err)
		}
		if err != nil {
			unavailable++
		}
		return err == nil
	})
	if a, _ := sc.GetMasterAddrByName(context.Background(), "mymaster").Result(); len(a) != 2 || a[1] == port {
		t.Errorf("sentinel master after failover: %v (old port %s)", a, port)
	}
	if unavailable == 0 {
		t.Error("no decision failed while the master was gone: was it really killed?")
	}
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
