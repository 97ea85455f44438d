package scan

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"github.com/sluice-relay/sluice/relay/wire"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
)

// scanMaxFilters is the filter bound the Scan tests run with.
const scanMaxFilters = 10

// scanBounds are the bounds the tests scan with: the defaults.
var scanBounds = &wire.Bounds{MaxFilters: scanMaxFilters}

const (
	scanPub = "6e468422dfb74a5738702a8823b9b28168abab8655faacb6853cd0ee15deee93"
	scanSig = "908a15e46fb4d8675bab026fc230a0e3542bfade63da02d542fb78b2a8513fcd0092619a2c8c1221e581946e0191f2af505dfdf8657a414dbca329186f009262"
)

// The fields of a canonical event, each as it appears in the object.
const (
	fKind    = `"kind":1`
	fID      = `"id":"` + testID + `"`
	fPubkey  = `"pubkey":"` + scanPub + `"`
	fCreated = `"created_at":1673347337`
	fTags    = `"tags":[["e","` + testID2 + `"],["p","` + scanPub + `"],["-"],["t","caf\u00e9","\"\\/\b\f\n\r\t"]]`
	fContent = `"content":"hello \"id\":\"x\" world \ud83d\ude00 ünïcødé"`
	fSig     = `"sig":"` + scanSig + `"`
)

// obj joins fields into an object.
func obj(fields ...string) string { return "{" + strings.Join(fields, ",") + "}" }

// evWith is the canonical event with the field named key replaced by
// repl (a whole `"key":value` or anything else), or dropped when repl is
// "".
func evWith(key, repl string) string {
	var fs []string
	for _, f := range []string{fKind, fID, fPubkey, fCreated, fTags, fContent, fSig} {
		if strings.HasPrefix(f, `"`+key+`":`) {
			if repl != "" {
				fs = append(fs, repl)
			}
			continue
		}
		fs = append(fs, f)
	}
	return obj(fs...)
}

// Canonical events in the orders clients write them.
var (
	// scanGoNostr is go-nostr's order (easyjson: kind first, id early).
	scanGoNostr = obj(fKind, fID, fPubkey, fCreated, fTags, fContent, fSig)
	// scanNostrTools is nostr-tools' finalizeEvent order: the template,
	// then pubkey, id and sig.
	scanNostrTools = obj(fKind, fCreated, fTags, fContent, fPubkey, fID, fSig)
	// scanIDLast has the id after everything, sig included.
	scanIDLast = obj(fKind, fCreated, fTags, fContent, fPubkey, fSig, fID)
	// scanPython is json.dumps' default spelling: ", " and ": ".
	scanPython = `{"id": "` + testID + `", "pubkey": "` + scanPub + `", "created_at": 1673347337, "kind": 1, "tags": [["e", "` + testID2 + `"]], "content": "hi", "sig": "` + scanSig + `"}`
)

// scanFilter uses every field of a filter.
const scanFilter = `{"ids":["` + testID + `"],"authors":["` + scanPub + `"],"kinds":[0,1,7,65535],"#e":["` + testID2 + `"],"#p":["` + scanPub + `"],"#T":[],"since":1673347337,"until":1673350000,"limit":20,"search":"nostr \"quoted\" caf\u00e9"}`

// scanAuth builds an AUTH event of kind 22242 with tags.
func scanAuth(kind, tags string) string {
	return obj(`"kind":`+kind, fID, fPubkey, `"created_at":1700000000`, `"tags":`+tags, `"content":""`, fSig)
}

const scanAuthTags = `[["relay","wss://relay.example.com/"],["challenge","chal-\"123\""]]`

// negOpenMsg is a whole negentropy message: version, the infinite bound,
// and an id list of one id.
const negOpenMsg = "6100000201" + testID

func repeatJoin(s string, n int, sep string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = s
	}
	return strings.Join(parts, sep)
}

// scanWant is what a canonical frame's Facts must hold. Zero strings mean
// nil, zero numbers 0.
type scanWant struct {
	typ              wire.Type
	sub              string // literal, quotes included
	filters          int
	id, pubkey       string // hex
	kind             int
	createdAt        int64
	neg              string
	challenge, relay string // literals
}

