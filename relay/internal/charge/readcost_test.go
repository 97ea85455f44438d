package charge

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/internal/scan"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// TestPrice prices frames by their filters' shape under the default table:
// a scrape costs 10 times an author-scoped filter.
func TestPrice(t *testing.T) {
	p, err := Compile(policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	hourAgo := "1699996400"
	for _, c := range []struct {
		frame string
		want  int
	}{
		{`["REQ","s",{"ids":["` + hex64 + `"]}]`, 1},
		{`["REQ","s",{"authors":["` + hex64 + `"],"kinds":[1],"limit":20}]`, 1},
		{`["REQ","s",{"authors":["` + hex64 + `"],"kinds":[0]}]`, 1},
		{`["REQ","s",{"#p":["` + hex64 + `"],"limit":100}]`, 1},
		{`["REQ","s",{"#p":["` + hex64 + `"],"limit":101}]`, 2},
		{`["REQ","s",{"kinds":[1],"limit":500}]`, 10},
		{`["REQ","s",{"kinds":[1],"limit":20}]`, 10}, // open-ended: all of time
		{`["REQ","s",{"kinds":[1],"since":` + hourAgo + `}]`, 2},
		{`["REQ","s",{"kinds":[1],"since":1699900000}]`, 10},
		{`["REQ","s",{"kinds":[1],"since":1600000000,"until":1600003600,"limit":50}]`, 2},
		{`["REQ","s",{"kinds":[1],"limit":0}]`, 1},
		{`["REQ","s",{"authors":[],"limit":500}]`, 10}, // an empty list narrows nothing
		{`["REQ","s",{"kinds":[1],"limit":500},{"ids":["` + hex64 + `"]}]`, 11},
		{`["COUNT","s",{"kinds":[1]}]`, 10},
		{`["NEG-OPEN","s",{"kinds":[1]},"6100000200"]`, 10},
	} {
		f, reason := scan.Scan([]byte(c.frame), p.Bounds())
		if reason != "" {
			t.Fatalf("%s: %s (%+v)", c.frame, reason, f)
		}
		if got := p.Price(nil, []byte(c.frame), now); got != c.want {
			t.Errorf("%s: price %d, want %d", c.frame, got, c.want)
		}
		if got := p.Price(&f, []byte(c.frame), now); got != c.want {
			t.Errorf("%s: price from the scan's facts %d, want %d", c.frame, got, c.want)
		}
	}
	scoped := p.Price(nil, []byte(`["REQ","s",{"authors":["`+hex64+`"],"limit":20}]`), now)
	scrape := p.Price(nil, []byte(`["REQ","s",{"kinds":[1],"limit":500}]`), now)
	if scrape < 10*scoped {
		t.Errorf("a scrape costs %d, an author-scoped filter %d: want at least 10 times", scrape, scoped)
	}
}

const hex64 = "0000000000000000000000000000000000000000000000000000000000000001"

// TestPriceCharged: a REQ is charged its price in the same decision as the
// frame, capped at what REQ's windows admit from rest.
func TestPriceCharged(t *testing.T) {
	l := policy.Limits{}
	l.Message[wire.TypeREQ] = []ratelimit.Limit{ratelimit.PerPeriod(25, time.Minute)}
	p, err := Compile(policy.Config{Limits: &l})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), func() time.Time { return t0 })
	s := p.AddressSubject("1.2.3.4", netip.MustParseAddr("1.2.3.4"), false)
	scrape := p.Price(nil, []byte(`["REQ","s",{"kinds":[1],"limit":500}]`), t0)
	for i := range 2 {
		if v := s.Charge(context.Background(), lim, wire.TypeREQ, scrape, -1); !v.Pass() {
			t.Fatalf("scrape %d refused: %+v", i, v)
		}
	}
	if v := s.Charge(context.Background(), lim, wire.TypeREQ, scrape, -1); v.Pass() {
		t.Fatal("a third scrape of price 10 passed a burst of 25")
	}
	s2 := p.AddressSubject("1.2.3.5", netip.MustParseAddr("1.2.3.5"), false)
	if v := s2.Charge(context.Background(), lim, wire.TypeREQ, 1000, -1); !v.Pass() {
		t.Fatalf("a price past the burst is the burst's, admissible from rest: %+v", v)
	}
}

// TestSettleRead: bytes sent are charged to the read windows by the byte;
// a charge past what is left is refused with the wait until it fits.
func TestSettleRead(t *testing.T) {
	l := policy.Limits{Read: []ratelimit.Limit{ratelimit.PerPeriod(1<<20, time.Minute)}}
	p, err := Compile(policy.Config{Limits: &l})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), func() time.Time { return now })
	s := p.AddressSubject("1.2.3.4", netip.MustParseAddr("1.2.3.4"), false)
	if s.ReadMax() != 512<<10 {
		t.Fatalf("ReadMax %d", s.ReadMax())
	}
	key := s.ReadKey()
	for range 2 {
		if v := s.SettleRead(context.Background(), lim, key, 512<<10); !v.Pass() {
			t.Fatalf("within the burst: %+v", v)
		}
	}
	v := s.SettleRead(context.Background(), lim, key, 64<<10)
	if !v.Refused || v.Wait <= 0 || v.Budget != "read" {
		t.Fatalf("past the burst: %+v", v)
	}
	now = now.Add(v.Wait)
	if v := s.SettleRead(context.Background(), lim, key, 64<<10); !v.Pass() {
		t.Fatalf("after the wait: %+v", v)
	}
}

// TestSettleReadAggregate: the clients of one prefix share its read
// windows besides their own.
func TestSettleReadAggregate(t *testing.T) {
	l := policy.Limits{Read: []ratelimit.Limit{ratelimit.PerPeriod(8<<20, time.Minute)}}
	p, err := Compile(policy.Config{Limits: &l, Aggregates: []policy.Aggregate{{Bits: 48, Read: []ratelimit.Limit{ratelimit.PerPeriod(1<<20, time.Minute)}}}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	lim := ratelimit.NewLimiter(ratelimit.NewMemoryStore(0), func() time.Time { return now })
	a := p.AddressSubject("2001:db8:1:1::/64", netip.MustParseAddr("2001:db8:1:1::1"), false)
	b := p.AddressSubject("2001:db8:1:2::/64", netip.MustParseAddr("2001:db8:1:2::1"), false)
	if a.ReadMax() != 512<<10 {
		t.Fatalf("ReadMax %d, want half the prefix's rate", a.ReadMax())
	}
	if v := a.SettleRead(context.Background(), lim, a.ReadKey(), 512<<10); !v.Pass() {
		t.Fatalf("a: %+v", v)
	}
	if v := b.SettleRead(context.Background(), lim, b.ReadKey(), 512<<10); !v.Pass() {
		t.Fatalf("b: %+v", v)
	}
	v := b.SettleRead(context.Background(), lim, b.ReadKey(), 64<<10)
	if !v.Refused || v.Budget != "prefix 2001:db8:1::/48 read" {
		t.Fatalf("past the prefix's 1 MiB: %+v", v)
	}
}
