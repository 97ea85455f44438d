package relay

import (
	"net/http"
	"time"

	"github.com/sluice-relay/sluice/relay/wire"
)

// The wire codec lives in package relay/wire (the one scanner of client
// frames, and the replies); these names keep the gate's API whole.

// Type is the kind of a client message (wire.Type).
type Type = wire.Type

// Frame is what the gate learns of a client frame without parsing it
// (wire.Frame).
type Frame = wire.Frame

// The message types (see wire.Type).
const (
	TypeOther    = wire.TypeOther
	TypeEVENT    = wire.TypeEVENT
	TypeREQ      = wire.TypeREQ
	TypeCLOSE    = wire.TypeCLOSE
	TypeCOUNT    = wire.TypeCOUNT
	TypeAUTH     = wire.TypeAUTH
	TypeNEGOPEN  = wire.TypeNEGOPEN
	TypeNEGMSG   = wire.TypeNEGMSG
	TypeNEGCLOSE = wire.TypeNEGCLOSE
	NumTypes     = wire.NumTypes
)

// ReasonUnavailable is the refusal reason when the limiter could not
// decide (wire.ReasonUnavailable).
const ReasonUnavailable = wire.ReasonUnavailable

// IsUpgrade reports whether r asks for a WebSocket (wire.IsUpgrade): a GET
// with Connection: upgrade and Upgrade: websocket. Wrap and Proxy gate
// exactly these; every other request is plain HTTP (Options.PlainMethods).
func IsUpgrade(r *http.Request) bool { return wire.IsUpgrade(r) }

// ParseType maps a config or wire label onto a Type (wire.ParseType).
func ParseType(s string) (Type, bool) { return wire.ParseType(s) }

// Peek classifies a client frame (wire.Peek).
func Peek(frame []byte) Frame { return wire.Peek(frame) }

// RateLimitedReason returns the reason for a message refused by a limit
// (wire.RateLimitedReason).
func RateLimitedReason(wait time.Duration) string { return wire.RateLimitedReason(wait) }

// AppendRefusal appends the reply refusing f with reason (wire.AppendRefusal).
func AppendRefusal(dst []byte, f Frame, reason string) []byte {
	return wire.AppendRefusal(dst, f, reason)
}
