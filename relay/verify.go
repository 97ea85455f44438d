package relay

import (
	"bytes"
	"encoding/hex"

	"github.com/btcsuite/btcd/btcec/v2/schnorr"

	"github.com/sluice-relay/sluice/relay/internal/scan"
)

// reasonSig refuses an EVENT whose signature the gate verified and found
// invalid (khatru's words for the same).
const reasonSig = "invalid: signature is invalid"

// validSig reports whether ev, a canonical EVENT (scan.Scan: its id is its
// hash), carries its author's valid BIP-340 signature of its id. The
// quota charges an event's author on the relay's OK, and a relay that does
// not verify signatures would otherwise have anyone's forged events
// charged to their names (see Options.UpstreamVerifies).
func validSig(ev *scan.Event) bool {
	var sig [64]byte
	lit := sigLit(ev.Raw)
	if _, err := hex.Decode(sig[:], lit); err != nil || len(lit) != 128 {
		return false
	}
	pk, err := schnorr.ParsePubKey(ev.Pubkey[:])
	if err != nil {
		return false
	}
	s, err := schnorr.ParseSignature(sig[:])
	if err != nil {
		return false
	}
	return s.Verify(ev.ID[:], pk)
}

// sigLit returns the hex digits of the "sig" of raw, a canonical event
// object: the key "sig" followed by a colon appears once and nowhere else,
// since a quote inside a string is escaped and a string followed by a
// colon is a key.
func sigLit(raw []byte) []byte {
	for i := 0; ; {
		j := bytes.Index(raw[i:], []byte(`"sig"`))
		if j < 0 {
			return nil
		}
		k := i + j + len(`"sig"`)
		for k < len(raw) && isSpace(raw[k]) {
			k++
		}
		if k < len(raw) && raw[k] == ':' {
			k++
			for k < len(raw) && isSpace(raw[k]) {
				k++
			}
			if k+130 <= len(raw) && raw[k] == '"' {
				return raw[k+1 : k+129]
			}
			return nil
		}
		i = k
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
