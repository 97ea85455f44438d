package scan

import "testing"

const (
	idHex = "4376c65d2f232afbe9b882a35baa4f6fe8667c4e684749af565f981833ed6a65"
)

// TestParseOK: the relay's OK is read with its id, verdict and
// "duplicate:" prefix; anything else is not an OK.
func TestParseOK(t *testing.T) {
	id, _ := DecodeHex32(idHex)
	for _, tc := range []struct {
		frame                     string
		accepted, duplicate, isOK bool
	}{
		{`["OK","` + idHex + `",true,""]`, true, false, true},
		{`["OK","` + idHex + `",true]`, true, false, true},
		{`["OK","` + idHex + `",false,"blocked: no"]`, false, false, true},
		{` [ "OK" , "` + idHex + `" , true , "duplicate: have it" ] `, true, true, true},
		{`["OK","` + idHex + `",true,"duplicates are fine"]`, true, false, true},
		{`["OK","` + idHex + `",tru`, false, false, false},
		{`["NOTICE","` + idHex + `",true]`, false, false, false},
		{`["OK","` + idHex[:62] + `",true,""]`, false, false, false},
		{`["EVENT","sub",{}]`, false, false, false},
	} {
		gid, accepted, duplicate, isOK := ParseOK([]byte(tc.frame))
		if accepted != tc.accepted || duplicate != tc.duplicate || isOK != tc.isOK || (isOK && gid != id) {
			t.Errorf("ParseOK(%s) = %x %v %v %v, want %v %v %v", tc.frame, gid, accepted, duplicate, isOK, tc.accepted, tc.duplicate, tc.isOK)
		}
	}
}

// TestReadRelay: each label the gate acts on is read, spaced or not, with
// the string after it; NEG-ERROR reads as NEG-ERR; a label spelled any
// other way, or not followed by a comma, is no label; an arg that is not a
// whole string (or an AUTH that goes on after it) is nil.
func TestReadRelay(t *testing.T) {
	for _, tc := range []struct{ frame, label, arg string }{
		{`["EVENT","s",{}]`, "EVENT", `"s"`},
		{` [ "EVENT" , "s",{}]`, "EVENT", `"s"`},
		{`["EVENT",`, "EVENT", ""},
		{`["EVENT"`, "", ""},
		{`["EVENTS","s",{}]`, "", ""},
		{`["\u0045VENT","s",{}]`, "", ""},
		{`{"EVENT":1}`, "", ""},
		{``, "", ""},
		{`["OK","` + idHex + `",true,""]`, "OK", `"` + idHex + `"`},
		{`["EOSE","a"]`, "EOSE", `"a"`},
		{` [ "EOSE" , "a\"b" ] `, "EOSE", `"a\"b"`},
		{`["EOSE"]`, "", ""},
		{`["EOSE",1]`, "EOSE", ""},
		{`["EOSEX","a"]`, "", ""},
		{`["CLOSED","a",""]`, "CLOSED", `"a"`},
		{`["COUNT","c",{"count":1}]`, "COUNT", `"c"`},
		{`["NEG-MSG","s","61"]`, "NEG-MSG", `"s"`},
		{`["NEG-ERR","s","blocked: x"]`, "NEG-ERR", `"s"`},
		{` [ "NEG-ERROR" , "s\"t" , "closed" ] `, "NEG-ERR", `"s\"t"`},
		{`["NEG-ERRS","s","x"]`, "", ""},
		{`["NEG-ERR",1,"x"]`, "NEG-ERR", ""},
		{`["NOTICE","x"]`, "", ""},
		{`["AUTH","abc"]`, "AUTH", `"abc"`},
		{` [ "AUTH" , "a\"b" ] `, "AUTH", `"a\"b"`},
		{`["AUTH",{"id":"x"}]`, "AUTH", ""},
		{`["AUTH","abc",1]`, "AUTH", ""},
		{`["AUTH","abc"`, "AUTH", ""},
	} {
		label, arg := ReadRelay([]byte(tc.frame))
		if label != tc.label || string(arg) != tc.arg || (arg == nil) != (tc.arg == "") {
			t.Errorf("ReadRelay(%s) = %q %q, want %q %q", tc.frame, label, arg, tc.label, tc.arg)
		}
	}
}
