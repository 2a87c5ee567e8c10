package server_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/server"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// BenchmarkWireCodecUnmarshal decodes what a client of a batch of 100
// leased checks receives (each answer with one status) and what the
// node receives for it: the wire codec's check of the bytes (plain) and
// its decoding, per call.
func BenchmarkWireCodecUnmarshal(b *testing.B) {
	resp := &ratelimitv1.BatchRateLimitResponse{}
	req := &ratelimitv1.BatchRateLimitRequest{}
	for i := range 100 {
		resp.Responses = append(resp.Responses, &ratelimitv1.RateLimitResponse{
			Decision: ratelimitv1.RateLimitResponse_ALLOWED, Limit: 1_000_000_000, Remaining: 999_999_000, ResetAfterSeconds: 1, PolicyId: "batch",
			Statuses: []*ratelimitv1.LimitStatus{{PolicyId: "batch", LimitName: "l", Limit: 1_000_000_000, Remaining: 999_999_000, ResetAfterSeconds: 1, WindowSeconds: 1}},
		})
		req.Requests = append(req.Requests, &ratelimitv1.RateLimitRequest{TenantId: fmt.Sprintf("t%d", i), Route: "/api", Method: "GET"})
	}
	for _, tc := range []struct {
		name string
		m    proto.Message
	}{{"batch-answer", resp}, {"batch-request", req}} {
		b.Run(tc.name, func(b *testing.B) {
			c := server.WireCodec()
			data, err := c.Marshal(tc.m)
			if err != nil {
				b.Fatal(err)
			}
			bs := mem.BufferSlice{mem.SliceBuffer(data.Materialize())}
			b.SetBytes(int64(bs.Len()))
			b.ReportAllocs()
			for b.Loop() {
				m := tc.m.ProtoReflect().New().Interface()
				if err := c.Unmarshal(bs, m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
