package node_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// A rolling restart behind a client that follows /readyz and retries on
// another node: with a drain period the client has moved to B before A's
// listeners close, so it never meets UNAVAILABLE from A. Before, A closed
// in the instant it went unready.
func TestDrainPeriodKeepsServingWhileNotReady(t *testing.T) {
	start := func(drain time.Duration) (*node.Node, ratelimitv1.RateLimiterServiceClient) {
		n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PoliciesPath: nodetest.PolicyFile(t, testPolicies), DrainPeriod: drain})
		require.NoError(t, err)
		conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return n, ratelimitv1.NewRateLimiterServiceClient(conn)
	}
	a, ca := start(time.Second)
	b, cb := start(0)
	t.Cleanup(func() { assert.NoError(t, b.Close(5*time.Second)) })

	readyz := "http://" + a.HTTPAddr() + "/readyz" // read before Close runs
	var aUnready atomic.Bool                       // what the client's readiness probe last saw
	probeDone := make(chan struct{})
	stopProbe := make(chan struct{})
	go func() {
		defer close(probeDone)
		for {
			select {
			case <-stopProbe:
				return
			case <-time.After(20 * time.Millisecond): // the client's probe interval
			}
			resp, err := http.Get(readyz)
			if err != nil || resp.StatusCode != http.StatusOK {
				aUnready.Store(true)
			}
			if err == nil {
				resp.Body.Close()
			}
		}
	}()
	closed := make(chan error, 1)
	go func() { closed <- a.Close(5 * time.Second) }()

	var unavailable, servedByA, servedByB, sawDrain int
	for done := false; !done; {
		select {
		case err := <-closed:
			require.NoError(t, err)
			done = true
			continue
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req := &ratelimitv1.RateLimitRequest{TenantId: "t"}
		if !aUnready.Load() {
			_, err := ca.CheckRateLimit(ctx, req)
			switch status.Code(err) {
			case codes.OK:
				servedByA++
			case codes.Unavailable:
				unavailable++
				_, err = cb.CheckRateLimit(ctx, req) // retry on another node
				require.NoError(t, err)
			default:
				require.NoError(t, err)
			}
		} else {
			_, err := cb.CheckRateLimit(ctx, req)
			require.NoError(t, err)
			servedByB++
			// While A drains, it still answers (not ready, but serving).
			if sawDrain == 0 {
				if _, err := ca.CheckRateLimit(ctx, req); err == nil {
					sawDrain++
				}
			}
		}
		cancel()
	}
	close(stopProbe)
	<-probeDone
	assert.Zero(t, unavailable, "the client met UNAVAILABLE from A")
	assert.Equal(t, 1, sawDrain, "A served while it was not ready")
	assert.Positive(t, servedByB)
	t.Logf("A served %d, B %d, UNAVAILABLE %d", servedByA, servedByB, unavailable)
}

// Shutdown's ctx cuts the drain short: the node stops at once, listeners
// closed, without an error (allot-node's second Ctrl-C).
func TestShutdownCutShortByContext(t *testing.T) {
	const drain = 30 * time.Second
	n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PoliciesPath: nodetest.PolicyFile(t, testPolicies)})
	require.NoError(t, err)
	readyz := "http://" + n.HTTPAddr() + "/readyz"
	ctx, cut := context.WithCancel(context.Background())
	closed := make(chan error, 1)
	go func() { closed <- n.Shutdown(ctx, drain, 10*time.Second) }()
	require.Eventually(t, func() bool {
		resp, err := http.Get(readyz)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, 10*time.Second, 10*time.Millisecond, "unready, still serving, while it drains")
	cut()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(drain / 2):
		t.Fatal("Shutdown sat out its drain after ctx ended")
	}
	_, err = http.Get(readyz)
	assert.Error(t, err, "the HTTP listener is closed")
}

// A node is loopback-only when every listener is bound to loopback; one
// on every interface (0.0.0.0, ::, an empty host) is not.
func TestLoopbackOnly(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:1": true, "127.1.2.3:1": true, "localhost:1": true, "[::1]:1": true, "[::ffff:127.0.0.1]:1": true,
		"0.0.0.0:1": false, "[::]:1": false, ":1": false, "10.0.0.1:1": false, "": false, "localhost": false,
	} {
		assert.Equal(t, want, node.IsLoopbackAddr(addr), addr)
	}
	start := func(grpcAddr, httpAddr string) *node.Node {
		n, err := node.Start(context.Background(), node.Config{GRPCAddr: grpcAddr, HTTPAddr: httpAddr, PoliciesPath: nodetest.PolicyFile(t, testPolicies)})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, n.Close(time.Second)) })
		return n
	}
	assert.True(t, start("127.0.0.1:0", "localhost:0").LoopbackOnly())
	assert.False(t, start("127.0.0.1:0", "0.0.0.0:0").LoopbackOnly(), "HTTP on every interface")
	assert.False(t, start(":0", "").LoopbackOnly(), "gRPC on every interface")
}
