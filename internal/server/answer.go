package server

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/allot-dev/allot/internal/decide"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// The one mapping of a decision to its answer, RateLimitResponse: the
// gRPC face writes it straight into wire bytes (appendResponse) with no
// message in between; the HTTP and Envoy faces, which render the answer
// otherwise, decode those bytes (response). The bytes are those
// vtprotobuf and protobuf-go marshal (fields in number order, zero
// values left out): TestAppendResponseIsMarshal.

// appendResponse appends d's RateLimitResponse to b.
func appendResponse(b []byte, d *decide.Decision) []byte {
	b = appendVarint(b, 1, uint64(d.Outcome))
	b = appendVarint(b, 2, uint64(d.Limit))
	b = appendVarint(b, 3, uint64(d.Remaining))
	b = appendVarint(b, 4, uint64(decide.Seconds(d.ResetAfter)))
	b = appendString(b, 5, d.Reason)
	b = appendVarint(b, 6, uint64(ceilMillis(d.RetryAfter)))
	b = appendString(b, 7, d.PolicyID)
	for i := range d.Statuses {
		b = appendStatus(b, 8, &d.Statuses[i])
	}
	for i := range d.Shadow {
		b = appendStatus(b, 9, &d.Shadow[i])
	}
	return appendBool(b, 10, d.Degraded)
}

// appendStatus appends st as field num, a LimitStatus.
func appendStatus(b []byte, num protowire.Number, st *decide.Status) []byte {
	b, at := openMessage(b, num)
	b = appendString(b, 1, st.PolicyID)
	b = appendString(b, 2, st.LimitName)
	b = appendVarint(b, 3, uint64(st.Limit))
	b = appendVarint(b, 4, uint64(st.Remaining))
	b = appendVarint(b, 5, uint64(decide.Seconds(max(st.ResetAfter, st.RetryAfter))))
	b = appendVarint(b, 6, uint64(decide.Seconds(st.Window)))
	b = appendBool(b, 7, st.Violated)
	b = appendBool(b, 8, st.Exact)
	b = appendVarint(b, 9, uint64(st.Quota))
	return closeMessage(b, at)
}

// openMessage appends the tag of message field num and one byte for its
// length, and returns where that byte is, for closeMessage.
func openMessage(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return append(b, 0), len(b)
}

// closeMessage writes the length of the message that follows at, moving
// it along when its length takes more than the one byte left for it.
func closeMessage(b []byte, at int) []byte {
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	k := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, k-1)...)
	copy(b[at+k:], b[at+1:at+1+n])
	protowire.AppendVarint(b[at:at], uint64(n))
	return b
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), 1)
}

// response is d's answer as a message, for the faces that render it
// other than as protobuf: its bytes decoded, in one allocation when it
// has at most one status (the common answer).
func response(d *decide.Decision) *ratelimitv1.RateLimitResponse {
	a := new(decodedAnswer)
	a.ptr[0] = &a.st
	// The decoder fills the spare room of Statuses (vtprotobuf's pool
	// option) before it allocates.
	a.resp.Statuses = a.ptr[:0]
	// The bytes are well formed: they were just encoded.
	_ = a.resp.UnmarshalVTUnsafe(appendResponse(a.room[:0], d))
	if len(a.resp.Statuses) == 0 {
		a.resp.Statuses = nil
	}
	return &a.resp
}

// decodedAnswer is a decoded answer with room for one status and for its
// bytes, which its strings point into.
type decodedAnswer struct {
	resp ratelimitv1.RateLimitResponse
	st   ratelimitv1.LimitStatus
	ptr  [1]*ratelimitv1.LimitStatus
	room [wireRoom]byte
}

// wireRoom is room for a check's message in wire form, request or answer
// with one status, unless its strings are long: the encodings that live
// inside another allocation (smallWire, wireAnswer, decodedAnswer) have
// that much.
const wireRoom = 160

// encoded is an answer already in wire form, as the hot method handlers
// return it: the wire codec sends its bytes as they are (Marshal), with
// no message marshalled in between.
type encoded struct {
	sb    mem.SliceBuffer // the bytes, when they are not a pool's
	slice [1]mem.Buffer   // what Marshal returns: &sb, or a pool's buffer
}

// wire is e's bytes for the transport, which frees them once sent.
func (e *encoded) wire() mem.BufferSlice {
	if e.slice[0] == nil {
		e.slice[0] = &e.sb // a pointer: boxing the slice would allocate
	}
	return e.slice[:]
}
