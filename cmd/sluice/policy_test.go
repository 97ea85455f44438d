package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr/nip19"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
	"github.com/sluice-relay/sluice/relay/wire"
)

// Pubkeys for tiers: A also as its npub (NIP-19's example), B also in
// upper case.
const (
	pkA    = "7e7e9c42a91bfef19fa929e5fda1b72e0ebc1a4c1141673e2794234d86addf4e"
	npubA  = "npub10elfcs4fr0l0r8af98jlmgdh9c8tcxjvz9qkw038js35mp4dma8qzvjptg"
	pkB    = "3bf0c63fcb93463407af97a5e5ee64fa883d107ef9e558472c4eb9aaaefa459d"
	pkBHex = "3BF0C63FCB93463407AF97A5E5EE64FA883D107EF9E558472C4EB9AAAEFA459D"
	pkC    = "82341f882b6eabcd2ba7f1ef90aad961cf074af15b9ef44a09f9d2a8fbfbe6a2"
)

// loadIn writes yaml as c.yaml in dir (a new temporary one when "") with
// files besides it, and loads it as sluice does (loadConfigFile, validate).
func loadIn(t *testing.T, dir, yaml string, files map[string]string) (*config, error) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	fc, err := loadConfigFile(path)
	if err != nil {
		return nil, err
	}
	return fc.validate()
}

const policyYAML = `relay_url: wss://relay.example
mode: shadow
limits:
  message:
    EVENT: [{rate: 10, period: 1s}, {rate: 240, period: 60s, shadow: true}]
    REQ: [{rate: 50, period: 1s}]
  kinds:
    reactions: {kinds: [7], limits: [{rate: 5, period: 1s}]}
    ephemeral: {kinds: ["20000-29999", 1000], limits: [{rate: 20, period: 1s, shadow: true}]}
tiers:
  members:
    pubkeys: [` + npubA + `]
    pubkeys_file: members.txt
    limits: {message: {EVENT: [{rate: 50, period: 1s}]}}
    quota: {events: 6000}
  bots:
    pubkeys: [` + pkBHex + `]
    limits: {message: {EVENT: []}}
    quota: {unlimited: true}
identity:
  ipv6_aggregate: [{prefix: 48, limits: [{rate: 100, period: 1s}]}]
  ipv4_aggregate: [{prefix: 24, limits: [{rate: 200, period: 1s}]}]
`

