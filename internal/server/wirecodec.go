package server

import (
	"errors"
	"slices"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// wireCodec is the gRPC codec of the node's messages (package
// ratelimitv1): vtprotobuf's generated marshalling instead of
// protobuf-go's reflection, the same bytes on the wire (TestWireCodec
// round-trips every message through both). Other messages (health,
// reflection, Envoy's) go to the default "proto" codec.
//
// Decoding copies the call's bytes into one array the message's strings
// then point into, instead of one allocation per string, and a batch's
// messages are allocated in one array each instead of one per check:
// BenchmarkGRPCBatch100 spent a sixth of its time and most of its
// allocations decoding.
type wireCodec struct {
	fallback encoding.CodecV2
	// strict: a message that does not decode is marked (markInvalid)
	// instead of failing, for the server's interceptors to answer.
	strict bool
	// The schemas of plain, by message.
	request, response, status, batchRequest, batchResponse *wireSchema
	// bounds are other messages' FanOuts (strict only).
	bounds []FanOut
}

// WireCodec returns the codec (named "proto", as the default it replaces
// for the node's messages). Clients may use it too
// (grpc.WithDefaultCallOptions(grpc.ForceCodecV2(...))); it changes
// nothing on the wire.
func WireCodec() encoding.CodecV2 { return newWireCodec(false) }

func newWireCodec(strict bool) *wireCodec {
	seen := map[protoreflect.FullName]*wireSchema{}
	schema := func(m proto.Message) *wireSchema { return newWireSchema(m.ProtoReflect().Descriptor(), seen) }
	return &wireCodec{
		strict:        strict,
		fallback:      encoding.GetCodecV2("proto"),
		request:       schema(&ratelimitv1.RateLimitRequest{}),
		response:      schema(&ratelimitv1.RateLimitResponse{}),
		status:        schema(&ratelimitv1.LimitStatus{}),
		batchRequest:  schema(&ratelimitv1.BatchRateLimitRequest{}),
		batchResponse: schema(&ratelimitv1.BatchRateLimitResponse{}),
	}
}

func (c *wireCodec) Name() string { return c.fallback.Name() }

// vtMessage is what vtprotobuf generates for marshalling.
type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVT([]byte) (int, error)
}

