package node_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/telemetry"
	"github.com/allot-dev/allot/internal/testenv/promtext"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

const telemetryPolicies = `
policies:
  - id: five-per-tenant
    match: {route: "/m/*"}
    per: [tenant]
    limits:
      - {name: per_minute, algorithm: token_bucket, limit: 5, period: 1m}
    precision: exact
  - id: leased-wide
    match: {route: "/lease/*"}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000, period: 1s}
    precision: leased
`

// startTelemetryNode starts a node with telemetry (cfg's other fields
// taken as given) and returns it with a func that closes it once. Both
// close when the test ends, the node first.
func startTelemetryNode(t *testing.T, tcfg telemetry.Config, cfg node.Config) (*node.Node, func()) {
	t.Helper()
	tel, err := telemetry.New(context.Background(), tcfg)
	require.NoError(t, err)
	path := nodetest.PolicyFile(t, telemetryPolicies)
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.PoliciesPath, cfg.Telemetry = "127.0.0.1:0", "127.0.0.1:0", path, tel
	n, err := node.Start(context.Background(), cfg)
	require.NoError(t, err)
	closeNode := sync.OnceFunc(func() { assert.NoError(t, n.Close(5*time.Second)) })
	t.Cleanup(func() {
		closeNode()
		assert.NoError(t, tel.Shutdown(context.Background()))
	})
	return n, closeNode
}

func grpcClient(t *testing.T, addr string) ratelimitv1.RateLimiterServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return ratelimitv1.NewRateLimiterServiceClient(conn)
}

// oneConn is an HTTP client over a single keep-alive connection. The HTTP
// face records a check after writing its answer; on one connection the
// server reads the next request (the scrape) only after that handler
// returned, so a scrape sees every check answered before it, with no
// sleep.
func oneConn(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

func httpCheck(t *testing.T, c *http.Client, addr, body string) int {
	t.Helper()
	resp, err := c.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

// scrape GETs /metrics from addr over c and parses it (promtext).
func scrape(t *testing.T, c *http.Client, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	return promtext.Scrape(t, c, "http://"+addr+"/metrics")
}

// sample returns the value (promtext.Value) of the first of fams[name]'s
// series that has labels (others may have more), and whether one exists.
func sample(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
next:
	for _, m := range fams[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		if v, ok := promtext.Value(m); ok {
			return v, true
		}
	}
	return 0, false
}

func mustSample(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := sample(fams, name, labels)
	require.True(t, ok, "no series %s%v", name, labels)
	return v
}

// /metrics on the HTTP listener counts every gRPC and HTTP check by
// policy and outcome, and times them by face.
func TestMetricsCountChecksByPolicyAndOutcome(t *testing.T) {
	n, _ := startTelemetryNode(t, telemetry.Config{}, node.Config{})
	require.Equal(t, n.HTTPAddr(), n.MetricsAddr())
	rl := grpcClient(t, n.Addr())
	ctx := context.Background()
	// 8 gRPC checks on a limit of 5: 5 allowed, 3 throttled.
	for i := range 8 {
		resp, err := rl.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "g", Route: "/m/x"})
		require.NoError(t, err)
		want := ratelimitv1.RateLimitResponse_ALLOWED
		if i >= 5 {
			want = ratelimitv1.RateLimitResponse_THROTTLED
		}
		require.Equal(t, want, resp.GetDecision(), "check %d", i)
	}
	// One invalid check: no identity.
	_, err := rl.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{Route: "/m/x"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	// 7 HTTP checks of another tenant: 5 allowed, 2 throttled.
	hc := oneConn(t)
	for i := range 7 {
		want := http.StatusOK
		if i >= 5 {
			want = http.StatusTooManyRequests
		}
		require.Equal(t, want, httpCheck(t, hc, n.HTTPAddr(), `{"tenant_id":"h","route":"/m/x"}`), "check %d", i)
	}
	// No policy matches this route: allowed under policy "none".
	require.Equal(t, http.StatusOK, httpCheck(t, hc, n.HTTPAddr(), `{"tenant_id":"h","route":"/other"}`))

	fams := scrape(t, hc, n.HTTPAddr())
	for name := range fams {
		assert.True(t, strings.HasPrefix(name, "allot_") || name == "target_info", "metric %s does not start with allot_", name)
	}
	assert.Equal(t, 10.0, mustSample(t, fams, "allot_decisions_total", map[string]string{"policy": "five-per-tenant", "outcome": "allowed"}))
	assert.Equal(t, 5.0, mustSample(t, fams, "allot_decisions_total", map[string]string{"policy": "five-per-tenant", "outcome": "throttled"}))
	assert.Equal(t, 1.0, mustSample(t, fams, "allot_decisions_total", map[string]string{"policy": "none", "outcome": "allowed"}))
	assert.Equal(t, 1.0, mustSample(t, fams, "allot_decisions_total", map[string]string{"policy": "none", "outcome": "error"}))
	assert.Equal(t, 9.0, mustSample(t, fams, "allot_decision_duration_seconds", map[string]string{"face": "grpc"}))
	assert.Equal(t, 8.0, mustSample(t, fams, "allot_decision_duration_seconds", map[string]string{"face": "http"}))
	assert.Equal(t, dto.MetricType_HISTOGRAM, fams["allot_decision_duration_seconds"].GetType())
	// Standalone: no Redis, so no Redis or lease series.
	assert.NotContains(t, fams, "allot_redis_calls_total")
}

// Series do not grow with callers: 100 more tenants add no series, and no
// label value is a tenant.
func TestMetricsLabelsDoNotGrowWithKeys(t *testing.T) {
	n, _ := startTelemetryNode(t, telemetry.Config{}, node.Config{MetricsAddr: "127.0.0.1:0"})
	require.NotEqual(t, n.HTTPAddr(), n.MetricsAddr())
	rl := grpcClient(t, n.Addr())
	hc := oneConn(t)
	send := func(from, to int) {
		for i := from; i < to; i++ {
			tenant := fmt.Sprintf("tenant-%03d", i)
			for range 6 { // past the limit: both outcomes for every tenant
				_, err := rl.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: tenant, ClientIdentifier: "c-" + tenant, Route: "/m/" + tenant})
				require.NoError(t, err)
			}
		}
	}
	series := func(fams map[string]*dto.MetricFamily) int {
		total := 0
		for _, f := range fams {
			total += len(f.GetMetric())
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					assert.NotContains(t, l.GetValue(), "tenant-", "label %s of %s carries a key", l.GetName(), f.GetName())
				}
			}
		}
		return total
	}
	send(0, 3)
	before := series(scrape(t, hc, n.MetricsAddr()))
	send(3, 103)
	fams := scrape(t, hc, n.MetricsAddr())
	assert.Equal(t, before, series(fams), "series grew with tenants")
	assert.Equal(t, 103.0*5, mustSample(t, fams, "allot_decisions_total", map[string]string{"outcome": "allowed"}))
	assert.Equal(t, 103.0, mustSample(t, fams, "allot_decisions_total", map[string]string{"outcome": "throttled"}))
	// The HTTP listener does not serve /metrics when it has its own.
	resp, err := hc.Get("http://" + n.HTTPAddr() + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// With an exporter configured, every gRPC and HTTP check is a server span;
// health probes and scrapes are not.
func TestTracesSpanPerCheck(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	n, closeNode := startTelemetryNode(t, telemetry.Config{SpanExporter: exp}, node.Config{})
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	rl := ratelimitv1.NewRateLimiterServiceClient(conn)
	for range 3 {
		_, err := rl.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: "t", Route: "/m/x"})
		require.NoError(t, err)
	}
	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	hc := oneConn(t)
	for range 2 {
		httpCheck(t, hc, n.HTTPAddr(), `{"tenant_id":"u","route":"/m/x"}`)
	}
	scrape(t, hc, n.HTTPAddr())
	// Close waits for every handler, and spans end inside them: after it
	// the synchronous exporter holds them all.
	closeNode()

	var grpcSpans, httpSpans int
	for _, s := range exp.GetSpans() {
		require.Equal(t, trace.SpanKindServer, s.SpanKind, s.Name)
		switch s.Name {
		case ratelimitv1.RateLimiterService_ServiceDesc.ServiceName + "/CheckRateLimit":
			grpcSpans++
		case "POST /v1/check":
			httpSpans++
		default:
			t.Errorf("unexpected span %q", s.Name)
		}
	}
	assert.Equal(t, 3, grpcSpans)
	assert.Equal(t, 2, httpSpans)
}