// TestPolicyFields: every policy field of the file reaches the config and
// the policy.Config built from it, which compiles.
func TestPolicyFields(t *testing.T) {
	npubC, err := nip19.EncodePublicKey(pkC)
	if err != nil {
		t.Fatal(err)
	}
	members := "# members, one a line\n\n" + pkA + "   # alice, also listed by npub\n" + npubC + "\n"
	c, err := loadIn(t, "", policyYAML, map[string]string{"members.txt": members})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Shadow {
		t.Error("mode: shadow did not set Shadow")
	}
	ev := c.Limits.Message[wire.TypeEVENT]
	if len(ev) != 2 || ev[0].Shadow || !ev[1].Shadow {
		t.Errorf("EVENT windows %v: want the second alone in shadow", ev)
	}
	// Classes sorted by name; kinds as written.
	if len(c.Kinds) != 2 || c.Kinds[0].Name != "ephemeral" || c.Kinds[1].Name != "reactions" {
		t.Fatalf("kind classes %+v, want ephemeral then reactions", c.Kinds)
	}
	if got := c.Kinds[0].Kinds; len(got) != 2 || got[0] != ([2]int{20000, 29999}) || got[1] != ([2]int{1000, 1000}) {
		t.Errorf("ephemeral kinds %v", got)
	}
	if got := c.Kinds[1]; len(got.Kinds) != 1 || got.Kinds[0] != ([2]int{7, 7}) || len(got.Limits) != 1 || got.Limits[0].Rate != 5 {
		t.Errorf("reactions %+v", got)
	}
	if !c.Kinds[0].Limits[0].Shadow {
		t.Error("ephemeral's window lost shadow: true")
	}
	// Tiers sorted by name; npub decoded, hex lowercased, the file read
	// relative to the config with its comments, a repeated member once.
	if len(c.Tiers) != 2 || c.Tiers[0].Name != "bots" || c.Tiers[1].Name != "members" {
		t.Fatalf("tiers %+v", c.Tiers)
	}
	bots, mem := c.Tiers[0], c.Tiers[1]
	if len(bots.Pubkeys) != 1 || bots.Pubkeys[0] != pkB {
		t.Errorf("bots pubkeys %v, want %s", bots.Pubkeys, pkB)
	}
	if len(mem.Pubkeys) != 2 || mem.Pubkeys[0] != pkA || mem.Pubkeys[1] != pkC {
		t.Errorf("members pubkeys %v, want %s and %s", mem.Pubkeys, pkA, pkC)
	}
	if !strings.HasSuffix(mem.File, "members.txt") || !filepath.IsAbs(mem.File) {
		t.Errorf("pubkeys_file resolved to %q, want the file beside the config", mem.File)
	}
	// A tier's type replaces the address's; the others keep it.
	if got := mem.Limits.Message[wire.TypeEVENT]; len(got) != 1 || got[0].Rate != 50 {
		t.Errorf("members EVENT %v, want 50/1s", got)
	}
	if got := mem.Limits.Message[wire.TypeREQ]; len(got) != 1 || got[0].Rate != 50 {
		t.Errorf("members REQ %v, want the address's 50/1s", got)
	}
	if got := bots.Limits.Message[wire.TypeEVENT]; got == nil || len(got) != 0 {
		t.Errorf("bots EVENT %v, want [] (free)", got)
	}
	// The quota: events given, window the global one; unlimited.
	if !mem.QuotaSet || mem.QuotaEvents != 6000 || mem.QuotaWindow != time.Minute || mem.QuotaUnlimited {
		t.Errorf("members quota %+v", mem)
	}
	if !bots.QuotaSet || !bots.QuotaUnlimited {
		t.Errorf("bots quota %+v", bots)
	}
	if len(c.Aggregates) != 2 || c.Aggregates[0].Bits != 48 || c.Aggregates[0].V4 || c.Aggregates[1].Bits != 24 || !c.Aggregates[1].V4 {
		t.Errorf("aggregates %+v", c.Aggregates)
	}

	pc, err := buildPolicy(c, localQuotas(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !pc.Shadow || len(pc.Kinds) != 2 || len(pc.Tiers) != 2 || len(pc.Aggregates) != 2 {
		t.Errorf("policy.Config %+v", pc)
	}
	if q := pc.Tiers[1].Quota; q == nil || q.Events() != 6000 || q.Window() != time.Minute {
		t.Errorf("members' quota %v", q)
	}
	if q := pc.Tiers[0].Quota; q != nil {
		t.Errorf("bots' quota %v, want none (nil)", q)
	}
	if pc.Quota == nil || pc.Quota.Events() != 600 {
		t.Errorf("global quota %v", pc.Quota)
	}
	if err := pc.Validate(); err != nil {
		t.Fatal(err)
	}
	if pc.Kinds[0].Name != "ephemeral" || pc.Kinds[1].Name != "reactions" || pc.Kinds[1].Kinds[0] != ([2]int{7, 7}) {
		t.Errorf("kind classes %+v", pc.Kinds)
	}
	if pc.Tiers[1].Name != "members" || pc.Tiers[1].Pubkeys[0] != pkA || pc.Tiers[0].Name != "bots" || pc.Tiers[0].Pubkeys[0] != pkB {
		t.Errorf("tiers %+v", pc.Tiers)
	}
}

// TestPolicyDefaults: a config without the policy sections gets the plain
// policy (enforce, no classes, tiers or aggregates), so a config that names
// none of them keeps its meaning.
func TestPolicyDefaults(t *testing.T) {
	c, err := parseAndValidate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Shadow || len(c.Kinds) != 0 || len(c.Tiers) != 0 || len(c.Aggregates) != 0 {
		t.Errorf("defaults: shadow %v, kinds %v, tiers %v, aggregates %v", c.Shadow, c.Kinds, c.Tiers, c.Aggregates)
	}
	c, err = parseAndValidate([]byte("mode: enforce\n"))
	if err != nil || c.Shadow {
		t.Errorf("mode: enforce: %v, shadow %v", err, c != nil && c.Shadow)
	}
}

// TestPolicyRefused: every invalid policy value is refused, naming its
// field.
func TestPolicyRefused(t *testing.T) {
	win := "[{rate: 5, period: 1s}]"
	tests := []struct {
		name, yaml string
		files      map[string]string
		want       string
	}{
		{"mode unknown", "mode: dry-run\n", nil, `mode (line 1, column 1): must be enforce or shadow, got "dry-run"`},
		{"mode not a string", "mode: [shadow]\n", nil, "mode (line 1, column 7): expected a string"},
		{"shadow not a boolean", "limits: {message: {EVENT: [{rate: 5, period: 1s, shadow: yes}]}}", nil, "limits.message.EVENT[0].shadow (line 1, column 58): expected true or false"},
		{"shadow on a connection window not a boolean", "limits: {connection: [{rate: 5, period: 1s, shadow: 1}]}", nil, "limits.connection[0].shadow"},
		{"class unknown field", "limits: {kinds: {r: {kinds: [7], limits: " + win + ", rate: 1}}}", nil, "limits.kinds.r.rate"},
		{"class name too long", "limits: {kinds: {" + strings.Repeat("a", 33) + ": {kinds: [7], limits: " + win + "}}}", nil, "limits.kinds." + strings.Repeat("a", 33) + " (line 1, column 18): a kind class name is"},
		{"class name with a dot", "limits: {kinds: {\"a.b\": {kinds: [7], limits: " + win + "}}}", nil, "a kind class name is 1 to 32 letters"},
		{"class without kinds", "limits: {kinds: {r: {limits: " + win + "}}}", nil, "limits.kinds.r.kinds: must list at least one kind"},
		{"class without limits", "limits: {kinds: {r: {kinds: [7]}}}", nil, "limits.kinds.r.limits: must list at least one window"},
		{"class with a bad window", "limits: {kinds: {r: {kinds: [7], limits: [{rate: 1, period: 1s}]}}}", nil, "limits.kinds.r.limits[0] (line 1, column 43): ratelimit: invalid limit"},
		{"kind past 65535", "limits: {kinds: {r: {kinds: [70000], limits: " + win + "}}}", nil, "limits.kinds.r.kinds[0] (line 1, column 30): kinds 70000-70000 must lie within 0-65535"},
		{"kind negative", "limits: {kinds: {r: {kinds: [-1], limits: " + win + "}}}", nil, "limits.kinds.r.kinds[0]"},
		{"range backwards", "limits: {kinds: {r: {kinds: [\"9-3\"], limits: " + win + "}}}", nil, "limits.kinds.r.kinds[0] (line 1, column 30): kinds 9-3 must lie within 0-65535, low to high"},
		{"range not a range", "limits: {kinds: {r: {kinds: [\"seven\"], limits: " + win + "}}}", nil, "limits.kinds.r.kinds[0] (line 1, column 30): expected a kind (a whole number) or a range of kinds"},
		{"kind a float", "limits: {kinds: {r: {kinds: [7.5], limits: " + win + "}}}", nil, "limits.kinds.r.kinds[0] (line 1, column 30): expected a kind"},
		{"kind in two classes", "limits: {kinds: {a: {kinds: [7], limits: " + win + "}, b: {kinds: [\"1-10\"], limits: " + win + "}}}", nil, `limits.kinds.b.kinds[0] (line 1, column 80): kind 7 is also in kind class "a"`},
		{"tier unknown field", "tiers: {t: {pubkeys: [" + pkA + "], members: []}}", nil, "tiers.t.members (line 1, column 90): unknown field"},
		{"tier connection limits", "tiers: {t: {pubkeys: [" + pkA + "], limits: {connection: " + win + "}}}", nil, "tiers.t.limits.connection (line 1, column 99): unknown field"},
		{"tier name bad", "tiers: {\"a b\": {pubkeys: [" + pkA + "]}}", nil, `tiers.a b (line 1, column 9): a tier name is`},
		{"tier without members", "tiers: {t: {limits: {message: {EVENT: " + win + "}}}}", nil, "tiers.t (line 1, column 9): has no members"},
		{"tier pubkey not hex", "tiers: {t: {pubkeys: [abc]}}", nil, `tiers.t.pubkeys[0] (line 1, column 23): must be 64 lowercase hex digits, got "abc"`},
		{"tier npub broken", "tiers: {t: {pubkeys: [npub1xyz]}}", nil, `tiers.t.pubkeys[0] (line 1, column 23): not a valid npub`},
		{"pubkey in two tiers", "tiers: {a: {pubkeys: [" + pkA + "]}, b: {pubkeys: [" + npubA + "]}}", nil, `tiers.b.pubkeys[0] (line 1, column 105): pubkey ` + pkA + ` is also in tier "a"`},
		{"pubkeys_file missing", "tiers: {t: {pubkeys_file: nowhere.txt}}", nil, "tiers.t.pubkeys_file (line 1, column 13): open "},
		{"pubkeys_file a directory", "tiers: {t: {pubkeys_file: .}}", nil, "tiers.t.pubkeys_file (line 1, column 13): "},
		{"pubkeys_file a device", "tiers: {t: {pubkeys_file: /dev/null}}", nil, "tiers.t.pubkeys_file (line 1, column 13): /dev/null is not a regular file"},
		{"pubkeys_file bad line", "tiers: {t: {pubkeys_file: m.txt}}", map[string]string{"m.txt": "# ok\n" + pkA + "\nnot-a-key\n"}, `tiers.t.pubkeys_file (`},
		{"pubkeys_file bad line names the line", "tiers: {t: {pubkeys_file: m.txt}}", map[string]string{"m.txt": "# ok\n" + pkA + "\nnot-a-key\n"}, `m.txt, line 3): must be 64 lowercase hex digits, got "not-a-key"`},
		{"pubkeys_file empty", "tiers: {t: {pubkeys_file: m.txt}}", map[string]string{"m.txt": "# nobody yet\n"}, "tiers.t (line 1, column 9): has no members"},
		{"tier type unknown", "tiers: {t: {pubkeys: [" + pkA + "], limits: {message: {POST: " + win + "}}}}", nil, "tiers.t.limits.message.POST (line 1, column 109): unknown message type"},
		{"tier type null", "tiers: {t: {pubkeys: [" + pkA + "], limits: {message: {EVENT: }}}}", nil, "tiers.t.limits.message.EVENT (line 1, column 109): must be a list of windows"},
		{"tier OTHER free", "tiers: {t: {pubkeys: [" + pkA + "], limits: {message: {OTHER: []}}}}", nil, "tiers.t.limits.message.OTHER (line 1, column 109): must have at least one window"},
		{"tier bad window", "tiers: {t: {pubkeys: [" + pkA + "], limits: {message: {EVENT: [{rate: 2, period: 1s, cost: 3}]}}}}", nil, "tiers.t.limits.message.EVENT[0] (line 1, column 117): ratelimit: invalid limit"},
		{"tier quota events 0", "tiers: {t: {pubkeys: [" + pkA + "], quota: {events: 0}}}", nil, "tiers.t.quota.events (line 1, column 98): must be at least 1, got 0 (set tiers.t.quota.unlimited: true to turn the quota off)"},
		{"tier quota events too many", "tiers: {t: {pubkeys: [" + pkA + "], quota: {events: 99999999999}}}", nil, "tiers.t.quota.events (line 1, column 98): ratelimit: invalid quota: events 99999999999 must be at most 4194303"},
		{"tier quota window short", "tiers: {t: {pubkeys: [" + pkA + "], quota: {window: 10ms}}}", nil, "tiers.t.quota.window (line 1, column 98): must be between 1s and 24h0m0s, got 10ms"},
		{"tier quota window not a duration", "tiers: {t: {pubkeys: [" + pkA + "], quota: {window: soon}}}", nil, "tiers.t.quota.window (line 1, column 98): not a duration"},
		{"tier quota unknown field", "tiers: {t: {pubkeys: [" + pkA + "], quota: {per: 1h}}}", nil, "tiers.t.quota.per (line 1, column 98): unknown field"},
		{"ipv6 aggregate not wider", "identity: {ipv6_aggregate: [{prefix: 64, limits: " + win + "}]}", nil, "identity.ipv6_aggregate[0].prefix (line 1, column 30): must be 8 to 63 (wider than the IPv6 client prefix), got 64"},
		{"ipv6 aggregate under a /56 client prefix", "identity: {ipv6_prefix: 56, ipv6_aggregate: [{prefix: 60, limits: " + win + "}]}", nil, "identity.ipv6_aggregate[0].prefix (line 1, column 47): must be 8 to 55"},
		{"ipv4 aggregate of a whole address", "identity: {ipv4_aggregate: [{prefix: 32, limits: " + win + "}]}", nil, "identity.ipv4_aggregate[0].prefix (line 1, column 30): must be 8 to 31"},
		{"ipv4 aggregate too wide", "identity: {ipv4_aggregate: [{prefix: 4, limits: " + win + "}]}", nil, "identity.ipv4_aggregate[0].prefix (line 1, column 30): must be 8 to 31"},
		{"aggregate without prefix", "identity: {ipv4_aggregate: [{limits: " + win + "}]}", nil, "identity.ipv4_aggregate[0].prefix: is required"},
		{"aggregate without limits", "identity: {ipv6_aggregate: [{prefix: 48}]}", nil, "identity.ipv6_aggregate[0].limits: must list at least one window"},
		{"aggregate twice", "identity: {ipv6_aggregate: [{prefix: 48, limits: " + win + "}, {prefix: 48, limits: " + win + "}]}", nil, "identity.ipv6_aggregate[1].prefix (line 1, column 77): /48 is listed twice"},
		{"aggregate bad window", "identity: {ipv6_aggregate: [{prefix: 48, limits: [{rate: 5}]}]}", nil, "identity.ipv6_aggregate[0].limits[0].period: is required"},
		{"aggregate unknown field", "identity: {ipv6_aggregate: [{bits: 48, limits: " + win + "}]}", nil, "identity.ipv6_aggregate[0].bits (line 1, column 30): unknown field"},
		{"too many aggregates", "identity: {ipv6_aggregate: [{prefix: 48, limits: " + win + "}, {prefix: 40, limits: " + win + "}, {prefix: 32, limits: " + win + "}], ipv4_aggregate: [{prefix: 24, limits: " + win + "}, {prefix: 16, limits: " + win + "}]}", nil, "5 aggregates, at most 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadIn(t, "", tt.yaml, tt.files)
			if err == nil {
				t.Fatalf("accepted:\n%s", tt.yaml)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// TestCheckPrintsPolicy: sluice check prints the mode, every shadow window
// marked, the kind classes, the aggregates and the tiers with their
// members, limits and quota.
func TestCheckPrintsPolicy(t *testing.T) {
	c, err := loadIn(t, "", policyYAML, map[string]string{"members.txt": pkA + "\n"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printCheck(&out, c)
	s := out.String()
	for _, want := range []string{
		"mode: shadow",
		"240/60s (shadow)",
		"10/1s (shadow)", // mode shadow: every window
		"kind ephemeral (20000-29999, 1000)",
		"kind reactions (7)",
		"IPv6 /48  100/1s (shadow)",
		"IPv4 /24  200/1s (shadow)",
		"tier bots: 1 members; quota: no quota (unlimited)",
		"tier members: 1 members, pubkeys_file ",
		"quota: 6000 events per 60s",
		"    EVENT      50/1s (shadow)",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("sluice check lacks %q:\n%s", want, s)
		}
	}
	// In enforce mode only the window with shadow: true is marked.
	c, err = loadIn(t, "", strings.Replace(policyYAML, "mode: shadow", "mode: enforce", 1), map[string]string{"members.txt": pkA + "\n"})
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	printCheck(&out, c)
	s = out.String()
	if !strings.Contains(s, "mode: enforce") || !strings.Contains(s, "240/60s (shadow)") || strings.Contains(s, "10/1s (shadow)") {
		t.Errorf("enforce mode: want only the shadow: true windows marked:\n%s", s)
	}
}

// TestNIP11Policy: the document served publishes the kind classes, the
// mode and which windows are in shadow.
func TestNIP11Policy(t *testing.T) {
	c, err := loadIn(t, "", strings.Replace(policyYAML, "mode: shadow", "mode: enforce", 1), map[string]string{"members.txt": pkA + "\n"})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := buildPolicy(c, localQuotas(nil))
	if err != nil {
		t.Fatal(err)
	}
	type window struct {
		Rate   float64 `json:"rate"`
		Shadow bool    `json:"shadow"`
	}
	var doc struct {
		RateLimits struct {
			Mode    string              `json:"mode"`
			Message map[string][]window `json:"message"`
			Kinds   map[string]struct {
				Kinds  []any    `json:"kinds"`
				Limits []window `json:"limits"`
			} `json:"kinds"`
		} `json:"rate_limits"`
	}
	serve := func(lim nip11.Limitation) {
		t.Helper()
		h := &nip11.Handler{Limitation: lim}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		doc.RateLimits.Kinds = nil
		if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
	}
	serve(nip11Limitation(c, pc))
	rl := doc.RateLimits
	if rl.Mode != "enforce" {
		t.Errorf("mode %q, want enforce", rl.Mode)
	}
	if ev := rl.Message["EVENT"]; len(ev) != 2 || ev[0].Shadow || !ev[1].Shadow {
		t.Errorf("EVENT windows %+v: want the second marked shadow", ev)
	}
	r, e := rl.Kinds["reactions"], rl.Kinds["ephemeral"]
	if len(r.Kinds) != 1 || r.Kinds[0] != 7.0 || len(r.Limits) != 1 || r.Limits[0].Rate != 5 || r.Limits[0].Shadow {
		t.Errorf("kinds.reactions %+v", r)
	}
	if len(e.Kinds) != 2 || e.Kinds[0] != "20000-29999" || e.Kinds[1] != 1000.0 || !e.Limits[0].Shadow {
		t.Errorf("kinds.ephemeral %+v", e)
	}
	pc.Shadow = true
	serve(nip11Limitation(c, pc))
	if rl := doc.RateLimits; rl.Mode != "shadow" || rl.Message["EVENT"][0].Shadow != true || rl.Kinds["reactions"].Limits[0].Shadow != true {
		t.Errorf("mode shadow: %+v, want mode shadow and every window shadow", rl)
	}
}

// shadowSeries returns the sluice_shadow_windows series m exports, by
// budget.
func shadowSeries(t *testing.T, m *metrics) map[string]float64 {
	t.Helper()
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "sluice_shadow_windows" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "budget" {
					out[l.GetValue()] = s.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// TestShadowWindowsMetric: sluice_shadow_windows counts the running
// policy's shadow windows by budget, and has no series without any.
func TestShadowWindowsMetric(t *testing.T) {
	m := newMetrics()
	c, err := parseAndValidate(nil)
	if err != nil {
		t.Fatal(err)
	}
	pc, _ := buildPolicy(c, localQuotas(nil))
	m.setPolicy(pc)
	if got := shadowSeries(t, m); len(got) != 0 {
		t.Errorf("sluice_shadow_windows %v with nothing in shadow", got)
	}
	c, err = loadIn(t, "", strings.Replace(policyYAML, "mode: shadow", "mode: enforce", 1), map[string]string{"members.txt": pkA + "\n"})
	if err != nil {
		t.Fatal(err)
	}
	pc, _ = buildPolicy(c, localQuotas(nil))
	m.setPolicy(pc)
	// The address's EVENT 240/60s, ephemeral's window, and bots' tier
	// has EVENT free; members' EVENT is its own 50/1s (not in shadow).
	want := map[string]float64{"EVENT": 1, "kind ephemeral": 1}
	if got := shadowSeries(t, m); !reflect.DeepEqual(got, want) {
		t.Errorf("sluice_shadow_windows %v, want %v", got, want)
	}
	pc.Shadow = true
	m.setPolicy(pc)
	got := shadowSeries(t, m)
	if got["EVENT"] != 2 || got["prefix IPv4 /24"] != 1 || got["connection"] != 1 || got["tier members EVENT"] != 1 {
		t.Errorf("mode shadow: sluice_shadow_windows %v", got)
	}
}

// TestReloadInProcess: the reloader applies a new file's policy to the
// gate and the NIP-11 document, refuses an invalid one keeping the
// running policy, and names the start-up fields a reload cannot change.
func TestReloadInProcess(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	load := func() (*config, error) {
		fc, err := loadConfigFile(path)
		if err != nil {
			return nil, err
		}
		return fc.validate()
	}
	write("limits: {max_filters: 8}\n")
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	gate, parts, m, err := newGate(t.Context(), cfg, logger, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer parts.close()
	info := &nip11.Handler{Limitation: nip11Limitation(cfg, parts.policy)}
	rl := &reloader{load: load, start: cfg, gate: gate, parts: parts, m: m, logger: logger,
		nip11: publishNIP11(info, func(*config, nip11.Limitation) ([]byte, error) { return nil, nil })}
	served := func() string {
		w := httptest.NewRecorder()
		info.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		return w.Body.String()
	}
	if reqFilters(parts.policy) != 8 || !strings.Contains(served(), `"max_filters":8`) {
		t.Fatalf("start: max filters %d, document %s", reqFilters(parts.policy), served())
	}

	write("listen: 127.0.0.1:1\nlimits: {max_filters: 4, kinds: {reactions: {kinds: [7], limits: [{rate: 5, period: 1s}]}}}\n")
	if err := rl.reload(); err != nil {
		t.Fatal(err)
	}
	if reqFilters(parts.policy) != 4 {
		t.Errorf("after reload: max filters %d, want 4", reqFilters(parts.policy))
	}
	if doc := served(); !strings.Contains(doc, `"max_filters":4`) || !strings.Contains(doc, `"reactions"`) {
		t.Errorf("after reload the document is %s", doc)
	}
	if !strings.Contains(logs.String(), "need a restart") || !strings.Contains(logs.String(), "fields=[listen]") {
		t.Errorf("a changed listen was not reported:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "configuration reloaded") || !strings.Contains(logs.String(), "kind_classes=1") {
		t.Errorf("no summary of the reload:\n%s", logs.String())
	}

	logs.Reset()
	write("limits: {max_filters: 2, kinds: {reactions: {kinds: [70000], limits: [{rate: 5, period: 1s}]}}}\n")
	if err := rl.reload(); err == nil {
		t.Fatal("an invalid file was applied")
	}
	if reqFilters(parts.policy) != 4 || !strings.Contains(served(), `"max_filters":4`) {
		t.Errorf("an invalid file changed the running policy: max filters %d", reqFilters(parts.policy))
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "limits.kinds.reactions.kinds[0]") {
		t.Errorf("the refusal does not name the field at level error:\n%s", logs.String())
	}
}