// scanCanonical are frames Scan must call canonical, with their facts.
var scanCanonical = []struct {
	name  string
	frame string
	want  scanWant
}{
	{"event go-nostr order", `["EVENT",` + scanGoNostr + `]`, scanWant{typ: wire.TypeEVENT, id: testID, pubkey: scanPub, kind: 1, createdAt: 1673347337}},
	{"event nostr-tools order", `["EVENT",` + scanNostrTools + `]`, scanWant{typ: wire.TypeEVENT, id: testID, pubkey: scanPub, kind: 1, createdAt: 1673347337}},
	{"event id last", `["EVENT",` + scanIDLast + `]`, scanWant{typ: wire.TypeEVENT, id: testID, pubkey: scanPub, kind: 1, createdAt: 1673347337}},
	{"event python spelling", `["EVENT", ` + scanPython + `]`, scanWant{typ: wire.TypeEVENT, id: testID, pubkey: scanPub, kind: 1, createdAt: 1673347337}},
	{"event whitespace everywhere allowed", "[\"EVENT\",\r\n\t { \"kind\" :\t0 ,\n" + fID + " , " + fPubkey + ",\"created_at\": 0,\"tags\" : [ [ \"a\" , \"b\" ] , [ \"-\" ] ] ,\"content\":\"\"," + fSig + "\n}\n]\r\n", scanWant{typ: wire.TypeEVENT, id: testID, pubkey: scanPub}},
	{"event kind 65535, empty tags", `["EVENT",` + obj(`"kind":65535`, fID, fPubkey, fCreated, `"tags":[]`, fContent, fSig) + `]`, scanWant{typ: wire.TypeEVENT, id: testID, pubkey: scanPub, kind: 65535, createdAt: 1673347337}},
	{"event created_at 2^56-2", `["EVENT",` + evWith("created_at", `"created_at":72057594037927934`) + `]`, scanWant{typ: wire.TypeEVENT, id: testID, pubkey: scanPub, kind: 1, createdAt: 1<<56 - 2}},
	{"event created_at 0", `["EVENT",` + evWith("created_at", `"created_at":0`) + `]`, scanWant{typ: wire.TypeEVENT, id: testID, pubkey: scanPub, kind: 1}},
	{"req one filter", `["REQ","sub:1",` + scanFilter + `]`, scanWant{typ: wire.TypeREQ, sub: `"sub:1"`, filters: 1}},
	{"req empty filter", `["REQ","s",{}]`, scanWant{typ: wire.TypeREQ, sub: `"s"`, filters: 1}},
	{"req maxFilters filters", `["REQ","many",` + repeatJoin(scanFilter, scanMaxFilters, ",") + `]`, scanWant{typ: wire.TypeREQ, sub: `"many"`, filters: scanMaxFilters}},
	{"req follow feed at the fan-out bound", `["REQ","feed",{"authors":[` + repeatJoin(`"`+scanPub+`"`, 2500, ",") + `],"kinds":[` + repeatJoin(`1`, wire.DefaultBounds().MaxFanout/2500, ",") + `],"limit":500}]`, scanWant{typ: wire.TypeREQ, sub: `"feed"`, filters: 1}},
	{"req values at the bound, narrow tag", `["REQ","s",{"#e":["` + testID2 + `"],"authors":[` + repeatJoin(`"`+scanPub+`"`, wire.DefaultBounds().MaxFilterValues, ",") + `],"kinds":[` + repeatJoin(`1`, 100, ",") + `]}]`, scanWant{typ: wire.TypeREQ, sub: `"s"`, filters: 1}},
	{"event tags at the bounds", `["EVENT",` + evWith("tags", `"tags":[["r","`+strings.Repeat("x", wire.DefaultBounds().MaxTagValueBytes)+`"],["d",""],["-"],["client"],`+repeatJoin(`["t","x"]`, wire.DefaultBounds().MaxTags-4, ",")+`]`) + `]`, scanWant{typ: wire.TypeEVENT, id: testID, pubkey: scanPub, kind: 1, createdAt: 1673347337}},
	{"req python spelling", `["REQ", "sub", {"kinds": [1], "limit": 10}, {"#e": ["` + testID2 + `"]}]`, scanWant{typ: wire.TypeREQ, sub: `"sub"`, filters: 2}},
	{"req whitespace", "[\"REQ\", \"s\" ,\n{ } , {\"limit\":0}\t]\n", scanWant{typ: wire.TypeREQ, sub: `"s"`, filters: 2}},
	{"req sub id of 64 bytes", `["REQ","` + strings.Repeat("x", 64) + `",{}]`, scanWant{typ: wire.TypeREQ, sub: `"` + strings.Repeat("x", 64) + `"`, filters: 1}},
	{"req sub id utf-8", `["REQ","süß🙂",{}]`, scanWant{typ: wire.TypeREQ, sub: `"süß🙂"`, filters: 1}},
	{"count one filter", `["COUNT","c1",{"kinds":[3],"#p":["` + scanPub + `"]}]`, scanWant{typ: wire.TypeCOUNT, sub: `"c1"`, filters: 1}},
	{"close", `["CLOSE","sub:1"]`, scanWant{typ: wire.TypeCLOSE, sub: `"sub:1"`}},
	{"neg-open", `["NEG-OPEN","neg1",{"kinds":[1]},"` + negOpenMsg + `"]`, scanWant{typ: wire.TypeNEGOPEN, sub: `"neg1"`, filters: 1, neg: negOpenMsg}},
	{"neg-open empty set", `["NEG-OPEN","neg1",{},"6100000200"]`, scanWant{typ: wire.TypeNEGOPEN, sub: `"neg1"`, filters: 1, neg: "6100000200"}},
	{"neg-msg", `["NEG-MSG","neg1","61000001` + strings.Repeat("ab", 16) + `"]`, scanWant{typ: wire.TypeNEGMSG, sub: `"neg1"`, neg: "61000001" + strings.Repeat("ab", 16)}},
	{"neg-msg version only", `["NEG-MSG","neg1","61"]`, scanWant{typ: wire.TypeNEGMSG, sub: `"neg1"`, neg: "61"}},
	{"neg-close", `["NEG-CLOSE","neg1"]`, scanWant{typ: wire.TypeNEGCLOSE, sub: `"neg1"`}},
	{"auth", `["AUTH",` + scanAuth("22242", scanAuthTags) + `]`, scanWant{typ: wire.TypeAUTH, id: testID, pubkey: scanPub, kind: kindAuth, createdAt: 1700000000, challenge: `"chal-\"123\""`, relay: `"wss://relay.example.com/"`}},
	{"auth first tags count", `["AUTH",` + scanAuth("22242", `[["challenge"],["relay","wss://a.example"],["challenge","one"],["relay","wss://b.example"],["challenge","two"]]`) + `]`, scanWant{typ: wire.TypeAUTH, id: testID, pubkey: scanPub, kind: kindAuth, createdAt: 1700000000, challenge: `"one"`, relay: `"wss://a.example"`}},
	{"auth escaped tag names", `["AUTH",` + scanAuth("22242", `[["\u0072elay","wss://first.example"],["relay","wss://second.example"],["ch\u0061llenge","c1"],["challenge","c2"],["\u00e9","x"]]`) + `]`, scanWant{typ: wire.TypeAUTH, id: testID, pubkey: scanPub, kind: kindAuth, createdAt: 1700000000, challenge: `"c1"`, relay: `"wss://first.example"`}},
	{"auth without tags", `["AUTH",` + scanAuth("22242", `[]`) + `]`, scanWant{typ: wire.TypeAUTH, id: testID, pubkey: scanPub, kind: kindAuth, createdAt: 1700000000}},
}

