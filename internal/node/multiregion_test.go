package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/internal/coord/demand"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// A node in one of three regions enforces L/3 of a global limit until a
// coordinator writes a share, and publishes its global keys' demand
// (admitted and denied, leased and exact) on NATS for its coordinator.
func TestMultiRegionNodeSharesAndPublishesDemand(t *testing.T) {
	srv := redistest.Server(t)
	natsURL := natstest.Server(t)
	path := nodetest.PolicyFile(t, `
policies:
  - id: global-api
    scope: global
    precision: leased
    per: [tenant]
    limits:
      - {name: per_hour, algorithm: token_bucket, limit: 30, period: 1h}
  - id: daily
    scope: global
    per: [tenant]
    limits:
      - {name: per_day, algorithm: fixed_window, limit: 1000, period: 24h}
`)
	nc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	demand, err := demand.Collect(nc, "us", nil)
	require.NoError(t, err)
	t.Cleanup(func() { demand.Close() })

	n, err := node.Start(context.Background(), node.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "", Redis: []string{srv.Addr}, PoliciesPath: path,
		MultiRegion: node.MultiRegion{Region: "us", Regions: []string{"us", "eu", "ap"}, NATSURL: natsURL, DemandPeriod: 50 * time.Millisecond},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	c := ratelimitv1.NewRateLimiterServiceClient(conn)

	allowed := 0
	for range 15 {
		resp, err := c.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: "acme"})
		require.NoError(t, err)
		if resp.Decision == ratelimitv1.RateLimitResponse_ALLOWED {
			allowed++
			assert.Equal(t, int64(10), resp.Limit, "this region's share of 30 is 10")
		}
	}
	assert.Equal(t, 10, allowed, "a bucket with no coordinator share enforces L/n")

	var admitted, denied, quota int64
	require.Eventually(t, func() bool {
		demand.Drain(func(key string, a, d int64) {
			switch key {
			case "rl:{tenant=acme}:global-api:per_hour":
				admitted += a
				denied += d
			case "rl:{tenant=acme}:daily:per_day":
				quota += a + d
			}
		})
		return admitted+denied >= 15 && quota >= 10
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, int64(10), admitted)
	assert.Equal(t, int64(5), denied)
	// The exact path's global quota is published too. Fifteen checks are
	// fewer than cold_hits, so the leased policy's key is cold and goes
	// to the exact path with the quota's: all 15 count, the 5 the
	// per-hour limit denied as denied.
	assert.Equal(t, int64(15), quota)
}

func TestMultiRegionFlagsAreChecked(t *testing.T) {
	_, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", MultiRegion: node.MultiRegion{Region: "us", Regions: []string{"eu"}}})
	require.ErrorContains(t, err, "must include")
	_, err = node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", MultiRegion: node.MultiRegion{NATSURL: "nats://127.0.0.1:1"}})
	require.ErrorContains(t, err, "need --region")
}
