package node_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/rlqs"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// rawCodec sends bytes as they are, so a test can send what no
// generated client would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// Bytes that are not protobuf are the caller's fault: INVALID_ARGUMENT,
// not grpc-go's INTERNAL; a good call on the same connection still works.
func TestMalformedProtobufIsInvalidArgument(t *testing.T) {
	_, conn := nodetest.Start(t, testPolicies, node.Config{})
	ctx := context.Background()
	for name, b := range map[string][]byte{
		"truncated length": {0x0a, 0x05, 'a'}, // field 1, 5 bytes announced, 1 sent
		"bad wire type":    {0x0f},            // field 1, wire type 7
		"huge varint":      {0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		var out []byte
		err := conn.Invoke(ctx, "/"+ratelimitv1.RateLimiterService_ServiceDesc.ServiceName+"/CheckRateLimit", &b, &out, grpc.ForceCodec(rawCodec{}))
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
	}
	_, err := ratelimitv1.NewRateLimiterServiceClient(conn).CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t"})
	require.NoError(t, err)
}

// A stream's message that is not protobuf ends the stream with
// INVALID_ARGUMENT too (the codec marks it; the stream interceptor
// answers it at RecvMsg), and nothing of it reaches the handler.
func TestMalformedStreamMessageIsInvalidArgument(t *testing.T) {
	_, conn := nodetest.Start(t, testPolicies, node.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a handler that got it would not answer
	defer cancel()
	desc := &grpc.StreamDesc{StreamName: "StreamRateLimitQuotas", ClientStreams: true, ServerStreams: true}
	method := "/" + rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName + "/StreamRateLimitQuotas"
	s, err := conn.NewStream(ctx, desc, method, grpc.ForceCodec(rawCodec{}))
	require.NoError(t, err)
	b := []byte{0x0a, 0x05, 'a'} // field 1, 5 bytes announced, 1 sent
	require.NoError(t, s.SendMsg(&b))
	var out []byte
	err = s.RecvMsg(&out)
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "not valid protobuf")

	// A report of more buckets than a stream takes, refused before it is
	// decoded (rlqs.MaxUsages, through server.FanOut).
	s, err = conn.NewStream(ctx, desc, method, grpc.ForceCodec(rawCodec{}))
	require.NoError(t, err)
	b = append([]byte{0x0a, 1, 'd'}, bytes.Repeat([]byte{0x12, 0}, rlqs.MaxUsages+1)...)
	require.NoError(t, s.SendMsg(&b))
	err = s.RecvMsg(&out)
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, fmt.Sprintf("bucket_quota_usages: %d in one message; at most %d", rlqs.MaxUsages+1, rlqs.MaxUsages))
}

// A call with more elements than its handler accepts is refused with the
// handler's INVALID_ARGUMENT, before it is decoded (the server package's
// TestFanOutIsRefusedBeforeDecoding measures the allocations).
func TestTooManyElementsAreInvalidArgument(t *testing.T) {
	_, conn := nodetest.Start(t, testPolicies, node.Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		method string
		wire   []byte
		want   string
	}{
		{"/" + ratelimitv1.RateLimiterService_ServiceDesc.ServiceName + "/CheckRateLimitBatch", bytes.Repeat([]byte{0x0a, 0}, 1001), "requests: 1001 checks exceed the maximum of 1000 per call"},
		{"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", append([]byte{0x0a, 1, 'd'}, bytes.Repeat([]byte{0x12, 0}, 1001)...), "descriptors: 1001, want 1 to 1000"},
		{"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", append([]byte{0x0a, 1, 'd', 0x12, 14}, bytes.Repeat([]byte{0x0a, 0}, 7)...), "at most 6 (one per request field)"},
	} {
		var out []byte
		err := conn.Invoke(ctx, tc.method, &tc.wire, &out, grpc.ForceCodec(rawCodec{}))
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", tc.method, err)
		assert.ErrorContains(t, err, tc.want)
	}
	_, err := ratelimitv1.NewRateLimiterServiceClient(conn).CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t"})
	require.NoError(t, err)
}