// scanHostile are frames Scan must refuse, with the reason.
var scanHostile = []struct {
	name, frame, reason string
}{
	// EVENT's envelope.
	{"event three elements (go-nostr reads the last object)", `["EVENT",` + scanGoNostr + `,` + evWith("kind", `"kind":7`) + `]`, reasonShape},
	{"event with sub id", `["EVENT","sub",` + scanGoNostr + `]`, reasonEvent},
	{"event alone", `["EVENT"]`, reasonShape},
	{"event not an object", `["EVENT",[` + scanGoNostr + `]]`, reasonEvent},
	{"event null", `["EVENT",null]`, reasonEvent},
	{"event trailing comma", `["EVENT",` + scanGoNostr + `,]`, reasonShape},
	{"event trailing bracket", `["EVENT",` + scanGoNostr + `]]`, reasonShape},
	{"event trailing garbage", `["EVENT",` + scanGoNostr + `] x`, reasonShape},
	{"event trailing NUL", `["EVENT",` + scanGoNostr + "]\x00", reasonShape},
	{"event trailing second frame", `["EVENT",` + scanGoNostr + `]["REQ","s",{}]`, reasonShape},
	{"event truncated after object", `["EVENT",` + scanGoNostr, reasonShape},
	{"event truncated in object", `["EVENT",` + scanGoNostr[:100], reasonEvent},
	{"event truncated in string", `["EVENT",{"content":"abc`, reasonEvent},
	{"event truncated after label", `["EVENT",`, reasonEvent},
	{"event space before comma", `["EVENT" ,` + scanGoNostr + `]`, reasonShape},
	{"event whitespace before label", `[ "EVENT",` + scanGoNostr + `]`, reasonShape},
	{"event whitespace before frame", ` ["EVENT",` + scanGoNostr + `]`, reasonShape},
	{"event escaped label", `["\u0045VENT",` + scanGoNostr + `]`, reasonShape},
	{"solidus-escaped label", `["NEG\/OPEN","s",{},"61"]`, reasonUnknownType},
	{"event kind 22242", `["EVENT",` + scanAuth("22242", scanAuthTags) + `]`, reasonEventKind},

	// The event's fields.
	{"duplicate id", `["EVENT",` + evWith("id", fID+`,"id":"`+testID2+`"`) + `]`, reasonEvent},
	{"duplicate kind", `["EVENT",` + evWith("kind", `"kind":1,"kind":7`) + `]`, reasonEvent},
	{"duplicate tags", `["EVENT",` + evWith("tags", fTags+`,"tags":[]`) + `]`, reasonEvent},
	{"escaped key id", `["EVENT",` + evWith("id", `"\u0069d":"`+testID+`"`) + `]`, reasonEvent},
	{"escaped key kind after kind", `["EVENT",` + evWith("kind", `"kind":1,"\u006bind":7`) + `]`, reasonEvent},
	{"case-folded key ID", `["EVENT",` + evWith("id", `"ID":"`+testID+`"`) + `]`, reasonEvent},
	{"case-folded key Pubkey", `["EVENT",` + evWith("pubkey", `"Pubkey":"`+scanPub+`"`) + `]`, reasonEvent},
	{"case-folded duplicate KIND", `["EVENT",` + evWith("kind", `"kind":1,"KIND":7`) + `]`, reasonEvent},
	{"unknown field", `["EVENT",` + evWith("sig", fSig+`,"relays":[]`) + `]`, reasonEvent},
	{"unknown field ots", `["EVENT",` + evWith("sig", fSig+`,"ots":"x"`) + `]`, reasonEvent},
	{"missing id", `["EVENT",` + evWith("id", "") + `]`, reasonEvent},
	{"missing pubkey", `["EVENT",` + evWith("pubkey", "") + `]`, reasonEvent},
	{"missing created_at", `["EVENT",` + evWith("created_at", "") + `]`, reasonEvent},
	{"missing kind", `["EVENT",` + evWith("kind", "") + `]`, reasonEvent},
	{"missing tags", `["EVENT",` + evWith("tags", "") + `]`, reasonEvent},
	{"missing content", `["EVENT",` + evWith("content", "") + `]`, reasonEvent},
	{"missing sig", `["EVENT",` + evWith("sig", "") + `]`, reasonEvent},
	{"empty event", `["EVENT",{}]`, reasonEvent},
	{"uppercase hex id", `["EVENT",` + evWith("id", `"id":"`+strings.ToUpper(testID)+`"`) + `]`, reasonEvent},
	{"uppercase hex pubkey", `["EVENT",` + evWith("pubkey", `"pubkey":"`+strings.ToUpper(scanPub)+`"`) + `]`, reasonEvent},
	{"uppercase hex sig", `["EVENT",` + evWith("sig", `"sig":"`+strings.ToUpper(scanSig)+`"`) + `]`, reasonEvent},
	{"escaped hex id", `["EVENT",` + evWith("id", `"id":"\u0034`+testID[1:]+`"`) + `]`, reasonEvent},
	{"short id", `["EVENT",` + evWith("id", `"id":"`+testID[:63]+`"`) + `]`, reasonEvent},
	{"long pubkey", `["EVENT",` + evWith("pubkey", `"pubkey":"`+scanPub+`0"`) + `]`, reasonEvent},
	{"sig of 126 digits", `["EVENT",` + evWith("sig", `"sig":"`+scanSig[:126]+`"`) + `]`, reasonEvent},
	{"sig of 130 digits", `["EVENT",` + evWith("sig", `"sig":"`+scanSig+`00"`) + `]`, reasonEvent},
	{"sig of 64 digits", `["EVENT",` + evWith("sig", `"sig":"`+testID+`"`) + `]`, reasonEvent},
	{"id a number", `["EVENT",` + evWith("id", `"id":1`) + `]`, reasonEvent},
	{"kind 1.0", `["EVENT",` + evWith("kind", `"kind":1.0`) + `]`, reasonEvent},
	{"kind 1e3", `["EVENT",` + evWith("kind", `"kind":1e3`) + `]`, reasonEvent},
	{"kind 1E3", `["EVENT",` + evWith("kind", `"kind":1E3`) + `]`, reasonEvent},
	{"kind -1", `["EVENT",` + evWith("kind", `"kind":-1`) + `]`, reasonEvent},
	{"kind -0", `["EVENT",` + evWith("kind", `"kind":-0`) + `]`, reasonEvent},
	{"kind 65536", `["EVENT",` + evWith("kind", `"kind":65536`) + `]`, reasonEvent},
	{"kind 100000", `["EVENT",` + evWith("kind", `"kind":100000`) + `]`, reasonEvent},
	{"kind 01", `["EVENT",` + evWith("kind", `"kind":01`) + `]`, reasonEvent},
	{"kind 00", `["EVENT",` + evWith("kind", `"kind":00`) + `]`, reasonEvent},
	{"kind a string", `["EVENT",` + evWith("kind", `"kind":"1"`) + `]`, reasonEvent},
	{"kind true", `["EVENT",` + evWith("kind", `"kind":true`) + `]`, reasonEvent},
	{"kind +1", `["EVENT",` + evWith("kind", `"kind":+1`) + `]`, reasonEvent},
	{"kind hex", `["EVENT",` + evWith("kind", `"kind":0x1`) + `]`, reasonEvent},
	{"created_at float", `["EVENT",` + evWith("created_at", `"created_at":1673347337.5`) + `]`, reasonEvent},
	{"created_at 1.0", `["EVENT",` + evWith("created_at", `"created_at":1673347337.0`) + `]`, reasonEvent},
	{"created_at exponent", `["EVENT",` + evWith("created_at", `"created_at":1.673347337e9`) + `]`, reasonEvent},
	{"created_at negative", `["EVENT",` + evWith("created_at", `"created_at":-1`) + `]`, reasonEvent},
	{"created_at 2^56-1 (go-nostr's negentropy cannot write it)", `["EVENT",` + evWith("created_at", `"created_at":72057594037927935`) + `]`, reasonEvent},
	{"created_at 18 digits", `["EVENT",` + evWith("created_at", `"created_at":100000000000000000`) + `]`, reasonEvent},
	{"created_at 19 digits", `["EVENT",` + evWith("created_at", `"created_at":9223372036854775807`) + `]`, reasonEvent},
	{"created_at a string", `["EVENT",` + evWith("created_at", `"created_at":"1673347337"`) + `]`, reasonEvent},
	{"tags with a number", `["EVENT",` + evWith("tags", `"tags":[["e",1]]`) + `]`, reasonEvent},
	{"tags with null", `["EVENT",` + evWith("tags", `"tags":[["e",null]]`) + `]`, reasonEvent},
	{"tags with null tag", `["EVENT",` + evWith("tags", `"tags":[null]`) + `]`, reasonEvent},
	{"tags with an object", `["EVENT",` + evWith("tags", `"tags":[["e","x"],{"id":"`+testID2+`"}]`) + `]`, reasonEvent},
	// What relays index by position, and what an index costs.
	{"tag empty", `["EVENT",` + evWith("tags", `"tags":[["t","x"],[]]`) + `]`, reasonTagEmpty},
	{"tag d without value", `["EVENT",` + evWith("tags", `"tags":[["d"]]`) + `]`, reasonTagNoValue},
	{"tag escaped d without value", `["EVENT",` + evWith("tags", `"tags":[["\u0064"]]`) + `]`, reasonTagNoValue},
	{"tag P without value", `["EVENT",` + evWith("tags", `"tags":[["e","x"],["P"]]`) + `]`, reasonTagNoValue},
	{"tags one too many", `["EVENT",` + evWith("tags", `"tags":[`+repeatJoin(`["t","x"]`, wire.DefaultBounds().MaxTags+1, ",")+`]`) + `]`, reasonTags},
	{"tag value too long", `["EVENT",` + evWith("tags", `"tags":[["r","`+strings.Repeat("x", wire.DefaultBounds().MaxTagValueBytes+1)+`"]]`) + `]`, reasonTagValue},
	{"tag value too long as written", `["EVENT",` + evWith("tags", `"tags":[["t","`+strings.Repeat(`\n`, wire.DefaultBounds().MaxTagValueBytes/2)+`x"]]`) + `]`, reasonTagValue},
	{"filter too many authors", `["REQ","s",{"authors":[` + repeatJoin(`"`+scanPub+`"`, wire.DefaultBounds().MaxFilterValues+1, ",") + `]}]`, reasonFilterValues},
	{"filter too many kinds", `["REQ","s",{"kinds":[` + repeatJoin(`1`, wire.DefaultBounds().MaxFilterValues+1, ",") + `]}]`, reasonFilterValues},
	{"filter too many tag values", `["COUNT","s",{"#t":[` + repeatJoin(`"x"`, wire.DefaultBounds().MaxFilterValues+1, ",") + `]}]`, reasonFilterValues},
	{"filter too many ids NEG-OPEN", `["NEG-OPEN","s",{"ids":[` + repeatJoin(`"`+testID+`"`, wire.DefaultBounds().MaxFilterValues+1, ",") + `]},"` + negOpenMsg + `"]`, reasonFilterValues},
	{"filter fan-out authors x kinds", `["REQ","s",{"authors":[` + repeatJoin(`"`+scanPub+`"`, 480, ",") + `],"kinds":[` + repeatJoin(`1`, 4000, ",") + `]}]`, reasonFanout},
	{"filter fan-out one over", `["REQ","s",{"kinds":[` + repeatJoin(`7`, 11, ",") + `],"authors":[` + repeatJoin(`"`+scanPub+`"`, wire.DefaultBounds().MaxFanout/10, ",") + `],"#p":["x"]}]`, reasonFanout},
	{"tags with a nested array", `["EVENT",` + evWith("tags", `"tags":[["e",["x"]]]`) + `]`, reasonEvent},
	{"tags of strings", `["EVENT",` + evWith("tags", `"tags":["e","x"]`) + `]`, reasonEvent},
	{"tags as object", `["EVENT",` + evWith("tags", `"tags":{"e":"x"}`) + `]`, reasonEvent},
	{"tags a string", `["EVENT",` + evWith("tags", `"tags":"[]"`) + `]`, reasonEvent},
	{"tags trailing comma", `["EVENT",` + evWith("tags", `"tags":[["e","x"],]`) + `]`, reasonEvent},
	{"content a number", `["EVENT",` + evWith("content", `"content":1`) + `]`, reasonEvent},
	{"content an object", `["EVENT",` + evWith("content", `"content":{"a":"b"}`) + `]`, reasonEvent},
	{"content with raw newline", `["EVENT",` + evWith("content", "\"content\":\"a\nb\"") + `]`, reasonEvent},
	{"content with raw tab", `["EVENT",` + evWith("content", "\"content\":\"a\tb\"") + `]`, reasonEvent},
	{"content with bad escape", `["EVENT",` + evWith("content", `"content":"a\x41"`) + `]`, reasonEvent},
	{"content with short \\u", `["EVENT",` + evWith("content", `"content":"a\u12"`) + `]`, reasonEvent},
	{"content with single quotes", `["EVENT",` + evWith("content", `"content":'a'`) + `]`, reasonEvent},
	{"null id", `["EVENT",` + evWith("id", `"id":null`) + `]`, reasonEvent},
	{"null content", `["EVENT",` + evWith("content", `"content":null`) + `]`, reasonEvent},
	{"null tags", `["EVENT",` + evWith("tags", `"tags":null`) + `]`, reasonEvent},
	{"null kind", `["EVENT",` + evWith("kind", `"kind":null`) + `]`, reasonEvent},
	{"null sig", `["EVENT",` + evWith("sig", `"sig":null`) + `]`, reasonEvent},
	{"missing colon", `["EVENT",` + evWith("kind", `"kind" 1`) + `]`, reasonEvent},
	{"object trailing comma", `["EVENT",` + strings.TrimSuffix(scanGoNostr, "}") + `,}]`, reasonEvent},
	{"unquoted key", `["EVENT",` + evWith("kind", `kind:1`) + `]`, reasonEvent},
	{"invalid utf-8 in content", `["EVENT",` + evWith("content", "\"content\":\"a\xffb\"") + `]`, reasonNotUTF8},
	{"overlong utf-8 in content", `["EVENT",` + evWith("content", "\"content\":\"\xc0\xaf\"") + `]`, reasonNotUTF8},
	{"utf-8 surrogate in tags", `["EVENT",` + evWith("tags", "\"tags\":[[\"\xed\xa0\x80\"]]") + `]`, reasonNotUTF8},

	// REQ and COUNT.
	{"req no filters", `["REQ","sub"]`, reasonShape},
	{"req empty filter slot", `["REQ","sub",]`, reasonFilter},
	{"req maxFilters+1", `["REQ","many",` + repeatJoin(`{}`, scanMaxFilters+1, ",") + `]`, ReasonFilters},
	{"req 1000 filters", `["REQ","many",` + repeatJoin(`{"kinds":[1]}`, 1000, ",") + `]`, ReasonFilters},
	{"req filter unknown key count", `["REQ","s",{"count":1}]`, reasonFilter},
	{"req filter unknown key", `["REQ","s",{"kinds":[1],"relay":"x"}]`, reasonFilter},
	{"req filter case-folded key", `["REQ","s",{"Kinds":[1]}]`, reasonFilter},
	{"req filter escaped key", `["REQ","s",{"\u006binds":[1]}]`, reasonFilter},
	{"req filter key #ab", `["REQ","s",{"#ab":["x"]}]`, reasonFilter},
	{"req filter key #", `["REQ","s",{"#":["x"]}]`, reasonFilter},
	{"req filter key #1", `["REQ","s",{"#1":["x"]}]`, reasonFilter},
	{"req filter key #é", `["REQ","s",{"#é":["x"]}]`, reasonFilter},
	{"req filter key &e", `["REQ","s",{"&e":["x"]}]`, reasonFilter},
	{"req filter duplicate #e", `["REQ","s",{"#e":["` + testID + `"],"#e":["` + testID2 + `"]}]`, reasonFilter},
	{"req filter duplicate kinds", `["REQ","s",{"kinds":[1],"kinds":[7]}]`, reasonFilter},
	{"req filter duplicate limit", `["REQ","s",{"limit":1,"limit":500}]`, reasonFilter},
	{"req filter duplicate since", `["REQ","s",{"since":1,"since":2}]`, reasonFilter},
	{"req filter kinds strings", `["REQ","s",{"kinds":["1"]}]`, reasonFilter},
	{"req filter kinds negative", `["REQ","s",{"kinds":[-1]}]`, reasonFilter},
	{"req filter kinds 65536", `["REQ","s",{"kinds":[65536]}]`, reasonFilter},
	{"req filter kinds float", `["REQ","s",{"kinds":[1.0]}]`, reasonFilter},
	{"req filter kinds null", `["REQ","s",{"kinds":null}]`, reasonFilter},
	{"req filter kinds a number", `["REQ","s",{"kinds":1}]`, reasonFilter},
	{"req filter limit 1.5", `["REQ","s",{"limit":1.5}]`, reasonFilter},
	{"req filter limit negative", `["REQ","s",{"limit":-1}]`, reasonFilter},
	{"req filter limit 10 digits", `["REQ","s",{"limit":1000000000}]`, reasonFilter},
	{"req filter limit null", `["REQ","s",{"limit":null}]`, reasonFilter},
	{"req filter limit a string", `["REQ","s",{"limit":"10"}]`, reasonFilter},
	{"req filter since a string", `["REQ","s",{"since":"1"}]`, reasonFilter},
	{"req filter until exponent", `["REQ","s",{"until":1e9}]`, reasonFilter},
	{"req filter ids a string", `["REQ","s",{"ids":"` + testID + `"}]`, reasonFilter},
	{"req filter ids numbers", `["REQ","s",{"ids":[1]}]`, reasonFilter},
	{"req filter authors null", `["REQ","s",{"authors":[null]}]`, reasonFilter},
	{"req filter tag values numbers", `["REQ","s",{"#e":[1]}]`, reasonFilter},
	{"req filter tag null", `["REQ","s",{"#e":null}]`, reasonFilter},
	{"req filter search a number", `["REQ","s",{"search":1}]`, reasonFilter},
	{"req filter an array", `["REQ","s",[]]`, reasonFilter},
	{"req filter a string", `["REQ","s","{}"]`, reasonFilter},
	{"req filter null", `["REQ","s",null]`, reasonFilter},
	{"req second filter bad", `["REQ","s",{},{"count":1}]`, reasonFilter},
	{"req truncated in filter", `["REQ","s",{"kinds":[1`, reasonFilter},
	{"req truncated after filter", `["REQ","s",{"kinds":[1]}`, reasonShape},
	{"req truncated in sub id", `["REQ","su`, reasonSubID},
	{"req sub id empty", `["REQ","",{}]`, reasonSubID},
	{"req sub id 65 bytes", `["REQ","` + strings.Repeat("x", 65) + `",{}]`, reasonSubID},
	{"req sub id 65 bytes of utf-8", `["REQ","` + strings.Repeat("x", 63) + `é",{}]`, reasonSubID},
	{"req sub id escaped quote", `["REQ","a\"b",{}]`, reasonSubID},
	{"req sub id escaped letter", `["REQ","\u0061",{}]`, reasonSubID},
	{"req sub id escaped solidus", `["REQ","a\/b",{}]`, reasonSubID},
	{"req sub id control char", "[\"REQ\",\"a\x01b\",{}]", reasonSubID},
	{"req sub id tab", "[\"REQ\",\"a\tb\",{}]", reasonSubID},
	{"req sub id a number", `["REQ",1,{}]`, reasonSubID},
	{"req sub id null", `["REQ",null,{}]`, reasonSubID},
	{"req sub id invalid utf-8", "[\"REQ\",\"a\xffb\",{}]", reasonNotUTF8},
	{"count two filters", `["COUNT","c",{"kinds":[1]},{"kinds":[7]}]`, reasonCountOne},
	{"count no filter", `["COUNT","c"]`, reasonShape},
	{"count as a reply", `["COUNT","c",{"count":5}]`, reasonFilter},
	{"count sub id escaped", `["COUNT","\u0063",{}]`, reasonSubID},

	// CLOSE and NEG-*.
	{"close alone", `["CLOSE"]`, reasonShape},
	{"close two ids", `["CLOSE","a","b"]`, reasonShape},
	{"close sub id a number", `["CLOSE",1]`, reasonSubID},
	{"close truncated", `["CLOSE","s"`, reasonShape},
	{"close sub id escaped", `["CLOSE","\u0073"]`, reasonSubID},
	{"neg-open no filter", `["NEG-OPEN","s","6100000200"]`, reasonFilter},
	{"neg-open no message", `["NEG-OPEN","s",{}]`, reasonShape},
	{"neg-open bad message", `["NEG-OPEN","s",{},"6200000200"]`, reasonNegentropy},
	{"neg-open uppercase message", `["NEG-OPEN","s",{},"6100000201` + strings.ToUpper(testID) + `"]`, reasonNegentropy},
	{"neg-open escaped message", `["NEG-OPEN","s",{},"\u0036100000200"]`, reasonNegentropy},
	{"neg-open message a number", `["NEG-OPEN","s",{},6100000200]`, reasonNegentropy},
	{"neg-open empty message", `["NEG-OPEN","s",{},""]`, reasonNegentropy},
	{"neg-open panicking message", `["NEG-OPEN","s",{},"` + negPanicReadBound + `"]`, reasonNegentropy},
	{"neg-open wrapping message", `["NEG-OPEN","s",{},"` + negPanicWrap + `"]`, reasonNegentropy},
	{"neg-open two filters", `["NEG-OPEN","s",{},{},"6100000200"]`, reasonNegentropy},
	{"neg-open extra element", `["NEG-OPEN","s",{},"6100000200","x"]`, reasonShape},
	{"neg-open bad filter", `["NEG-OPEN","s",{"count":1},"6100000200"]`, reasonFilter},
	{"neg-msg no message", `["NEG-MSG","s"]`, reasonShape},
	{"neg-msg odd message", `["NEG-MSG","s","610"]`, reasonNegentropy},
	{"neg-msg extra element", `["NEG-MSG","s","61",1]`, reasonShape},
	{"neg-close extra element", `["NEG-CLOSE","s","x"]`, reasonShape},
	{"neg-close sub id 65 bytes", `["NEG-CLOSE","` + strings.Repeat("n", 65) + `"]`, reasonSubID},

	// AUTH.
	{"auth kind 1", `["AUTH",` + scanAuth("1", scanAuthTags) + `]`, reasonAuthKind},
	{"auth kind 22243", `["AUTH",` + scanAuth("22243", scanAuthTags) + `]`, reasonAuthKind},
	{"auth a challenge string", `["AUTH","challenge"]`, reasonEvent},
	{"auth two events", `["AUTH",` + scanAuth("22242", scanAuthTags) + `,` + scanAuth("22242", scanAuthTags) + `]`, reasonShape},
	{"auth bad tags", `["AUTH",` + scanAuth("22242", `[["challenge",1]]`) + `]`, reasonEvent},

	// Not Nostr, or not a known type.
	{"unknown label", `["FOO",1]`, reasonUnknownType},
	{"relay label NOTICE", `["NOTICE","x"]`, reasonUnknownType},
	{"relay label OK", `["OK","` + testID + `",true,""]`, reasonUnknownType},
	{"lower-case label", `["event",` + scanGoNostr + `]`, reasonUnknownType},
	{"NEG-ERR", `["NEG-ERR","s","x"]`, reasonUnknownType},
	{"label OTHER", `["OTHER"]`, reasonUnknownType},
	{"number first", `[1,"X"]`, reasonNotNostr},
	{"number before label", `[0,"EVENT",` + scanGoNostr + `]`, reasonNotNostr},
	{"comma label", `[",",1]`, reasonNotNostr},
	{"object", `{"EVENT":1}`, reasonNotNostr},
	{"empty array", `[]`, reasonNotNostr},
	{"empty frame", ``, reasonNotNostr},
	{"bom", "\xef\xbb\xbf[\"EVENT\"," + scanGoNostr + "]", reasonNotNostr},
	{"truncated label", `["EVE`, reasonNotNostr},
	{"label only", `["EVENT"`, reasonNotNostr},
	{"invalid utf-8 label", "[\"EV\xffT\",{}]", reasonUnknownType},
}

