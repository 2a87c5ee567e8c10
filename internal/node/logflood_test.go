package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/logbuf"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/policy"
)

// During a Redis outage every failed lease refill logged a line (954 in
// a 3 s stall at 200 req/s); now one per message per 10 s gets through.
func TestOutageLogLinesAreRateLimited(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	p := faultproxy.New(t, in.Addr)
	var logs logbuf.Buffer
	n, _ := nodetest.Start(t, `
policies:
  - {id: api, per: [tenant], precision: leased, on_store_failure: open, limits: [{name: s, algorithm: token_bucket, limit: 1000, period: 1s}]}
  - {id: ex, per: [client], on_store_failure: open, limits: [{name: s, algorithm: token_bucket, limit: 1000, period: 1s}]}
`, node.Config{Redis: []string{p.Addr}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	p.Cut()
	p.BlackHole(true)
	const checks = 40
	for i := range checks {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		// One tenant: after its first (cold, exact) check it is leased,
		// and each check finds no tokens and asks for a refill.
		_, err := n.Decider().Check(ctx, &policy.Request{Tenant: "t", Client: fmt.Sprintf("c%d", i)})
		cancel()
		require.NoError(t, err)
	}
	out := logs.String()
	refill := strings.Count(out, "lease refill failed")
	require.GreaterOrEqual(t, refill, 1, "refills failed: %s", out)
	assert.LessOrEqual(t, refill, 1, "one line per 10 s, not one per failed refill:\n%s", out)
	// The decider's line per degraded check goes through the same limit.
	degraded := strings.Count(out, "store failed; deciding by on_store_failure")
	require.GreaterOrEqual(t, degraded, 1, "checks were degraded: %s", out)
	assert.LessOrEqual(t, degraded, 1, "one line per 10 s, not one per degraded check:\n%s", out)
}

// A client may send thousands of refused RLQS bucket ids: the node logs
// them through the same rate limit, one line per 10 s.
func TestRefusedRLQSBucketsAreRateLimited(t *testing.T) {
	var logs logbuf.Buffer
	_, conn := nodetest.Start(t, rlqsPolicies, node.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	us := make([]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, 2000)
	for i := range us {
		us[i] = &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"name": fmt.Sprint(i)}}}
	}
	require.NoError(t, s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: us}))
	resp, err := s.Recv()
	require.NoError(t, err)
	assert.Len(t, resp.GetBucketAction(), 2000)
	assert.Equal(t, 1, strings.Count(logs.String(), "rlqs: bucket id refused"), logs.String())
}
