package scan

// negentropyVersion is the protocol version byte of NIP-77's negentropy
// messages (version 1).
const negentropyVersion = 0x61

// The modes of a negentropy range.
const (
	negSkip        = 0
	negFingerprint = 1
	negIDList      = 2
)

// maxVarintBytes is the longest varint checkNegentropy accepts: 9 bytes
// hold 63 bits, so the value fits a non-negative int64 however a decoder
// shifts it in.
const maxVarintBytes = 9

// negMaxFinite is the largest finite bound timestamp checkNegentropy
// accepts. go-nostr's server writes a bound it read back as a delta from
// the last one it wrote, plus one, and its varint encoder (EncodeVarInt)
// has room for 8 bytes, 56 bits: a delta of 2^56-1 or more, or a negative
// one, runs off the start of its buffer. Bounds no later than this, never
// decreasing, keep every delta it writes below that.
const negMaxFinite = 1<<56 - 2

// checkNegentropy reports whether msg, the hex payload of a NEG-OPEN or
// NEG-MSG, is a complete, well-formed negentropy message: lowercase hex of
// even length whose bytes are the version byte (negentropyVersion)
// followed by ranges, each a bound (a timestamp varint, an id-prefix
// length varint of at most 32 and that many bytes) and a mode varint:
// skip, a fingerprint (16 bytes), or an id list (a count varint and that
// many 32-byte ids). Every varint is at most maxVarintBytes long, and
// every length and count fits in what is left of the message, so a reader
// that trusts them cannot be sent past its end. The bound timestamps
// (deltas, each the varint minus one; 0 is the infinite bound) must add up
// to at most negMaxFinite (2^56-2), and the infinite bound, which ends the
// whole range, may only be the last: so the timestamps a reader sums never
// wrap around, never decrease, and fit the varints it writes back.
//
// go-nostr's reader (nip77/negentropy, which khatru runs) does not check
// them: a varint longer than 9 bytes overflows its int and a negative or
// huge length slices out of range ("6100ffffffffffffffffff7f": a length
// of -1), and a bound it writes back as a delta of 2^56-1 or more, or a
// negative one (timestamps that wrap past the infinite bound), runs its
// varint encoder off the start of its buffer ("6100000002000001000200":
// an infinite bound, then one more; "61818080808080808000000200": a
// bound at 2^56-1). Each is a panic in a goroutine nothing recovers,
// which ends the whole relay process. checkNegentropy walks the hex in
// place and allocates nothing.
func checkNegentropy(msg []byte) bool {
	if len(msg) < 2 || len(msg)%2 != 0 || !isLowerHex(msg) {
		return false
	}
	r := negReader{h: msg}
	if v, ok := r.byte(); !ok || v != negentropyVersion {
		return false
	}
	var ts uint64 // the finite bound timestamps so far, summed
	infinite := false
	for r.left() > 0 {
		d, ok := r.varint() // the bound's timestamp, as a delta plus one
		switch {
		case !ok || infinite:
			return false
		case d == 0:
			infinite = true
		case d-1 > negMaxFinite-ts:
			return false
		default:
			ts += d - 1
		}
		n, ok := r.varint()
		if !ok || n > 32 || !r.skip(n) { // the bound's id prefix
			return false
		}
		mode, ok := r.varint()
		if !ok {
			return false
		}
		switch mode {
		case negSkip:
		case negFingerprint:
			if !r.skip(16) {
				return false
			}
		case negIDList:
			count, ok := r.varint()
			if !ok || count > uint64(r.left()/32) || !r.skip(count*32) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// negReader reads bytes from lowercase hex already checked to be even.
type negReader struct {
	h []byte
	i int // index into h, always even
}

func (r *negReader) left() int { return (len(r.h) - r.i) / 2 }

func (r *negReader) byte() (byte, bool) {
	if r.i+2 > len(r.h) {
		return 0, false
	}
	hi, _ := hexNibble(r.h[r.i])
	lo, _ := hexNibble(r.h[r.i+1])
	r.i += 2
	return hi<<4 | lo, true
}

func (r *negReader) skip(n uint64) bool {
	if n > uint64(r.left()) {
		return false
	}
	r.i += int(n) * 2
	return true
}

// varint reads a negentropy varint: 7 bits a byte, most significant
// first, the high bit set on every byte but the last.
func (r *negReader) varint() (uint64, bool) {
	var v uint64
	for range maxVarintBytes {
		b, ok := r.byte()
		if !ok {
			return 0, false
		}
		v = v<<7 | uint64(b&0x7f)
		if b&0x80 == 0 {
			return v, true
		}
	}
	return 0, false
}