func TestScanCanonical(t *testing.T) {
	for _, tc := range scanCanonical {
		t.Run(tc.name, func(t *testing.T) {
			frame := []byte(tc.frame)
			orig := bytes.Clone(frame)
			f, reason := scanShape(frame, scanBounds)
			if reason != "" {
				t.Fatalf("Scan(%s) = %q, want canonical", frame, reason)
			}
			if !bytes.Equal(frame, orig) {
				t.Fatal("Scan modified its input")
			}
			checkFacts(t, frame, f, tc.want)
		})
	}
}

// checkFacts compares f with want and checks that every slice of f is a
// piece of the frame.
func checkFacts(t *testing.T, frame []byte, f Facts, want scanWant) {
	t.Helper()
	ev := f.Event
	lits := []struct {
		name string
		got  []byte
		want string
	}{
		{"SubID", f.SubID, want.sub},
		{"neg", f.neg, want.neg},
		{"Challenge", ev.Challenge, want.challenge},
		{"Relay", ev.Relay, want.relay},
	}
	if f.typ != want.typ {
		t.Errorf("Type = %v, want %v", f.typ, want.typ)
	}
	for _, l := range lits {
		switch {
		case l.want == "" && l.got != nil:
			t.Errorf("%s = %q, want nil", l.name, l.got)
		case string(l.got) != l.want:
			t.Errorf("%s = %q, want %q", l.name, l.got, l.want)
		case l.got != nil && !isSubSlice(frame, l.got):
			t.Errorf("%s %q is not a piece of the frame", l.name, l.got)
		}
	}
	if f.Filters != want.filters {
		t.Errorf("Filters = %d, want %d", f.Filters, want.filters)
	}
	if ev.Kind != want.kind || ev.CreatedAt != want.createdAt {
		t.Errorf("Kind, CreatedAt = %d, %d; want %d, %d", ev.Kind, ev.CreatedAt, want.kind, want.createdAt)
	}
	if want.id == "" {
		if ev.iDLit != nil || ev.Raw != nil || ev.ID != (Hex32{}) || ev.Pubkey != (Hex32{}) {
			t.Errorf("Event = %+v, want none", ev)
		}
		return
	}
	if ev.ID.String() != want.id || ev.Pubkey.String() != want.pubkey {
		t.Errorf("ID, Pubkey = %s, %s; want %s, %s", ev.ID, ev.Pubkey, want.id, want.pubkey)
	}
	if string(ev.iDLit) != `"`+want.id+`"` || !isSubSlice(frame, ev.iDLit) {
		t.Errorf("iDLit = %q, want the id's literal in the frame", ev.iDLit)
	}
	if len(ev.Raw) < 2 || ev.Raw[0] != '{' || ev.Raw[len(ev.Raw)-1] != '}' || !isSubSlice(frame, ev.Raw) {
		t.Errorf("Raw = %.40q…, want the event object in the frame", ev.Raw)
	}
	// Raw is the second element exactly: what follows is whitespace and
	// the closing bracket.
	end := bytes.Index(frame, ev.Raw) + len(ev.Raw)
	if rest := bytes.TrimSpace(frame[end:]); string(rest) != "]" {
		t.Errorf("after Raw: %q, want ]", rest)
	}
}

