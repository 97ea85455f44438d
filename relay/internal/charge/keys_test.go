package charge

import "testing"

func TestKeys(t *testing.T) {
	if got, want := messageKey("203.0.113.7", "EVENT"), "{203.0.113.7}:message:EVENT"; got != want {
		t.Errorf("messageKey = %q, want %q", got, want)
	}
	if got, want := connectionKey("2001:db8::/64"), "{2001:db8::/64}:connection"; got != want {
		t.Errorf("connectionKey = %q, want %q", got, want)
	}
}
