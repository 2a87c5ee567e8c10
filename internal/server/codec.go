package server

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	// Registers the "proto" codec this one wraps.
	_ "google.golang.org/grpc/encoding/proto"
)

// MalformedIsInvalid returns the server options that answer a request
// that is not valid protobuf with INVALID_ARGUMENT: it is the caller's
// fault, and grpc-go answers any codec error with INTERNAL.
//
// grpc-go wraps whatever the codec returns in an INTERNAL status, so the
// codec does not fail: it records the error against the message it was
// decoding, and the interceptors, which see that message next (unary: the
// request; streams: each RecvMsg), answer it as INVALID_ARGUMENT. The
// record is removed there, so it lives for one call's decode at most.
//
// The codec it wraps is WireCodec: the node's messages are marshalled by
// vtprotobuf's generated code, the same bytes as protobuf-go's.
func MalformedIsInvalid() []grpc.ServerOption {
	c := &strictCodec{inner: WireCodec()}
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(c),
		grpc.ChainUnaryInterceptor(c.unary),
		grpc.ChainStreamInterceptor(c.stream),
	}
}

type strictCodec struct {
	inner encoding.CodecV2
	bad   sync.Map // message pointer -> its decode error
}

func (c *strictCodec) Name() string { return c.inner.Name() }

func (c *strictCodec) Marshal(v any) (mem.BufferSlice, error) { return c.inner.Marshal(v) }

func (c *strictCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if err := c.inner.Unmarshal(data, v); err != nil {
		m, ok := v.(proto.Message)
		if !ok {
			return err
		}
		proto.Reset(m) // nothing half-decoded reaches a handler
		c.bad.Store(v, err)
	}
	return nil
}

// take returns the INVALID_ARGUMENT status for v if it did not decode.
func (c *strictCodec) take(v any) error {
	if err, ok := c.bad.LoadAndDelete(v); ok {
		return status.Errorf(codes.InvalidArgument, "the message is not valid protobuf: %v", err)
	}
	return nil
}

func (c *strictCodec) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := c.take(req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (c *strictCodec) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &strictStream{ServerStream: ss, c: c})
}

type strictStream struct {
	grpc.ServerStream
	c *strictCodec
}

func (s *strictStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.c.take(m)
}