// TestScanGoNostrFrames: frames go-nostr itself writes are canonical.
func TestScanGoNostrFrames(t *testing.T) {
	ev := nostr.Event{
		ID: testID, PubKey: scanPub, CreatedAt: 1673347337, Kind: 1,
		Tags:    nostr.Tags{{"e", testID2, "wss://relay.example.com", "reply"}, {"p", scanPub}, {"t", "ü\"\\\n<&>"}},
		Content: "hello \u2028 \"world\" <b>&</b> \x01 \U0001F600",
		Sig:     scanSig,
	}
	since := nostr.Timestamp(1673347337)
	filters := nostr.Filters{
		{Kinds: []int{1, 6}, Authors: []string{scanPub}, Limit: 10, Since: &since},
		{IDs: []string{testID}, Tags: nostr.TagMap{"e": {testID2}, "p": {scanPub}}, Search: "x"},
		{LimitZero: true, Kinds: []int{0}},
	}
	auth := ev
	auth.Kind, auth.Tags = kindAuth, nostr.Tags{{"relay", "wss://relay.example.com"}, {"challenge", "ch"}}
	for _, tc := range []struct {
		env  interface{ MarshalJSON() ([]byte, error) }
		typ  wire.Type
		want int // filters
	}{
		{nostr.EventEnvelope{Event: ev}, wire.TypeEVENT, 0},
		{nostr.ReqEnvelope{SubscriptionID: "sub", Filters: filters}, wire.TypeREQ, 3},
		{nostr.CountEnvelope{SubscriptionID: "sub", Filter: filters[1]}, wire.TypeCOUNT, 1},
		{nostr.CloseEnvelope("sub"), wire.TypeCLOSE, 0},
		{nostr.AuthEnvelope{Event: auth}, wire.TypeAUTH, 0},
	} {
		frame, err := tc.env.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		f, reason := scanShape(frame, scanBounds)
		if reason != "" || f.typ != tc.typ || f.Filters != tc.want {
			t.Errorf("Scan(%s) = %v %d %q, want %v %d canonical", frame, f.typ, f.Filters, reason, tc.typ, tc.want)
		}
		if tc.typ == wire.TypeEVENT || tc.typ == wire.TypeAUTH {
			if f.Event.ID.String() != testID || f.Event.Pubkey.String() != scanPub || f.Event.CreatedAt != 1673347337 {
				t.Errorf("Scan(%s) event %+v", frame, f.Event)
			}
		}
		if tc.typ == wire.TypeAUTH && (string(f.Event.Challenge) != `"ch"` || string(f.Event.Relay) != `"wss://relay.example.com"`) {
			t.Errorf("Scan(%s): challenge %s, relay %s", frame, f.Event.Challenge, f.Event.Relay)
		}
	}
}

