package wire

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

func TestParseAuthChallenge(t *testing.T) {
	for _, tc := range []struct{ frame, want string }{
		{`["AUTH","abc"]`, `"abc"`},
		{` [ "AUTH" , "a\"b" ] `, `"a\"b"`},
		{`["AUTH",{"id":"x"}]`, ""},
		{`["AUTH","abc",1]`, ""},
		{`["AUTH","abc"`, ""},
		{`["OK","abc"]`, ""},
	} {
		got, ok := ParseAuthChallenge([]byte(tc.frame))
		if string(got) != tc.want || ok != (tc.want != "") {
			t.Errorf("ParseAuthChallenge(%s) = %s %v, want %s", tc.frame, got, ok, tc.want)
		}
	}
}

// TestIsEvent: a relay's EVENT, spaced or not, is told apart; nothing
// else is taken for one.
func TestIsEvent(t *testing.T) {
	for frame, want := range map[string]bool{
		`["EVENT","s",{}]`:      true,
		` [ "EVENT" , "s",{}]`:  true,
		`["EOSE","s"]`:          false,
		`["EVENTS","s",{}]`:     false,
		`["\u0045VENT","s",{}]`: false,
		`{"EVENT":1}`:           false,
		``:                      false,
	} {
		if got := IsEvent([]byte(frame)); got != want {
			t.Errorf("IsEvent(%s) = %v, want %v", frame, got, want)
		}
	}
}
