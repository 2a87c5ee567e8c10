package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	// Registers the "proto" codec the wire codec falls back to.
	_ "google.golang.org/grpc/encoding/proto"
)

// MalformedIsInvalid returns the server options that install the wire
// codec (WireCodec) and answer a request that is not valid protobuf, or
// that carries more elements than its handler accepts (fanout.go; bounds
// adds those of other packages' handlers), with INVALID_ARGUMENT: it is
// the caller's fault, and grpc-go answers any codec error with INTERNAL.
//
// So on the server the codec does not fail: it empties the message and
// leaves its decode error in the message itself, as unknown bytes that
// no decode can produce (see markInvalid). The interceptors, which see
// the message next (unary: the request; streams: each RecvMsg), answer
// it as INVALID_ARGUMENT. Nothing outside the message holds the error,
// so nothing has to be cleaned up.
func MalformedIsInvalid(bounds ...FanOut) []grpc.ServerOption {
	c := newWireCodec(true)
	c.bounds = bounds
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(c),
		grpc.ChainUnaryInterceptor(unaryInvalid),
		grpc.ChainStreamInterceptor(streamInvalid),
	}
}

// markInvalid empties m and records why in it: its unknown fields become
// a zero byte (the tag of field 0, which protobuf forbids, so no decoded
// message has it) followed by the text of the INVALID_ARGUMENT answer.
func markInvalid(m proto.Message, why string) {
	proto.Reset(m)
	m.ProtoReflect().SetUnknown(protoreflect.RawFields(append([]byte{0}, why...)))
}

// invalid returns the INVALID_ARGUMENT status of v if the codec marked
// it (markInvalid), else nil.
func invalid(v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return nil
	}
	u := m.ProtoReflect().GetUnknown()
	if len(u) == 0 || u[0] != 0 {
		return nil
	}
	return status.Error(codes.InvalidArgument, string(u[1:]))
}

func unaryInvalid(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := invalid(req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func streamInvalid(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &strictStream{ss})
}

type strictStream struct{ grpc.ServerStream }

func (s *strictStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return invalid(m)
}
