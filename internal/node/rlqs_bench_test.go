package node_test

import (
	"context"
	"fmt"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/redistest"
)

// BenchmarkRLQSReportOfColdBuckets is the time a node takes to answer a
// stream's first report naming n buckets it has never settled (one
// pipelined part.lua call per region bucket): what an Envoy with many
// buckets waits for after connecting to a fresh node. Every iteration
// names new buckets.
func BenchmarkRLQSReportOfColdBuckets(b *testing.B) {
	redistest.Require(b)
	in := redistest.Server(b)
	_, dial := rlqsNode(b, in.Addr, rlqsPolicies)
	for _, n := range []int{100, 4096} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			round := 0
			for b.Loop() {
				b.StopTimer()
				round++
				ss, err := rlqsv3.NewRateLimitQuotaServiceClient(dial()).StreamRateLimitQuotas(context.Background())
				require.NoError(b, err)
				msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: "bench"}
				for i := range n {
					msg.BucketQuotaUsages = append(msg.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
						BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("r%d-%d-%d", n, round, i)}}})
				}
				b.StartTimer()
				require.NoError(b, ss.Send(msg))
				resp, err := ss.Recv()
				require.NoError(b, err)
				require.Len(b, resp.GetBucketAction(), n)
				b.StopTimer()
				require.NoError(b, ss.CloseSend())
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/bucket")
		})
	}
}
