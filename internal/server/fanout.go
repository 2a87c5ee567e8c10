package server

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Decoding makes a message of every element of a repeated message field:
// a check of a batch is 2 bytes on the wire at the least and about 150
// decoded, so a call of MaxMessageBytes could hold a million and cost a
// quarter of a gigabyte before a handler counted them. The server's codec
// counts the elements first, on the wire, and refuses a message with more
// than its handler accepts (the same INVALID_ARGUMENT the handler gives),
// so decoding costs at most what an accepted message does.

// FanOut bounds the elements of a repeated message field of a message the
// server's codec decodes for another package's handler (the node's RLQS
// reports), counted on the wire first as the server's own are.
type FanOut struct {
	Message protoreflect.FullName // the message
	Field   protowire.Number      // its repeated message field
	Name    string                // the field's name, for the error
	Max     int                   // the most elements its handler takes
}

func (f FanOut) check(b []byte) error {
	if n := count(b, f.Field, nil); n > f.Max {
		return &fanOutError{fmt.Sprintf("%s: %d in one message; at most %d", f.Name, n, f.Max)}
	}
	return nil
}

// maxEntries bounds a descriptor's entries: each sets a request field at
// most once (Envoy.request refuses a second), and a request has six
// (policy's Field values; TestMaxEntriesCoversEveryEnvoyKey).
const maxEntries = 6

// fanOutError is a message refused for its count of elements.
type fanOutError struct{ msg string }

func (e *fanOutError) Error() string { return e.msg }

// batchFanOut refuses a BatchRateLimitRequest of n checks if they are
// more than MaxBatch, as appendBatch does.
func batchFanOut(n int) error {
	if n > MaxBatch {
		return &fanOutError{fmt.Sprintf("requests: %d checks exceed the maximum of %d per call", n, MaxBatch)}
	}
	return nil
}

// envoyFanOut refuses an Envoy RateLimitRequest of more than MaxBatch
// descriptors (field 2), as ShouldRateLimit does, or with a descriptor of
// more than maxEntries entries (its field 1).
func envoyFanOut(b []byte) error {
	entries := 0
	n := count(b, 2, func(d []byte) {
		entries = max(entries, count(d, 1, nil))
	})
	switch {
	case n > MaxBatch:
		return &fanOutError{fmt.Sprintf("descriptors: %d, want 1 to %d", n, MaxBatch)}
	case entries > maxEntries:
		return &fanOutError{fmt.Sprintf("descriptors: a descriptor of %d entries; at most %d (one per request field)", entries, maxEntries)}
	}
	return nil
}

// count is how many times field num appears at the top level of message
// b, calling each (if set) with the value of each that is length-delimited.
// It stops at the first malformed field: what it counted so far stands,
// and the decoder refuses the rest.
func count(b []byte, num protowire.Number, each func([]byte)) int {
	n := 0
	for len(b) > 0 {
		fn, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			break
		}
		b = b[k:]
		if fn == num {
			n++
			if typ == protowire.BytesType && each != nil {
				v, k := protowire.ConsumeBytes(b)
				if k < 0 {
					break
				}
				each(v)
			}
		}
		if k = protowire.ConsumeFieldValue(fn, typ, b); k < 0 {
			break
		}
		b = b[k:]
	}
	return n
}
