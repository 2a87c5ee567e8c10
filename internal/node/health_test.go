package node_test

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
)

// Every service served has a health entry (the Envoy RLS was NotFound),
// and an open Watch stream does not hold Close for the shutdown timeout.
func TestHealthCoversEveryServiceAndWatchDoesNotHoldShutdown(t *testing.T) {
	n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", PoliciesPath: nodetest.PolicyFile(t, testPolicies)})
	require.NoError(t, err)
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx := context.Background()
	r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, r.Status)

	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	first, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, first.Status)

	const timeout = time.Minute
	closed := make(chan error, 1)
	go func() { closed <- n.Close(timeout) }()
	// The watcher is told, then its stream ends.
	for {
		r, err := w.Recv()
		if err != nil {
			break
		}
		assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, r.Status)
	}
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(timeout / 2):
		t.Fatal("an open Watch stream held Close")
	}
}
