package node_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot/internal/testenv/redistest"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// TestRLQSStreamsBesideChecks is issue 43's measurement, not a test: a
// node with 1,000 RLQS streams (one bucket each at 1 request/s, reported
// every 5 s as Envoy does, over 10 connections) beside closed-loop CheckRateLimit load (32 in flight),
// alternated with the same load and no streams. It runs only with
// ALLOT_MEASURE=1:
//
//	ALLOT_MEASURE=1 ALLOT_REQUIRE_REDIS=1 go test -count=1 -v -run TestRLQSStreamsBesideChecks ./internal/node/
func TestRLQSStreamsBesideChecks(t *testing.T) {
	if os.Getenv("ALLOT_MEASURE") == "" {
		t.Skip("a measurement: set ALLOT_MEASURE=1")
	}
	redistest.Require(t)
	_, dial := rlqsNode(t, redistest.Server(t).Addr, rlqsPolicies)
	const streams, conns, run = 1000, 10, 15 * time.Second
	for round := range 4 {
		withStreams := round%2 == 1
		ctx, cancel := context.WithCancel(context.Background())
		var assigned atomic.Int64
		var wg sync.WaitGroup
		if withStreams {
			cs := make([]*grpc.ClientConn, conns)
			for i := range cs {
				cs[i] = dial()
			}
			for i := range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := rlqsv3.NewRateLimitQuotaServiceClient(cs[i%conns]).StreamRateLimitQuotas(ctx)
					if err != nil {
						return
					}
					id := &rlqsv3.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("s%d", i)}}
					got := false
					for el := time.Duration(0); ctx.Err() == nil; el = 5 * time.Second {
						msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: "m", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
							{BucketId: id, TimeElapsed: durationpb.New(el), NumRequestsAllowed: uint64(el / time.Second)}}}
						if s.Send(msg) != nil {
							return
						}
						resp, err := s.Recv()
						if err != nil {
							return
						}
						if !got && resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil {
							got = true
							assigned.Add(1)
						}
						select {
						case <-ctx.Done():
						case <-time.After(5 * time.Second):
						}
					}
				}()
			}
		}
		checks := ratelimitv1.NewRateLimiterServiceClient(dial())
		var decided, failedOpen, errs atomic.Int64
		end := time.Now().Add(run)
		var cw sync.WaitGroup
		for range 32 {
			cw.Add(1)
			go func() {
				defer cw.Done()
				for i := 0; time.Now().Before(end); i++ {
					resp, err := checks.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: fmt.Sprintf("c%d", i%64)})
					switch {
					case err != nil:
						errs.Add(1)
					case resp.Decision == ratelimitv1.RateLimitResponse_FAILED_OPEN:
						failedOpen.Add(1)
					default:
						decided.Add(1)
					}
				}
			}()
		}
		cw.Wait()
		cancel()
		wg.Wait()
		t.Logf("streams %-5v assigned %4d/%d  checks %6d (%.0f/s)  FAILED_OPEN %d  errors %d", withStreams, assigned.Load(), map[bool]int{true: streams}[withStreams],
			decided.Load(), float64(decided.Load())/run.Seconds(), failedOpen.Load(), errs.Load())
		require.True(t, !withStreams || assigned.Load() == streams, "every stream assigned")
	}
}
