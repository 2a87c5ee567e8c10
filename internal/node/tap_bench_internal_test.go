package node

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/tap"
)

// BenchmarkInFlightTap is one call's life in the in-flight table: its
// slot taken at the tap, given back as its handler returns, and its
// stream context cancelled (grpc-go does so at every call's end). The
// stream context's own cost is in BenchmarkStreamContext.
func BenchmarkInFlightTap(b *testing.B) {
	f := newInFlight(1<<16, time.Now)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, cancel := context.WithCancel(context.Background())
			c, err := f.tap(ctx, &tap.Info{})
			if err != nil {
				b.Fatal(err)
			}
			f.end(c)
			cancel()
		}
	})
}

func BenchmarkStreamContext(b *testing.B) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, cancel := context.WithCancel(context.Background())
			_ = ctx.Done()
			cancel()
		}
	})
}
