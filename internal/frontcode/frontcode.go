// Package frontcode is the front coding of sorted keys shared by the
// coordinator's wire formats (reports and demand): each key travels as
// the length of the prefix it shares with the previous key and the rest.
//
// It is that arithmetic alone: it knows no wire format and keeps no
// state, and the formats that use it frame, order and bound the keys
// themselves.
package frontcode

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
