package node_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/telemetry"
)

// BenchmarkCheckGRPCTelemetry is BenchmarkCheckGRPC's load against nodes
// without telemetry, with metrics only (the default of cmd/node without
// OTEL_EXPORTER_OTLP_ENDPOINT), and with metrics and a span per check
// (exported to a no-op exporter, so the figure is the instrumentation's
// cost, not a collector's).
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
			benchGRPCChecks(b, n.Addr())
		})
	}
}