func TestScanHostile(t *testing.T) {
	for _, tc := range scanHostile {
		t.Run(tc.name, func(t *testing.T) {
			frame := []byte(tc.frame)
			f, reason := scanShape(frame, scanBounds)
			if reason != tc.reason {
				t.Errorf("Scan(%.300q) = %q, want %q", frame, reason, tc.reason)
			}
			// The type is Peek's whatever the shape: it decides the bucket.
			if want := Peek(frame).Type; f.typ != want {
				t.Errorf("Type = %v, Peek says %v", f.typ, want)
			}
		})
	}
}

// TestScanMaxFilters: the bound is the caller's.
func TestScanMaxFilters(t *testing.T) {
	frame := []byte(`["REQ","s",{},{},{}]`)
	for max, want := range []string{"", ReasonFilters, ReasonFilters, "", ""} {
		if _, reason := scanShape(frame, &wire.Bounds{MaxFilters: max}); reason != want {
			t.Errorf("Scan with MaxFilters %d = %q, want %q", max, reason, want)
		}
	}
	if _, reason := scanShape([]byte(`["NEG-OPEN","s",{},"61"]`), &wire.Bounds{MaxFilters: 1}); reason != "" {
		t.Errorf("NEG-OPEN with MaxFilters 1 = %q", reason)
	}
	many := []byte(`["REQ","s",` + repeatJoin(`{}`, wire.DefaultBounds().MaxFilters+1, ",") + `]`)
	if _, reason := scanShape(many, nil); reason != ReasonFilters {
		t.Errorf("%d filters with nil wire.Bounds = %q, want %q", wire.DefaultBounds().MaxFilters+1, reason, ReasonFilters)
	}
}