// With Redis: exact checks are Redis takes, leased checks refill leases,
// and the shard's breaker is reported closed.
func TestMetricsRedisLeasesAndBreakers(t *testing.T) {
	srv := redistest.Server(t)
	n, _ := startTelemetryNode(t, telemetry.Config{}, node.Config{Redis: []string{srv.Addr}, Lease: lease.Config{ColdHits: 4}})
	rl := grpcClient(t, n.Addr())
	for range 4 {
		_, err := rl.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: "r", Route: "/m/x"})
		require.NoError(t, err)
	}
	for range 6 {
		resp, err := rl.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: "l", Route: "/lease/x"})
		require.NoError(t, err)
		require.Equal(t, ratelimitv1.RateLimitResponse_ALLOWED, resp.GetDecision())
	}
	fams := scrape(t, oneConn(t), n.HTTPAddr())
	// 4 exact checks, and the first three checks of the cold leased key,
	// which are decided exactly (lease.Options.ColdExact, ColdHits 4).
	assert.Equal(t, 7.0, mustSample(t, fams, "allot_redis_calls_total", map[string]string{"op": "take", "result": "ok"}))
	assert.Equal(t, 7.0, mustSample(t, fams, "allot_redis_call_duration_seconds", map[string]string{"op": "take"}))
	// The fourth leased check waited for a refill; the others spent it.
	assert.GreaterOrEqual(t, mustSample(t, fams, "allot_redis_calls_total", map[string]string{"op": "lease", "result": "ok"}), 1.0)
	assert.GreaterOrEqual(t, mustSample(t, fams, "allot_lease_refills_total", nil), 1.0)
	assert.GreaterOrEqual(t, mustSample(t, fams, "allot_lease_tokens_granted_total", nil), 3.0)
	assert.Equal(t, 1.0, mustSample(t, fams, "allot_lease_keys", nil))
	assert.Equal(t, 0.0, mustSample(t, fams, "allot_breaker_state", map[string]string{"shard": srv.Addr}))
	assert.Equal(t, 4.0, mustSample(t, fams, "allot_decisions_total", map[string]string{"policy": "five-per-tenant", "outcome": "allowed"}))
	assert.Equal(t, 6.0, mustSample(t, fams, "allot_decisions_total", map[string]string{"policy": "leased-wide", "outcome": "allowed"}))
}
