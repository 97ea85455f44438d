package wire

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

// typeNames holds the wire label of every Type, indexed by Type.
var typeNames = [NumTypes]string{
	TypeOther:    "OTHER",
	TypeEVENT:    "EVENT",
	TypeREQ:      "REQ",
	TypeCLOSE:    "CLOSE",
	TypeCOUNT:    "COUNT",
	TypeAUTH:     "AUTH",
	TypeNEGOPEN:  "NEG-OPEN",
	TypeNEGMSG:   "NEG-MSG",
	TypeNEGCLOSE: "NEG-CLOSE",
}

// String returns the wire label ("EVENT", "NEG-OPEN", …; "OTHER" for the
// catch-all). A value outside the set renders as "OTHER".
func (t Type) String() string {
	if t >= NumTypes {
		return typeNames[TypeOther]
	}
	return typeNames[t]
}