// TestUnquote: literals decode as encoding/json reads them, within dst.
func TestUnquote(t *testing.T) {
	for _, tc := range []struct {
		lit, want string
		ok        bool
	}{
		{`"abc"`, "abc", true},
		{`""`, "", true},
		{`"a\"b\\c\/d\n\t"`, "a\"b\\c/d\n\t", true},
		{`"\u0041\u007f"`, "A\x7f", true},
		{`"\u00e9"`, "é", true},
		{`"\u2028\u2029"`, "\u2028\u2029", true},
		{`"\ud83d\ude00"`, "😀", true},
		{`"\ud83d"`, "\ufffd", true},
		{`"\ude00\ud83d"`, "\ufffd\ufffd", true},
		{`"\ud83dx"`, "\ufffdx", true},
		{`"\ud83d\u0041"`, "\ufffdA", true},
		{"\"\xff\"", "\ufffd", true},
		{`"abc`, "", false},
		{`abc"`, "", false},
		{`"`, "", false},
		{`"\"`, "", false},
		{`"\x"`, "", false},
		{`"\u12"`, "", false},
		{"\"a\nb\"", "", false},
		{`"a"b"`, "", false},
		{`"` + strings.Repeat("x", 17) + `"`, "", false},
		{`"` + strings.Repeat("x", 15) + `\u00e9"`, "", false},
		{`"` + strings.Repeat("x", 13) + `\ud83d\ude00"`, "", false},
	} {
		got, ok := Unquote(make([]byte, 0, 16), []byte(tc.lit))
		if ok != tc.ok || string(got) != tc.want {
			t.Errorf("Unquote(%s) = %q %v, want %q %v", tc.lit, got, ok, tc.want, tc.ok)
		}
		checkUnquote(t, []byte(tc.lit), 16)
	}
}

