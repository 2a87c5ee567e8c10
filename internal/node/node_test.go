package node_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

const testPolicies = `
tenants: {org_acme: pro}
default_tier: free
costs: {"POST /v1/transfers": 10}
policies:
  - id: free-tier
    match: {tier: free}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 5, period: 1s, burst: 10}
  - id: pro-tier
    match: {tier: pro}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 50, period: 1s, burst: 100}
`

// startNode starts a node enforcing testPolicies on the Redis instances
// redis (none: standalone) and returns a client of it once its health
// says SERVING.
func startNode(t *testing.T, redis []string) ratelimitv1.RateLimiterServiceClient {
	t.Helper()
	_, conn := nodetest.Start(t, testPolicies, node.Config{Redis: redis})
	hc, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: ratelimitv1.RateLimiterService_ServiceDesc.ServiceName})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, hc.Status)
	return ratelimitv1.NewRateLimiterServiceClient(conn)
}

func TestContractStandalone(t *testing.T) { testContract(t, nil) }

func TestContractRedis(t *testing.T) {
	srv := redistest.Server(t)
	testContract(t, []string{srv.Addr})
}

func TestContractRedisCluster(t *testing.T) {
	testContract(t, redistest.Cluster(t, 3))
}

func testContract(t *testing.T, redis []string) {
	c := startNode(t, redis)
	ctx := context.Background()
	req := &ratelimitv1.RateLimitRequest{TenantId: "org_free", ClientIdentifier: "usr_1", Route: "/v1/transfers", Method: "POST"}
	// Cost 10 from the costs table takes the whole burst of 10.
	resp, err := c.CheckRateLimit(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, ratelimitv1.RateLimitResponse_ALLOWED, resp.Decision)
	assert.Equal(t, int64(10), resp.Limit)
	assert.Equal(t, int64(0), resp.Remaining)
	assert.Equal(t, int64(2), resp.ResetAfterSeconds)
	assert.Equal(t, "free-tier", resp.PolicyId)

	resp, err = c.CheckRateLimit(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, ratelimitv1.RateLimitResponse_THROTTLED, resp.Decision)
	assert.Contains(t, resp.ViolationReason, "free-tier")
	assert.Contains(t, resp.ViolationReason, "per_second")
	assert.Equal(t, int64(2), resp.ResetAfterSeconds) // 10 tokens at 5/s, rounded up
	assert.InDelta(t, 2000, resp.RetryAfterMs, 100)
	require.Len(t, resp.Statuses, 1)
	assert.True(t, resp.Statuses[0].Violated)

	// The tenant's tier comes from the file; the request's tier wins.
	resp, err = c.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "org_acme"})
	require.NoError(t, err)
	assert.Equal(t, "pro-tier", resp.PolicyId)
	assert.Equal(t, int64(99), resp.Remaining)
	resp, err = c.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "org_acme", Tier: "free", TokenCost: 3})
	require.NoError(t, err)
	assert.Equal(t, "free-tier", resp.PolicyId)
	assert.Equal(t, int64(7), resp.Remaining)

	// Batch: each check decided as CheckRateLimit would.
	batch := &ratelimitv1.BatchRateLimitRequest{}
	for range 12 {
		batch.Requests = append(batch.Requests, &ratelimitv1.RateLimitRequest{TenantId: "org_batch"})
	}
	br, err := c.CheckRateLimitBatch(ctx, batch)
	require.NoError(t, err)
	require.Len(t, br.Responses, 12)
	allowed := 0
	for _, r := range br.Responses {
		if r.Decision == ratelimitv1.RateLimitResponse_ALLOWED {
			allowed++
		}
	}
	assert.Equal(t, 10, allowed)
}

func TestBadInputIsInvalidArgument(t *testing.T) {
	c := startNode(t, nil)
	ctx := context.Background()
	cases := map[string]*ratelimitv1.RateLimitRequest{
		"empty identity": {Route: "/x"},
		"negative cost":  {TenantId: "t", TokenCost: -1},
		"absurd cost":    {TenantId: "t", TokenCost: 2_000_000_000},
		"long field":     {TenantId: strings.Repeat("a", 257)},
		"invalid utf-8":  {TenantId: "t\xff"},
		"bad ip":         {TenantId: "t", Ip: "999.1.1.1"},
	}
	for name, req := range cases {
		_, err := c.CheckRateLimit(ctx, req)
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
	}
	// A batch with one bad check fails whole, naming it, and counts nothing.
	_, err := c.CheckRateLimitBatch(ctx, &ratelimitv1.BatchRateLimitRequest{Requests: []*ratelimitv1.RateLimitRequest{{TenantId: "org_b"}, {}}})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, err.Error(), "requests[1]")
	resp, err := c.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "org_b"})
	require.NoError(t, err)
	assert.Equal(t, int64(9), resp.Remaining, "the rejected batch counted nothing")
}

// A client built from the seed's proto3 file sends these exact bytes; a
// raw codec lets the test send invalid UTF-8 the way such a client could.
func TestSeedWireCompatibility(t *testing.T) {
	c := startNode(t, nil)
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "org_seed")
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, "usr_9981")
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, "/v1/orders")
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	b = protowire.AppendVarint(b, 2)
	var req ratelimitv1.RateLimitRequest
	require.NoError(t, (protoUnmarshal(b, &req)))
	resp, err := c.CheckRateLimit(context.Background(), &req)
	require.NoError(t, err)
	assert.Equal(t, int64(8), resp.Remaining)
	assert.Equal(t, "/hispeeddesign.ratelimit.v1.RateLimiterService/CheckRateLimit",
		"/"+ratelimitv1.RateLimiterService_ServiceDesc.ServiceName+"/"+ratelimitv1.RateLimiterService_ServiceDesc.Methods[0].MethodName)
}
