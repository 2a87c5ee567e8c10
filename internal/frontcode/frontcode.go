// Package frontcode is the front coding of sorted keys shared by the
// coordinator's wire formats (reports and demand): each key travels as
// the length of the prefix it shares with the previous key and the rest.
//
// It is that arithmetic and the one bound both formats keep (MaxDecoded):
// it knows no wire format and keeps no state, and the formats that use it
// frame and order the keys themselves.
package frontcode

// MaxDecoded is the most bytes the keys of one message (a report chunk, a
// demand snapshot) decode to. Front coding lets each key repeat the whole
// previous key for one byte more, so a message's decoded keys can grow as
// the square of its size: senders start a new message rather than pass
// the bound, and receivers refuse a message past it before decoding any
// key. 16 MiB is sixteen times the default NATS max payload (1 MiB): a
// message under it decodes past the bound only when its keys average
// sixteen times the bytes each entry takes on the wire.
const MaxDecoded = 16 << 20

// Common is the length of the longest common prefix of a and b.
func Common(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// Decode rebuilds a key from the previous key, its shared prefix length
// and its suffix. A prefix longer than prev (a corrupt message) is cut to
// prev rather than panic.
func Decode(prev string, prefix uint32, suffix string) string {
	p := min(int(prefix), len(prev))
	return prev[:p] + suffix
}

// Size adds up what a message's keys decode to, key by key, without
// decoding them (the receiver's check of MaxDecoded).
type Size struct {
	last  int // the length of the key last added
	Total int // bytes of every key added
}

// Add counts the next key, of a prefix and a suffix of that length, and
// reports whether Total is still within MaxDecoded.
func (s *Size) Add(prefix uint32, suffix int) bool {
	s.last = min(int(prefix), s.last) + suffix // as Decode cuts the prefix
	s.Total += s.last
	return s.Total <= MaxDecoded
}