// checkUnquote is Unquote's differential property: it reads lit as
// encoding/json does, or refuses it exactly when encoding/json does not
// read it as a string or it decodes to more than capacity bytes.
func checkUnquote(t *testing.T, lit []byte, capacity int) {
	t.Helper()
	got, ok := Unquote(make([]byte, 0, capacity), lit)
	var want string
	exact := len(lit) >= 2 && lit[0] == '"' && lit[len(lit)-1] == '"'
	jsonOK := exact && json.Unmarshal(lit, &want) == nil
	switch {
	case ok && !jsonOK:
		t.Fatalf("Unquote(%q) = %q, encoding/json refuses it", lit, got)
	case ok && string(got) != want:
		t.Fatalf("Unquote(%q) = %q, encoding/json reads %q", lit, got, want)
	case !ok && jsonOK && len(want) <= capacity:
		t.Fatalf("Unquote(%q) refuses what encoding/json reads as %q", lit, want)
	}
}

// FuzzUnquote: Unquote agrees with encoding/json on any literal.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`"abc"`, `"\u2028 \u2029"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\udc00\ud800"`, `"\"\\\/\b\f\n\r\t"`, "\"\u2028\xe2\x80\"", `"\u0000"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, lit []byte) {
		checkUnquote(t, lit, 64)
		checkUnquote(t, lit, 4096)
	})
}

func TestScanAllocs(t *testing.T) {
	frames := map[string][]byte{
		"EVENT":    []byte(`["EVENT",` + scanNostrTools + `]`),
		"AUTH":     []byte(`["AUTH",` + scanAuth("22242", `[["\u0072elay","wss://r.example"],["challenge","c"]]`) + `]`),
		"REQ":      []byte(`["REQ","many",` + repeatJoin(scanFilter, scanMaxFilters, ",") + `]`),
		"NEG-OPEN": []byte(`["NEG-OPEN","neg1",{"kinds":[1]},"` + negOpenMsg + `"]`),
		"hostile":  []byte(`["EVENT",` + evWith("kind", `"kind":1,"kind":7`) + `]`),
	}
	for name, frame := range frames {
		var sink Facts
		n := testing.AllocsPerRun(100, func() { sink, _ = scanShape(frame, scanBounds) })
		if n != 0 {
			t.Errorf("Scan of %s allocates %v times", name, n)
		}
		_ = sink
	}
}

func BenchmarkScan(b *testing.B) {
	content := func(n int) string {
		return evWith("content", `"content":"`+strings.Repeat(`lorem ipsum \"dolor\" sit `, n/26+1)[:n]+`"`)
	}
	for _, bm := range []struct{ name, frame string }{
		{"EVENT-1KiB", `["EVENT",` + content(1<<10) + `]`},
		{"EVENT-64KiB", `["EVENT",` + content(64<<10) + `]`},
		{"REQ-10-filters", `["REQ","many",` + repeatJoin(scanFilter, 10, ",") + `]`},
		{"NEG-OPEN", `["NEG-OPEN","neg1",{"kinds":[1]},"` + negOpenMsg + `"]`},
		{"hostile-1000-filters", `["REQ","many",` + repeatJoin(`{}`, 1000, ",") + `]`},
	} {
		frame := []byte(bm.frame)
		if _, reason := scanShape(frame, scanBounds); reason != "" && !strings.HasPrefix(bm.name, "hostile") {
			b.Fatalf("%s: %s", bm.name, reason)
		}
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(frame)))
			var f Facts
			for b.Loop() {
				f, _ = scanShape(frame, scanBounds)
			}
			_ = f
		})
	}
}

// TestScanHostileCorpus: every frame of the shared corpus
// (testdata/hostile/frames.json) is refused by Scan with the reason its
// answer carries, or is not one Scan is given (a frame Peek cannot shape
// is answered before it).
func TestScanHostileCorpus(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "hostile", "frames.json"))
	if err != nil {
		t.Fatal(err)
	}
	var frames []struct {
		Name, Frame, Want string
		FrameHex          string `json:"frame_hex"`
	}
	if err := json.Unmarshal(b, &frames); err != nil {
		t.Fatal(err)
	}
	for _, h := range frames {
		frame := []byte(h.Frame)
		if h.FrameHex != "" {
			if frame, err = hex.DecodeString(h.FrameHex); err != nil {
				t.Fatal(err)
			}
		}
		var want []any
		if err := json.Unmarshal([]byte(h.Want), &want); err != nil || len(want) < 2 {
			t.Fatalf("%s: answer %s: %v", h.Name, h.Want, err)
		}
		reason, _ := want[len(want)-1].(string)
		if _, got := Scan(frame, nil); got == "" || !strings.HasPrefix(reason, got) {
			t.Errorf("%s: Scan = %q, the corpus answers %q", h.Name, got, reason)
		}
		checkScan(t, frame)
	}
}

// scanShape is Scan without the check of an event's id, for the tests of
// the shape: their events carry made-up ids.
func scanShape(frame []byte, b *wire.Bounds) (Facts, string) { return scan(frame, b, false) }
