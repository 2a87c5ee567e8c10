package node_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

const resiliencePolicies = `
policies:
  - {id: api, match: {route: /api}, per: [tenant], on_store_failure: open, limits: [{name: d, algorithm: token_bucket, limit: 100, period: 24h}]}
  - {id: login, match: {route: /login}, per: [client], on_store_failure: closed, limits: [{name: d, algorithm: token_bucket, limit: 100, period: 24h}]}
  - {id: search, match: {route: /search}, per: [tenant], on_store_failure: local, limits: [{name: d, algorithm: token_bucket, limit: 100, period: 24h}]}
`

// Scheduling margin a loaded CI machine under -race cannot break; the
// precise latency figures are in docs/performance.md, "Resilience".
const margin = 250 * time.Millisecond

type resilientNode struct {
	*node.Node
	proxy  *faultproxy.Proxy
	redis  *redistest.Instance
	health healthpb.HealthClient
}

func startResilient(t *testing.T) *resilientNode {
	t.Helper()
	redistest.Require(t)
	in := redistest.Server(t)
	p := faultproxy.New(t, in.Addr)
	path := nodetest.PolicyFile(t, resiliencePolicies)
	n, err := node.Start(context.Background(), node.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Redis: []string{p.Addr}, PoliciesPath: path,
		Resilience: node.Resilience{
			RedisTimeout: region.DefaultTimeout,
			Breaker:      region.BreakerOptions{MaxOpen: 300 * time.Millisecond},
			GossipFloor:  4,
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &resilientNode{Node: n, proxy: p, redis: in, health: healthpb.NewHealthClient(conn)}
}

func (rn *resilientNode) check(t *testing.T, route string) (decide.Decision, time.Duration) {
	t.Helper()
	return rn.checkAs(t, route, "t")
}

func (rn *resilientNode) checkAs(t *testing.T, route, tenant string) (decide.Decision, time.Duration) {
	t.Helper()
	start := time.Now()
	dec, err := rn.Decider().Check(context.Background(), &policy.Request{Tenant: tenant, Client: "c", Route: route})
	took := time.Since(start)
	require.NoError(t, err)
	return dec, took
}

func (rn *resilientNode) storeHealth(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	r, err := rn.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: node.StoreHealthService})
	require.NoError(t, err)
	return r.Status
}

func (rn *resilientNode) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + rn.HTTPAddr() + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestNodeThroughRedisFaults drives one node through each fault between
// it and Redis and checks, for every decision, the time bound and the
// policy's on_store_failure; then that health says so and that counting
// resumes from Redis's state.
func TestNodeThroughRedisFaults(t *testing.T) {
	rn := startResilient(t)
	// Warm up: every route counted once by Redis.
	for _, route := range []string{"/api", "/login", "/search"} {
		require.Eventually(t, func() bool {
			dec, _ := rn.check(t, route)
			return dec.Outcome == decide.Allowed && dec.Statuses[0].Exact
		}, 10*time.Second, 10*time.Millisecond)
	}
	// Under load a warm-up call may miss its deadline (first dial, script
	// load) and, with MinRequests 5, open the breaker: wait for it to close.
	require.Eventually(t, func() bool {
		return rn.storeHealth(t) == healthpb.HealthCheckResponse_SERVING
	}, 5*time.Second, 10*time.Millisecond)

	faults := []struct {
		name        string
		start, stop func()
	}{
		{"black hole", func() { rn.proxy.BlackHole(true) }, rn.proxy.Heal},
		{"100ms slowdown", func() { rn.proxy.SetLatency(100 * time.Millisecond) }, rn.proxy.Heal},
		{"cut", rn.proxy.Cut, rn.proxy.Heal},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			f.start()
			localAllowed := 0
			for range 30 {
				dec, took := rn.check(t, "/api")
				assert.Less(t, took, region.DefaultTimeout+margin)
				assert.Equal(t, decide.FailedOpen, dec.Outcome, "open")

				dec, took = rn.check(t, "/login")
				assert.Less(t, took, region.DefaultTimeout+margin)
				assert.Equal(t, decide.Throttled, dec.Outcome, "closed")
				assert.Contains(t, dec.Reason, "store unavailable")

				// A tenant of its own per fault: the fallback's share is
				// per node and per day, and earlier faults spent "t"'s.
				dec, took = rn.checkAs(t, "/search", f.name)
				assert.Less(t, took, region.DefaultTimeout+margin)
				if dec.Outcome == decide.Allowed {
					localAllowed++
					assert.False(t, dec.Statuses[0].Exact)
					assert.Equal(t, int64(25), dec.Limit, "100 / floor 4")
				}
			}
			assert.Equal(t, 25, localAllowed, "the local share, 100 / floor 4")
			// The health watcher polls the breakers every 250 ms.
			require.Eventually(t, func() bool {
				return rn.storeHealth(t) == healthpb.HealthCheckResponse_NOT_SERVING
			}, 5*time.Second, 10*time.Millisecond)
			code, body := rn.get(t, "/readyz")
			assert.Equal(t, http.StatusOK, code, "degraded but serving")
			assert.Contains(t, body, "degraded")
			assert.NotContains(t, body, "(0/0 failed)", "an open breaker has no counts to show")
			f.stop()
			// Recovery: the breaker probes and closes, Redis decides again.
			require.Eventually(t, func() bool {
				dec, _ := rn.check(t, "/api")
				return dec.Outcome == decide.Allowed
			}, 10*time.Second, 10*time.Millisecond)
			require.Eventually(t, func() bool {
				return rn.storeHealth(t) == healthpb.HealthCheckResponse_SERVING
			}, 5*time.Second, 10*time.Millisecond)
			_, body = rn.get(t, "/readyz")
			assert.Contains(t, body, "store: ok")
		})
	}
	// Nothing the faults did reached Redis except what the slowdown's
	// calls took after their deadline (their replies were lost, they ran):
	// the login key was only counted by Redis, never by the fallback.
	// One decision on a loaded machine under -race may still miss its
	// 5 ms deadline and be decided by the fallback: wait for Redis's.
	var dec decide.Decision
	require.Eventually(t, func() bool {
		dec, _ = rn.check(t, "/search")
		return dec.Outcome == decide.Allowed && dec.Statuses[0].Exact
	}, 10*time.Second, 10*time.Millisecond)
	assert.LessOrEqual(t, dec.Remaining, int64(100-2))
}

