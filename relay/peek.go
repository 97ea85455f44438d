package relay

// Type is the kind of a client message, from a fixed set: a client can never
// mint a new one by inventing labels.
type Type uint8

// The message types. TypeOther is the catch-all bucket for every label that is
// not one of the others, and for frames that cannot be classified.
const (
	TypeOther Type = iota
	TypeEVENT
	TypeREQ
	TypeCLOSE
	TypeCOUNT
	TypeAUTH
	TypeNEGOPEN
	TypeNEGMSG
	TypeNEGCLOSE
	NumTypes // the number of types, for arrays indexed by Type
)

// String returns the wire label ("EVENT", "NEG-OPEN", …; "OTHER" for the catch-all).
func (t Type) String() string { panic("unimplemented") }

// ParseType maps a config or wire label onto a Type; ok is false for an unknown label.
func ParseType(s string) (t Type, ok bool) { panic("unimplemented") }

// Frame is what the gate learns of a client frame without parsing it.
type Frame struct {
	Type Type
	// ID is the raw JSON string literal, quotes and escapes included, of the
	// subscription id (REQ, COUNT, CLOSE) or the event id (EVENT, AUTH), as a
	// sub-slice of the frame; nil when there is none. A reply writes it
	// verbatim, so the client sees exactly the id it sent.
	ID []byte
}

// Peek classifies a text frame. It never allocates and never panics.
func Peek(frame []byte) Frame { panic("unimplemented") }
