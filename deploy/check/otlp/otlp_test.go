// Package otlp_test runs a real allot-node and allot-coordinator that
// export spans over OTLP/gRPC (OTEL_EXPORTER_OTLP_ENDPOINT) to the OpenTelemetry
// Collector's own OTLP receiver (otlpreceiver) in this process, and
// checks that the spans docs/http.md documents arrive with their names
// and attributes: a server span per gRPC and HTTP check, a W3C
// traceparent honoured, a redis.take client span under the check that
// made the Redis call, and a coord.round span per coordinator epoch.
package otlp_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/deploy/check/internal/tool"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

func TestMain(m *testing.M) { tool.Main(m) }

// receiver starts the Collector's OTLP receiver (gRPC only) on a free
// loopback port and returns its endpoint and the sink spans land in.
func receiver(t *testing.T) (string, *consumertest.TracesSink) {
	t.Helper()
	// The receiver does not report the port it bound, so take a free one.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())

	f := otlpreceiver.NewFactory()
	cfg := f.CreateDefaultConfig().(*otlpreceiver.Config)
	g := configgrpc.NewDefaultServerConfig()
	g.NetAddr.Endpoint = addr
	cfg.Protocols.GRPC = configoptional.Some(g)
	cfg.Protocols.HTTP = configoptional.None[otlpreceiver.HTTPConfig]()
	sink := new(consumertest.TracesSink)
	r, err := f.CreateTraces(context.Background(), receivertest.NewNopSettings(f.Type()), cfg, sink)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { assert.NoError(t, r.Shutdown(context.Background())) })
	return "http://" + addr, sink
}

// span is one received span, flattened.
type span struct {
	service, name string
	kind          ptrace.SpanKind
	trace         pcommon.TraceID
	id, parent    pcommon.SpanID
	attrs         map[string]string
	errorStatus   bool
	startEndNanos [2]uint64
}

func spans(sink *consumertest.TracesSink) []span {
	var out []span
	for _, td := range sink.AllTraces() {
		for _, rs := range td.ResourceSpans().All() {
			svc, _ := rs.Resource().Attributes().Get("service.name")
			for _, ss := range rs.ScopeSpans().All() {
				for _, s := range ss.Spans().All() {
					attrs := map[string]string{}
					for k, v := range s.Attributes().All() {
						attrs[k] = v.AsString()
					}
					out = append(out, span{
						service: svc.AsString(), name: s.Name(), kind: s.Kind(),
						trace: s.TraceID(), id: s.SpanID(), parent: s.ParentSpanID(), attrs: attrs,
						errorStatus:   s.Status().Code() == ptrace.StatusCodeError,
						startEndNanos: [2]uint64{uint64(s.StartTimestamp()), uint64(s.EndTimestamp())},
					})
				}
			}
		}
	}
	return out
}

// waitFor polls the sink until pred holds for the spans received
// (bounded: the exporters batch every 100 ms here).
func waitFor(t *testing.T, sink *consumertest.TracesSink, what string, pred func([]span) bool) []span {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := spans(sink)
		if pred(got) {
			return got
		}
		if time.Now().After(deadline) {
			var names []string
			for _, s := range got {
				names = append(names, s.service+"/"+s.name)
			}
			t.Fatalf("no %s among %d spans received in 30s: %v", what, len(got), names)
		}
		time.Sleep(50 * time.Millisecond) // poll interval, not synchronisation
	}
}

func named(ss []span, service, name string) []span {
	var out []span
	for _, s := range ss {
		if s.service == service && s.name == name {
			out = append(out, s)
		}
	}
	return out
}

const policies = `default_tier: free
# The coordinators' knobs (fast epochs for the test).
rebalance: {interval: 200ms, share_ttl: 1s}
policies:
  - id: exact-tenant
    match: {}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 100, period: 1s, burst: 100}
    precision: exact
    mode: enforce
`