// TestNodeRecoversAfterRedisRestart: Redis is killed and restarted (data
// and script cache lost); the node recovers without a restart.
func TestNodeRecoversAfterRedisRestart(t *testing.T) {
	rn := startResilient(t)
	require.Eventually(t, func() bool {
		dec, _ := rn.check(t, "/api")
		return dec.Outcome == decide.Allowed
	}, 10*time.Second, 10*time.Millisecond)
	rn.redis.Kill()
	for range 20 {
		dec, took := rn.check(t, "/search")
		assert.Less(t, took, region.DefaultTimeout+margin)
		assert.False(t, dec.Outcome == decide.Allowed && dec.Statuses[0].Exact)
	}
	rn.redis.Restart()
	// A call that timed out on a loaded machine may still have run (its
	// reply was lost): each attempt counts at most once.
	exactly := func(prev int64) int64 {
		t.Helper()
		attempts := int64(0)
		var dec decide.Decision
		require.Eventually(t, func() bool {
			attempts++
			dec, _ = rn.check(t, "/login")
			return dec.Outcome == decide.Allowed
		}, 10*time.Second, 10*time.Millisecond)
		assert.LessOrEqual(t, dec.Remaining, prev-1)
		assert.GreaterOrEqual(t, dec.Remaining, prev-attempts)
		return dec.Remaining
	}
	rem := exactly(100) // a fresh bucket on the restarted Redis
	exactly(rem)
}

// --redis-timeout is the budget of the whole decision: the store's calls
// get it less --redis-timeout-margin, and a margin that leaves Redis no
// time is refused at start.
func TestRedisTimeoutIsTheDecisionBudget(t *testing.T) {
	redistest.Require(t)
	addr := redistest.Server(t).Addr
	path := nodetest.PolicyFile(t, resiliencePolicies)
	start := func(r node.Resilience) (*node.Node, error) {
		return node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", Redis: []string{addr}, PoliciesPath: path, Resilience: r})
	}
	ms := time.Millisecond
	for _, c := range []struct{ timeout, margin, call time.Duration }{
		{region.DefaultTimeout, 0, 4 * ms},     // the flags' defaults
		{region.DefaultTimeout, -1, 5 * ms},    // no margin
		{10 * ms, 3 * ms, 7 * ms},              // explicit
		{2 * ms, 0, 1600 * time.Microsecond},   // budget/5 below 1 ms
		{0, 0, region.DefaultReadTimeout - ms}, // embedded: 1 s budget
	} {
		n, err := start(node.Resilience{RedisTimeout: c.timeout, RedisTimeoutMargin: c.margin})
		require.NoError(t, err, "timeout %v margin %v", c.timeout, c.margin)
		assert.Equal(t, c.call, n.Store().Timeout(), "timeout %v margin %v", c.timeout, c.margin)
		require.NoError(t, n.Close(5*time.Second))
	}
	_, err := start(node.Resilience{RedisTimeout: 5 * ms, RedisTimeoutMargin: 5 * ms})
	require.ErrorContains(t, err, "margin")
}
