package node_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/internal/tools/loadgen"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// The same limit, leased for tier "leased" and exact for tier "exact".
// It is high enough that nothing is denied: the benchmark measures the
// cost of a decision, not of a 429.
const benchPolicies = `
policies:
  - id: leased
    match: {tier: leased}
    per: [tenant]
    precision: leased
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000000000, period: 1s}
  - id: exact
    match: {tier: exact}
    per: [tenant]
    precision: exact
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000000000, period: 1s}
`

func benchNode(b *testing.B, dial ...grpc.DialOption) ratelimitv1.RateLimiterServiceClient {
	b.Helper()
	srv := redistest.Server(b)
	path := filepath.Join(b.TempDir(), "p.yaml")
	require.NoError(b, os.WriteFile(path, []byte(benchPolicies), 0o600))
	n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", Redis: []string{srv.Addr}, PoliciesPath: path})
	require.NoError(b, err)
	b.Cleanup(func() { _ = n.Close(5 * time.Second) })
	conn, err := grpc.NewClient(n.Addr(), append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	return ratelimitv1.NewRateLimiterServiceClient(conn)
}

// noopClient is a client of loadgen's no-op RateLimiterService (a
// default grpc.NewServer that answers ALLOWED unread): grpc-go's own
// floor for a unary call in this harness, for the "noop" sub-benchmarks.
func noopClient(b *testing.B) ratelimitv1.RateLimiterServiceClient {
	b.Helper()
	srv, err := loadgen.StartNoop("127.0.0.1:0")
	require.NoError(b, err)
	b.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close() })
	return ratelimitv1.NewRateLimiterServiceClient(conn)
}

// benchClient is the client of a sub-benchmark: the no-op server for
// "noop", else a node. "leased-wirecodec" is "leased" with the client
// decoding through server.WireCodec too (the figures count the client's
// allocations as well as the node's).
func benchClient(b *testing.B, tier string) (ratelimitv1.RateLimiterServiceClient, string) {
	switch tier {
	case "noop":
		return noopClient(b), tier
	case "leased-wirecodec":
		return benchNode(b, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(server.WireCodec()))), "leased"
	}
	return benchNode(b), tier
}

// latencies gathers per-call times from parallel goroutines.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration
}

func (l *latencies) add(d []time.Duration) { l.mu.Lock(); l.all = append(l.all, d...); l.mu.Unlock() }

func (l *latencies) report(b *testing.B, perOp int) {
	slices.Sort(l.all)
	q := func(p float64) float64 { return float64(l.all[int(p*float64(len(l.all)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(q(0.999), "p999-µs")
	b.ReportMetric(float64(b.N*perOp)/b.Elapsed().Seconds(), "decisions/s")
}

// warm drives every tenant for a second before timing, so leased keys have
// their rate estimate and grants settled (a cold key ramps its grant from
// the cost of one request up over a few round trips).
func warm(b *testing.B, c ratelimitv1.RateLimiterServiceClient, tier string) {
	b.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for end := time.Now().Add(time.Second); time.Now().Before(end); {
				for i := g; i < 100; i += 8 {
					_, _ = c.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t" + strconv.Itoa(i), Tier: tier, Route: "/v1/x", Method: "GET"})
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkGRPCCheck: CheckRateLimit over a real listener and a real
// redis-server, leased next to exact, same load (b.RunParallel with
// 16 goroutines per CPU, 64 tenants). "noop" is the same calls to a
// server that answers without deciding: the floor of grpc-go itself.
func BenchmarkGRPCCheck(b *testing.B) {
	for _, name := range []string{"leased", "leased-wirecodec", "exact", "noop"} {
		b.Run(name, func(b *testing.B) {
			c, tier := benchClient(b, name)
			ctx := context.Background()
			warm(b, c, tier)
			var lat latencies
			var seq atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := seq.Add(1)
				req := &ratelimitv1.RateLimitRequest{TenantId: "t" + strconv.FormatInt(i%64, 10), Tier: tier, Route: "/v1/x", Method: "GET"}
				var mine []time.Duration
				for pb.Next() {
					start := time.Now()
					resp, err := c.CheckRateLimit(ctx, req)
					mine = append(mine, time.Since(start))
					if err != nil || resp.Decision != ratelimitv1.RateLimitResponse_ALLOWED {
						b.Errorf("check: %v %v", err, resp.GetDecision())
						return
					}
				}
				lat.add(mine)
			})
			b.StopTimer()
			lat.report(b, 1)
		})
	}
}

// BenchmarkGRPCBatch100: CheckRateLimitBatch with 100 checks per call
// (100 tenants), leased next to exact, and "noop" (see BenchmarkGRPCCheck).
func BenchmarkGRPCBatch100(b *testing.B) {
	for _, name := range []string{"leased", "leased-wirecodec", "exact", "noop"} {
		b.Run(name, func(b *testing.B) {
			c, tier := benchClient(b, name)
			ctx := context.Background()
			batch := &ratelimitv1.BatchRateLimitRequest{}
			for i := range 100 {
				batch.Requests = append(batch.Requests, &ratelimitv1.RateLimitRequest{TenantId: "t" + strconv.Itoa(i), Tier: tier, Route: "/v1/x"})
			}
			warm(b, c, tier)
			var lat latencies
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				for pb.Next() {
					start := time.Now()
					resp, err := c.CheckRateLimitBatch(ctx, batch)
					mine = append(mine, time.Since(start))
					if err != nil || len(resp.Responses) != 100 {
						b.Errorf("batch: %v", err)
						return
					}
				}
				lat.add(mine)
			})
			b.StopTimer()
			lat.report(b, 100)
		})
	}
}