func TestSpansReachACollector(t *testing.T) {
	endpoint, sink := receiver(t)
	bin := tool.Binaries(t)
	pf := filepath.Join(t.TempDir(), "policies.yaml")
	require.NoError(t, os.WriteFile(pf, []byte(policies), 0o600))
	rds := redistest.Server(t)
	nats := natstest.Server(t)

	node := tool.Start(t, filepath.Join(bin, "allot-node"), []string{"OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint}, []string{"http", "grpc"},
		"--store="+pf, "--redis="+rds.Addr, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--drain-period=0")
	tool.Start(t, filepath.Join(bin, "allot-coordinator"), []string{"OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint}, []string{"metrics"},
		"--store="+pf, "--redis="+rds.Addr, "--admin-addr=127.0.0.1:0", "--metrics-addr=127.0.0.1:0",
		"--region=us", "--regions=us,eu", "--nats="+nats, "--lock-ttl=300ms")

	// HTTP, with the caller's trace context: the node's span joins it.
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+node["http"]+"/v1/check",
		strings.NewReader(`{"tenant_id":"t1","client_identifier":"c1"}`))
	require.NoError(t, err)
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))

	// gRPC.
	conn, err := grpc.NewClient(node["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	_, err = ratelimitv1.NewRateLimiterServiceClient(conn).CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t2", ClientIdentifier: "c2"})
	require.NoError(t, err)

	const grpcSpan = "hispeeddesign.ratelimit.v1.RateLimiterService/CheckRateLimit"
	got := waitFor(t, sink, "check, Redis and coordinator spans", func(ss []span) bool {
		return len(named(ss, "allot-node", "POST /v1/check")) > 0 && len(named(ss, "allot-node", grpcSpan)) > 0 &&
			len(named(ss, "allot-node", "redis.take")) >= 2 && len(named(ss, "allot-coordinator", "coord.round")) > 0
	})

	httpCheck := named(got, "allot-node", "POST /v1/check")[0]
	assert.Equal(t, ptrace.SpanKindServer, httpCheck.kind)
	assert.Equal(t, traceID, httpCheck.trace.String(), "the caller's traceparent is honoured")
	assert.Equal(t, parentID, httpCheck.parent.String())
	assert.Equal(t, "POST", httpCheck.attrs["http.request.method"], httpCheck.attrs)

	grpcCheck := named(got, "allot-node", grpcSpan)[0]
	assert.Equal(t, ptrace.SpanKindServer, grpcCheck.kind)
	assert.Equal(t, "grpc", grpcCheck.attrs["rpc.system.name"], grpcCheck.attrs)
	assert.Equal(t, grpcSpan, grpcCheck.attrs["rpc.method"])

	// Each check's Redis call is a client span under the check's span, in
	// its trace and within its time: the trace crosses node and Redis.
	for _, check := range []span{httpCheck, grpcCheck} {
		i := slices.IndexFunc(named(got, "allot-node", "redis.take"), func(s span) bool { return s.parent == check.id })
		require.GreaterOrEqual(t, i, 0, "no redis.take span under %s", check.name)
		r := named(got, "allot-node", "redis.take")[i]
		assert.Equal(t, check.trace, r.trace)
		assert.Equal(t, ptrace.SpanKindClient, r.kind)
		assert.Equal(t, map[string]string{"db.system.name": "redis", "allot.redis.op": "take", "allot.redis.result": "ok"}, r.attrs)
		assert.False(t, r.errorStatus)
		assert.GreaterOrEqual(t, r.startEndNanos[0], check.startEndNanos[0], "the Redis call starts within the check")
		assert.LessOrEqual(t, r.startEndNanos[1], check.startEndNanos[1], "and ends within it")
	}

	round := named(got, "allot-coordinator", "coord.round")[0]
	for _, a := range []string{"allot.epoch", "allot.regions_heard", "allot.group", "allot.keys", "allot.keys_written", "allot.report_bytes"} {
		assert.Contains(t, round.attrs, a)
	}
	assert.Equal(t, "1", round.attrs["allot.regions_heard"], "eu runs no coordinator here")
}
