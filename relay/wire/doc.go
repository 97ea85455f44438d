// Package wire is sluice's reading of Nostr client frames, as bytes: the
// one bounded scanner every check of the gate asks, and the replies the
// gate writes. It does no I/O, allocates nothing on the per-frame path and
// imports only the standard library.
//
// # Two readings, one scanner
//
// Peek classifies a frame from a bounded prefix: its type,
// from the first JSON string decoded as a relay's JSON parser would, and
// for a refusal the id to answer with. A refused frame costs this and
// nothing more.
//
// Scan reads a frame about to be forwarded, whole, and says whether it is
// canonical: in a shape that leaves the relay behind the gate no other
// reading than the one sluice charged. Relays are different parsers:
// go-nostr (and so khatru) takes a frame's label from between its first
// two quotes and reads ["EVENT",A,B] as the event B; khatru's negentropy
// parser takes the label from byte 2 to the first comma, and its
// negentropy decoder panics on lengths it does not check; encoding/json
// folds the case of keys and keeps the last of duplicates. A canonical
// frame is one all of them read alike: the exact ["LABEL", prefix, one
// event with exactly NIP-01's fields, typed filters, subscription ids
// without escapes, negentropy payloads checked as NIP-77 messages. Scan
// returns the facts the gate charges (type, subscription id, filter count,
// event id, pubkey, kind, created_at, an AUTH's challenge and relay tags)
// or the "invalid:" reason the client is told.
//
// # Replies
//
// AppendRefusal writes NIP-01 refusals (AppendRateLimited, one for a wait,
// without allocating): OK false for EVENT and AUTH, CLOSED for REQ and
// COUNT, NOTICE for the rest, each carrying the id exactly as the client
// sent it; and NIP-77's NEG-ERR for NEG-OPEN and NEG-MSG, since a client
// that sent one waits for NEG-MSG or NEG-ERR about that sync, not a
// NOTICE. A wait is stated in whole seconds rounded up, never 0
// (RetrySeconds), so a client that waits as told is admitted.
//
// ReadRelay and ParseOK read the relay frames the gate acts on: the
// answers that end a client's subscriptions and syncs, the OK that charges
// a quota or binds an AUTH, and the relay's NIP-42 challenge.
package wire
