package client_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/allot-dev/allot/client"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// BenchmarkCheck: Check against an in-process standalone node, 64
// concurrent callers (RunParallel), each on its own key of a limit that
// never throttles. "single" sends one CheckRateLimit per Check (coalescing
// off); "coalesced" is the default. calls/s counts Checks answered,
// rpcs/call the RPCs they cost.
func BenchmarkCheck(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []client.Option
	}{
		{"single", []client.Option{client.WithMaxBatch(1)}},
		{"coalesced", nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			nd := startNode(b)
			r := &rpcs{}
			c := newClient(b, []string{nd.Addr()}, r, bc.opts...)
			ctx := context.Background()
			var id atomic.Int64
			b.SetParallelism(32) // x GOMAXPROCS callers
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: fmt.Sprintf("bench%d", id.Add(1))}
				for pb.Next() {
					if _, err := c.Check(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
			b.ReportMetric(float64(r.total())/float64(b.N), "rpcs/call")
		})
	}
}

// BenchmarkCheckAlone: one caller, one Check at a time. Coalescing must
// add no wait here (nothing else is in flight, so each Check goes at once).
func BenchmarkCheckAlone(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []client.Option
	}{
		{"single", []client.Option{client.WithMaxBatch(1)}},
		{"coalesced", nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			nd := startNode(b)
			r := &rpcs{}
			c := newClient(b, []string{nd.Addr()}, r, bc.opts...)
			ctx := context.Background()
			req := &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: "alone"}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
			b.ReportMetric(float64(r.total())/float64(b.N), "rpcs/call")
		})
	}
}
