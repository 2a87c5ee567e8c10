package node_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/internal/node"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// httpBenchClients is the fixed number of client goroutines of both
// benchmarks, so gRPC and HTTP see the same load.
const httpBenchClients = 16

const httpBenchPolicies = `
policies:
  - id: per-tenant
    match: {}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000000000, period: 1s}
`

func startHTTPBenchNode(b *testing.B) *node.Node {
	b.Helper()
	path := filepath.Join(b.TempDir(), "p.yaml")
	require.NoError(b, os.WriteFile(path, []byte(httpBenchPolicies), 0o600))
	n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PoliciesPath: path})
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, n.Close(5*time.Second)) })
	return n
}

// runClients runs b.N checks over httpBenchClients goroutines, each client c
// calling check(c) and recording each call's latency, then reports
// throughput and latency percentiles taken from every recorded sample.
func runHTTPBenchClients(b *testing.B, check func(client int) error) {
	per := make([][]time.Duration, httpBenchClients)
	errs := make([]error, httpBenchClients)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for c := range httpBenchClients {
		n := b.N / httpBenchClients
		if c < b.N%httpBenchClients {
			n++
		}
		wg.Go(func() {
			lat := make([]time.Duration, 0, n)
			for range n {
				t0 := time.Now()
				if err := check(c); err != nil {
					errs[c] = err
					return
				}
				lat = append(lat, time.Since(t0))
			}
			per[c] = lat
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	for _, err := range errs {
		require.NoError(b, err)
	}
	all := slices.Concat(per...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds())
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "checks/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(pct(0.999), "p99.9-µs")
}

// BenchmarkCheckGRPC: CheckRateLimit over a real gRPC connection to an
// in-process standalone node.
func BenchmarkCheckGRPC(b *testing.B) {
	benchGRPCChecks(b, startHTTPBenchNode(b).Addr())
}

// benchGRPCChecks runs httpBenchClients clients of CheckRateLimit against
// the node at addr, each with its own tenant.
func benchGRPCChecks(b *testing.B, addr string) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
}

// BenchmarkCheckHTTP: POST /v1/check over keep-alive HTTP/1.1
// connections to the same kind of node, same load.
func BenchmarkCheckHTTP(b *testing.B) {
	n := startHTTPBenchNode(b)
	url := "http://" + n.HTTPAddr() + "/v1/check"
	tr := &http.Transport{MaxIdleConnsPerHost: httpBenchClients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	bodies := make([][]byte, httpBenchClients)
	for c := range bodies {
		bodies[c] = fmt.Appendf(nil, `{"tenant_id":"org_%d","client_identifier":"usr_1","route":"/v1/orders","method":"GET"}`, c)
	}
	runHTTPBenchClients(b, func(c int) error {
		resp, err := hc.Post(url, "application/json", bytes.NewReader(bodies[c]))
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		return err
	})
}
