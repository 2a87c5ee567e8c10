package node_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// A crashed node stops serving at once and strands the tokens it leased:
// they are not given back, so the next node of the region can only admit
// what the bucket had left, limit − spent − stranded.
func TestCrashStrandsLeases(t *testing.T) {
	srv := redistest.Server(t)
	path := nodetest.PolicyFile(t, `
policies:
  - id: leased-api
    precision: leased
    per: [tenant]
    limits:
      - {name: per_hour, algorithm: token_bucket, limit: 100, period: 1h}
`)
	start := func() (*node.Node, ratelimitv1.RateLimiterServiceClient) {
		n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Redis: []string{srv.Addr}, PoliciesPath: path})
		require.NoError(t, err)
		conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return n, ratelimitv1.NewRateLimiterServiceClient(conn)
	}
	allowed := func(c ratelimitv1.RateLimiterServiceClient, calls int) int64 {
		var n int64
		for range calls {
			resp, err := c.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: "acme"})
			require.NoError(t, err)
			if resp.Decision == ratelimitv1.RateLimitResponse_ALLOWED {
				n++
			}
		}
		return n
	}

	crashed, c := start()
	// The first checks of a cold key are decided exactly; the fourth
	// (lease.DefaultColdHits) leases.
	require.Equal(t, int64(lease.DefaultColdHits), allowed(c, lease.DefaultColdHits))
	grpcAddr, httpAddr := crashed.Addr(), crashed.HTTPAddr()
	stranded, err := crashed.Crash()
	require.NoError(t, err)
	assert.Positive(t, stranded, "the node held a lease")
	for _, a := range []string{grpcAddr, httpAddr} {
		conn, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			conn.Close()
		}
		assert.Error(t, err, "%s still accepts connections after Crash", a)
	}

	next, c := start()
	t.Cleanup(func() { assert.NoError(t, next.Close(5*time.Second)) })
	assert.Equal(t, 100-lease.DefaultColdHits-stranded, allowed(c, 150), "the stranded tokens did not come back")
}
