package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/node"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/telemetry"
)

// BenchmarkCheckGRPCTelemetry is BenchmarkCheckGRPC's load against nodes
// without telemetry, with metrics only (the default of cmd/node without
// --otlp-endpoint), and with metrics and a span per check (exported to a
// no-op exporter, so the figure is the instrumentation's cost, not a
// collector's).
func BenchmarkCheckGRPCTelemetry(b *testing.B) {
	for _, mode := range []string{"off", "metrics", "metrics+traces"} {
		b.Run(mode, func(b *testing.B) {
			var tel *telemetry.Telemetry
			if mode != "off" {
				cfg := telemetry.Config{}
				if mode == "metrics+traces" {
					cfg.SpanExporter = tracetest.NewNoopExporter()
				}
				var err error
				tel, err = telemetry.New(context.Background(), cfg)
				require.NoError(b, err)
				b.Cleanup(func() { require.NoError(b, tel.Shutdown(context.Background())) })
			}
			path := filepath.Join(b.TempDir(), "p.yaml")
			require.NoError(b, os.WriteFile(path, []byte(httpBenchPolicies), 0o600))
			n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PoliciesPath: path, Telemetry: tel})
			require.NoError(b, err)
			b.Cleanup(func() { require.NoError(b, n.Close(5*time.Second)) })
			conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			require.NoError(b, err)
			defer conn.Close()
			client := ratelimitv1.NewRateLimiterServiceClient(conn)
			reqs := make([]*ratelimitv1.RateLimitRequest, httpBenchClients)
			for c := range reqs {
				reqs[c] = &ratelimitv1.RateLimitRequest{TenantId: fmt.Sprintf("org_%d", c), ClientIdentifier: "usr_1", Route: "/v1/orders", Method: "GET"}
			}
			runHTTPBenchClients(b, func(c int) error {
				resp, err := client.CheckRateLimit(context.Background(), reqs[c])
				if err == nil && resp.GetDecision() != ratelimitv1.RateLimitResponse_ALLOWED {
					err = fmt.Errorf("decision %v", resp.GetDecision())
				}
				return err
			})
		})
	}
}
