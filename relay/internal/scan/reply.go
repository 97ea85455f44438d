package scan

import (
	"github.com/sluice-relay/sluice/relay/wire"
	"strconv"
	"time"
	"unicode/utf8"
)

// ReasonUnavailable is the refusal reason when the limiter could not decide
// (a store outage). It is deliberately not "rate-limited:": an outage on our
// side must not tell every client to back off.
const ReasonUnavailable = "error: rate limiter unavailable"

// reasonRateLimited is the fixed part of a rate-limited reason; the wait in
// whole seconds and "s" follow.
const reasonRateLimited = "rate-limited: slow down; retry in "

// RateLimitedReason returns the reason for a message refused by a limit:
// "rate-limited: slow down; retry in 18s", the wait rounded up to whole
// seconds and never 0 (RetrySeconds), so a client that waits as
// told is admitted. It allocates; appendRateLimitedReason does not.
func RateLimitedReason(wait time.Duration) string {
	var buf [64]byte
	return string(appendRateLimitedReason(buf[:0], wait))
}

// RetrySeconds renders a wait for a client: whole seconds rounded up, never
// 0, so that a client that waits as told is not refused again.
func RetrySeconds(wait time.Duration) int64 {
	return max(int64((wait+time.Second-1)/time.Second), 1)
}

// appendRateLimitedReason appends RateLimitedReason(wait) to dst.
func appendRateLimitedReason(dst []byte, wait time.Duration) []byte {
	dst = append(dst, reasonRateLimited...)
	dst = strconv.AppendInt(dst, RetrySeconds(wait), 10)
	return append(dst, 's')
}

// AppendRefusal appends to dst the reply that refuses frame f with reason,
// as NIP-01 wants it answered:
//
//	EVENT, AUTH with an id        ["OK",<id>,false,"<reason>"]
//	REQ, COUNT with an id         ["CLOSED",<id>,"<reason>"]
//	NEG-OPEN, NEG-MSG with an id  ["NEG-ERR",<id>,"<reason>"] (NIP-77)
//	anything else                 ["NOTICE","<reason>"]
//
// f.ID is written verbatim (Peek guarantees it is a valid JSON string
// literal), so the client sees exactly the id it sent. An EVENT or AUTH whose
// id Peek could not find gets a NOTICE, since an OK must carry an id. The
// reason is JSON-escaped. AppendRefusal allocates only when dst must grow;
// the reply is a complete text frame.
func AppendRefusal(dst []byte, f Frame, reason string) []byte {
	dst = appendRefusalHead(dst, f)
	dst = appendJSONStringBody(dst, reason)
	return append(dst, `"]`...)
}

// AppendRateLimited appends the reply refusing f for a limit whose wait is
// wait: AppendRefusal(dst, f, RateLimitedReason(wait)) without allocating.
func AppendRateLimited(dst []byte, f Frame, wait time.Duration) []byte {
	dst = appendRefusalHead(dst, f)
	dst = appendRateLimitedReason(dst, wait) // plain ASCII: nothing to escape
	return append(dst, `"]`...)
}

// appendRefusalHead appends everything of the reply up to the opening quote
// of the reason.
func appendRefusalHead(dst []byte, f Frame) []byte {
	if f.ID != nil {
		switch f.Type {
		case wire.TypeEVENT, wire.TypeAUTH:
			dst = append(dst, `["OK",`...)
			dst = append(dst, f.ID...)
			return append(dst, `,false,"`...)
		case wire.TypeREQ, wire.TypeCOUNT:
			dst = append(dst, `["CLOSED",`...)
			dst = append(dst, f.ID...)
			return append(dst, `,"`...)
		case wire.TypeNEGOPEN, wire.TypeNEGMSG:
			// NIP-77's answer to a sync that failed: a client waiting
			// for NEG-MSG learns its sync is over (a NOTICE would leave
			// it waiting).
			dst = append(dst, `["NEG-ERR",`...)
			dst = append(dst, f.ID...)
			return append(dst, `,"`...)
		}
	}
	return append(dst, `["NOTICE","`...)
}

const hexDigits = "0123456789abcdef"

// appendJSONStringBody appends s JSON-escaped, without quotes, as
// encoding/json would: quotes, backslashes and control characters escaped,
// invalid UTF-8 replaced by U+FFFD, and U+2028/U+2029 escaped so the reply
// is safe for JavaScript clients that eval it.
func appendJSONStringBody(dst []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(dst, s[start:]...)
}