func (c *wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	var m vtMessage
	switch x := v.(type) {
	case *encoded:
		return x.wire(), nil
	case *ratelimitv1.RateLimitRequest:
		m = x
	case *ratelimitv1.RateLimitResponse:
		m = x
	case *ratelimitv1.BatchRateLimitRequest:
		m = x
	case *ratelimitv1.BatchRateLimitResponse:
		m = x
	case *ratelimitv1.LimitStatus:
		m = x
	default:
		return c.fallback.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		w := &smallWire{}
		if size <= len(w.room) {
			w.sb = w.room[:size:size]
		} else {
			w.sb = make([]byte, size)
		}
		if _, err := m.MarshalToSizedBufferVT(w.sb); err != nil {
			return nil, err
		}
		return w.wire(), nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVT(*buf); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// smallWire is a small message's encoding and the BufferSlice that
// carries it, in one allocation where there were three (the bytes, the
// boxed SliceBuffer and the slice's array): a check's request fits in
// room.
type smallWire struct {
	encoded
	room [wireRoom]byte
}

func (c *wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.unmarshal(data, v)
	if err != nil && c.strict {
		if m, ok := v.(proto.Message); ok {
			// Nothing half-decoded reaches a handler.
			if tooMany := (*fanOutError)(nil); errors.As(err, &tooMany) {
				markInvalid(m, err.Error())
			} else {
				markInvalid(m, "the message is not valid protobuf: "+err.Error())
			}
			return nil
		}
	}
	return err
}

func (c *wireCodec) unmarshal(data mem.BufferSlice, v any) error {
	var sc *wireSchema
	switch x := v.(type) {
	case *ratelimitv1.RateLimitRequest:
		sc = c.request
	case *ratelimitv1.RateLimitResponse:
		sc = c.response
	case *ratelimitv1.LimitStatus:
		sc = c.status
	case *ratelimitv1.BatchRateLimitRequest:
		sc = c.batchRequest
	case *ratelimitv1.BatchRateLimitResponse:
		sc = c.batchResponse
	case *rlsv3.RateLimitRequest:
		if c.strict {
			return checked(data, x, envoyFanOut)
		}
		return c.fallback.Unmarshal(data, v)
	case proto.Message:
		name := x.ProtoReflect().Descriptor().FullName()
		if i := slices.IndexFunc(c.bounds, func(f FanOut) bool { return f.Message == name }); i >= 0 {
			return checked(data, x, c.bounds[i].check)
		}
		return c.fallback.Unmarshal(data, v)
	default:
		return c.fallback.Unmarshal(data, v)
	}
	// A fresh array, never reused: the decoded strings point into it
	// (UnmarshalVTUnsafe) and live as long as anything holds them.
	buf := data.Materialize()
	// vtprotobuf and protobuf-go differ at the edges: vtprotobuf accepts
	// field numbers above 2^29-1 and refuses a known field sent with
	// another wire type (protobuf-go keeps it as unknown), and it keeps
	// an unknown field's tag bytes as sent where protobuf-go re-encodes
	// them. A message made only of known fields with their wire types,
	// well formed by protobuf-go's rules, decodes the same through both;
	// anything else (malformed, or with unknown fields: a newer peer's)
	// is decoded by protobuf-go, with its own errors. What is accepted,
	// and how it decodes, is exactly as before
	// (TestWireCodecAgreesOnMalformed).
	var n wireCounts
	plain := sc.plain(buf, 0, &n)
	if _, ok := v.(*ratelimitv1.BatchRateLimitRequest); ok && c.strict {
		checks := n[0][1] // counted on the way, if plain
		if !plain {
			checks = count(buf, 1, nil)
		}
		if err := batchFanOut(checks); err != nil {
			return err
		}
	}
	if !plain || unmarshalVT(buf, v, &n) != nil {
		m := v.(proto.Message)
		proto.Reset(m)
		return proto.Unmarshal(buf, m)
	}
	return nil
}

// checked decodes m with protobuf-go (as the proto codec does) once
// check has passed its bytes.
func checked(data mem.BufferSlice, m proto.Message, check func([]byte) error) error {
	// Pooled, as the proto codec's: protobuf-go copies what it keeps.
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if err := check(buf.ReadOnlyData()); err != nil {
		return err
	}
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// wireSchema is what plain checks of one message: the wire type of each
// field number, and the schema of message fields. It is built from the
// message's descriptor, so it follows the .proto file.
type wireSchema struct {
	fields []wireField // by field number
}

type wireField struct {
	known bool
	typ   protowire.Type
	sub   *wireSchema // message fields
}

// newWireSchema builds the schema of md. A field whose wire type is not
// one fixed type (packed repeated scalars, groups, maps) is left unknown:
// messages that use it take protobuf-go.
func newWireSchema(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*wireSchema) *wireSchema {
	if sc, ok := seen[md.FullName()]; ok {
		return sc
	}
	sc := &wireSchema{}
	seen[md.FullName()] = sc
	fds := md.Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		if fd.IsMap() || fd.IsList() && fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.BytesKind {
			continue
		}
		f := wireField{known: true}
		switch fd.Kind() {
		case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Int64Kind,
			protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Sint32Kind, protoreflect.Sint64Kind:
			f.typ = protowire.VarintType
		case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
			f.typ = protowire.Fixed32Type
		case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
			f.typ = protowire.Fixed64Type
		case protoreflect.StringKind, protoreflect.BytesKind:
			f.typ = protowire.BytesType
		case protoreflect.MessageKind:
			f.typ = protowire.BytesType
			f.sub = newWireSchema(fd.Message(), seen)
		default:
			continue
		}
		n := int(fd.Number())
		if n >= len(sc.fields) {
			sc.fields = append(sc.fields, make([]wireField, n+1-len(sc.fields))...)
		}
		sc.fields[n] = f
	}
	return sc
}

// wireCounts is what plain counts on its way: the message fields of a
// message (index 0) and of its direct sub-messages (index 1), by field
// number below 16. A batch's arrays are sized by them, so the batch is
// not read again to count.
type wireCounts [2][16]int

// plain reports whether b is well formed by protobuf-go's rules
// (protowire's, and field numbers within range) and holds only known
// fields of sc with their wire types, nested messages included. It adds
// the message fields it reads at depth (0 for the message itself) to n.
func (sc *wireSchema) plain(b []byte, depth int, n *wireCounts) bool {
	for len(b) > 0 {
		// A byte below 0x80 is a whole varint: the tags of fields 1-15,
		// short lengths and small values, most of a node's messages, read
		// without protowire's general decoding. Field number 0 is never
		// known, so the fast tag is refused where ConsumeTag refuses it.
		num, typ, k := protowire.Number(b[0]>>3), protowire.Type(b[0]&7), 1
		if b[0] >= 0x80 {
			num, typ, k = protowire.ConsumeTag(b)
		}
		if k < 0 || int(num) >= len(sc.fields) || !sc.fields[num].known || sc.fields[num].typ != typ {
			return false
		}
		b = b[k:]
		f := &sc.fields[num]
		if typ == protowire.BytesType {
			var v []byte
			if len(b) > 0 && b[0] < 0x80 && int(b[0]) < len(b) {
				v, k = b[1:1+b[0]], 1+int(b[0])
			} else {
				v, k = protowire.ConsumeBytes(b)
			}
			if k < 0 {
				return false
			}
			if f.sub != nil {
				if depth < len(n) && int(num) < len(n[depth]) {
					n[depth][num]++
				}
				if !f.sub.plain(v, depth+1, n) {
					return false
				}
			}
			b = b[k:]
			continue
		}
		if typ == protowire.VarintType && len(b) > 0 && b[0] < 0x80 {
			k = 1
		} else if k = protowire.ConsumeFieldValue(num, typ, b); k < 0 {
			return false
		}
		b = b[k:]
	}
	return true
}

// unmarshalVT decodes buf into v, one of the node's messages, which plain
// found plain and counted in n.
func unmarshalVT(buf []byte, v any, n *wireCounts) error {
	switch m := v.(type) {
	case *ratelimitv1.BatchRateLimitRequest:
		if len(m.Requests) == 0 {
			m.Requests = requestRoom(m.Requests, n[0][1])
		}
		return m.UnmarshalVTUnsafe(buf)
	case *ratelimitv1.BatchRateLimitResponse:
		return unmarshalBatchResponse(buf, m, n[0][1], n[1][8], n[1][9])
	case *ratelimitv1.RateLimitRequest:
		return m.UnmarshalVTUnsafe(buf)
	case *ratelimitv1.RateLimitResponse:
		return m.UnmarshalVTUnsafe(buf)
	case *ratelimitv1.LimitStatus:
		return m.UnmarshalVTUnsafe(buf)
	}
	panic("unreachable")
}

// requestRoom returns room for n checks, empty, for the generated code to
// fill (the pool option: it decodes into the elements a slice holds past
// its length instead of allocating each check): rs's own if it has the
// room (a reused message's, GRPC.Register), else one new array.
func requestRoom(rs []*ratelimitv1.RateLimitRequest, n int) []*ratelimitv1.RateLimitRequest {
	if cap(rs) >= n {
		// Emptied: the decoder merges into what it finds. By assignment:
		// Reset also stores the message's type info (5x the time of
		// zeroing it), which the message finds itself when it needs it.
		for _, r := range rs[:n] {
			if r != nil {
				*r = ratelimitv1.RateLimitRequest{}
			}
		}
		return rs[:0]
	}
	elems := make([]ratelimitv1.RateLimitRequest, n)
	ptrs := make([]*ratelimitv1.RateLimitRequest, n)
	for i := range ptrs {
		ptrs[i] = &elems[i]
	}
	return ptrs[:0]
}

// unmarshalBatchResponse decodes a batch answer of n responses, with nst
// statuses and nsh shadow violations in all, with its responses and their
// statuses in one array each.
func unmarshalBatchResponse(buf []byte, m *ratelimitv1.BatchRateLimitResponse, n, nst, nsh int) error {
	if len(m.Responses) != 0 {
		return m.UnmarshalVTUnsafe(buf)
	}
	elems := make([]ratelimitv1.RateLimitResponse, n)
	m.Responses = make([]*ratelimitv1.RateLimitResponse, n)
	sts := make([]ratelimitv1.LimitStatus, nst+nsh)
	ptrs := make([]*ratelimitv1.LimitStatus, nst+nsh)
	for i := range ptrs {
		ptrs[i] = &sts[i]
	}
	st, sh := ptrs[:nst], ptrs[nst:]
	i := 0
	for b := buf; len(b) > 0; i++ {
		_, _, k := protowire.ConsumeTag(b)
		b = b[k:]
		v, k := protowire.ConsumeBytes(b)
		b = b[k:]
		r := &elems[i]
		// Each response's statuses fill the next pointers (the pool
		// option's generated code appends into spare room), capped
		// after, so an append by the caller cannot reach a neighbour's.
		r.Statuses, r.ShadowViolations = st[:0], sh[:0]
		if err := r.UnmarshalVTUnsafe(v); err != nil {
			return err
		}
		a, z := len(r.Statuses), len(r.ShadowViolations)
		if a == 0 {
			r.Statuses = nil
		} else {
			r.Statuses = r.Statuses[:a:a]
		}
		if z == 0 {
			r.ShadowViolations = nil
		} else {
			r.ShadowViolations = r.ShadowViolations[:z:z]
		}
		st, sh = st[min(a, len(st)):], sh[min(z, len(sh)):]
		m.Responses[i] = r
	}
	return nil
}
