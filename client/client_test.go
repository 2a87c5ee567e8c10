package client_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/server"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

const policies = `
policies:
  - id: per-client
    match: {tenant: small}
    per: [client]
    limits:
      - {name: per_minute, algorithm: token_bucket, limit: 2, period: 1m}
  - id: per-tenant
    match: {tenant: big}
    per: [tenant, client]
    limits:
      - {name: per_minute, algorithm: token_bucket, limit: 100000, period: 8760h} # refills 1 token in ~5 min: remaining is exact in a test
`

// patient bounds calls that expect the node's answer on a loaded machine.
const patient = 30 * time.Second

// startNode runs a standalone node (no Redis) on a free port.
func startNode(t testing.TB) *node.Node { return startNodeWith(t, policies) }

// startNodeWith starts a node enforcing the policy file text pols, on the
// Redis instances redis (none: standalone).
func startNodeWith(t testing.TB, pols string, redis ...string) *node.Node {
	t.Helper()
	n, _ := nodetest.Start(t, pols, node.Config{Redis: redis})
	return n
}

// rpcs counts the RPCs a client sends, by method and by node.
type rpcs struct {
	mu      sync.Mutex
	methods map[string]int
	peers   map[string]int
	sizes   []int                                             // checks per batch call
	hook    func(ctx context.Context, method string, req any) // runs before the call
}

func (r *rpcs) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r.hook != nil {
		r.hook(ctx, method, req)
	}
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.methods == nil {
		r.methods, r.peers = map[string]int{}, map[string]int{}
	}
	r.methods[method]++
	if p.Addr != nil {
		r.peers[p.Addr.String()]++
	}
	if b, ok := req.(*ratelimitv1.BatchRateLimitRequest); ok {
		r.sizes = append(r.sizes, len(b.Requests))
	}
	return err
}

func (r *rpcs) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.methods {
		n += v
	}
	return n
}

func (r *rpcs) peer(addr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peers[addr]
}

func newClient(t testing.TB, addrs []string, r *rpcs, opts ...client.Option) *client.Client {
	t.Helper()
	opts = append([]client.Option{client.WithDialOptions(grpc.WithUnaryInterceptor(r.interceptor))}, opts...)
	c, err := client.New(addrs, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Close()) })
	return c
}

func TestMaxBatchIsTheServers(t *testing.T) {
	assert.Equal(t, server.MaxBatch, client.MaxBatch)
}

// N concurrent Checks are answered by 2 RPCs: the first goes alone (and
// is held at the interceptor until the others have queued), the other N-1
// fill one batch. Each caller gets the answer to its own request: costs
// differ, so remaining tells them apart.
func TestCheckCoalescesConcurrentCalls(t *testing.T) {
	const n = 40
	nd := startNode(t)
	gate := make(chan struct{})
	var once sync.Once
	r := &rpcs{hook: func(ctx context.Context, method string, _ any) {
		switch method {
		case ratelimitv1.RateLimiterService_CheckRateLimitBatch_FullMethodName:
			once.Do(func() { close(gate) })
		case ratelimitv1.RateLimiterService_CheckRateLimit_FullMethodName:
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
	}}
	// A max delay far past the test: only a full batch flushes.
	c := newClient(t, []string{nd.Addr()}, r, client.WithMaxBatch(n-1), client.WithMaxDelay(time.Hour))
	var wg sync.WaitGroup
	got := make([]*ratelimitv1.RateLimitResponse, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), patient)
			defer cancel()
			got[i], errs[i] = c.Check(ctx, &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: fmt.Sprintf("c%d", i), TokenCost: int32(i + 1)})
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], i)
		assert.Equal(t, ratelimitv1.RateLimitResponse_ALLOWED, got[i].Decision, i)
		assert.Equal(t, int64(100000-(i+1)), got[i].Remaining, "caller %d got another caller's answer", i)
	}
	assert.Less(t, r.total(), n)
	assert.Equal(t, 2, r.total())
	assert.Equal(t, []int{n - 1}, r.sizes)
}

// Without anything in flight a Check goes at once, as a unary call, even
// with a max delay that would otherwise hold it.
func TestCheckAloneDoesNotWait(t *testing.T) {
	nd := startNode(t)
	r := &rpcs{}
	c := newClient(t, []string{nd.Addr()}, r, client.WithMaxDelay(time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), patient)
	defer cancel()
	for i := range 3 {
		resp, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: "alone"})
		require.NoError(t, err)
		assert.Equal(t, int64(100000-(i+1)), resp.Remaining)
	}
	assert.Equal(t, map[string]int{ratelimitv1.RateLimiterService_CheckRateLimit_FullMethodName: 3}, r.methods)
}

// A throttled key costs no RPC until its retry time (an injected clock);
// other keys are not affected.
func TestDenyCacheSkipsRPCUntilRetryTime(t *testing.T) {
	nd := startNode(t)
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	r := &rpcs{}
	c := newClient(t, []string{nd.Addr()}, r, client.WithClock(clock))
	ctx, cancel := context.WithTimeout(context.Background(), patient)
	defer cancel()
	key := &ratelimitv1.RateLimitRequest{TenantId: "small", ClientIdentifier: "hot", Route: "/x"}
	check := func(req *ratelimitv1.RateLimitRequest) *ratelimitv1.RateLimitResponse {
		resp, err := c.Check(ctx, req)
		require.NoError(t, err)
		return resp
	}
	check(key)
	check(key)
	resp := check(key) // limit 2/min: the third is throttled
	require.Equal(t, ratelimitv1.RateLimitResponse_THROTTLED, resp.Decision)
	retry := time.Duration(resp.RetryAfterMs) * time.Millisecond // 30s less the refill since the first take
	require.InDelta(t, 30*time.Second, retry, float64(5*time.Second))
	require.Equal(t, 3, r.total())

	now.Add(int64(10 * time.Second))
	resp = check(key)
	assert.Equal(t, ratelimitv1.RateLimitResponse_THROTTLED, resp.Decision)
	assert.Equal(t, (retry - 10*time.Second).Milliseconds(), resp.RetryAfterMs, "the retry time counts down")
	assert.Equal(t, int64((retry-10*time.Second+time.Second-1)/time.Second), resp.ResetAfterSeconds)
	assert.Equal(t, "per-client", resp.PolicyId)
	assert.Equal(t, 3, r.total(), "a throttled key costs no RPC")
	// CheckBatch uses the cache too.
	out, err := c.CheckBatch(ctx, []*ratelimitv1.RateLimitRequest{key})
	require.NoError(t, err)
	assert.Equal(t, ratelimitv1.RateLimitResponse_THROTTLED, out[0].Decision)
	assert.Equal(t, 3, r.total())

	// Another key, or the same client on another route, asks the node.
	check(&ratelimitv1.RateLimitRequest{TenantId: "small", ClientIdentifier: "cold", Route: "/x"})
	check(&ratelimitv1.RateLimitRequest{TenantId: "small", ClientIdentifier: "hot", Route: "/y"})
	assert.Equal(t, 5, r.total())

	now.Add(int64(retry - 10*time.Second - time.Millisecond))
	check(key)
	assert.Equal(t, 5, r.total(), "1ms before the retry time")
	now.Add(int64(time.Millisecond))
	check(key) // the node's own clock has not moved: still throttled, but asked
	assert.Equal(t, 6, r.total(), "at the retry time the node is asked again")
}

// With no node reachable: the default returns the error; FailOpen and
// FailClosed answer locally, marked as such, never ALLOWED.
func TestUnreachableNode(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close()) // nothing listens there now
	c := newClient(t, []string{addr}, &rpcs{})
	ctx, cancel := context.WithTimeout(context.Background(), patient)
	defer cancel()
	req := &ratelimitv1.RateLimitRequest{ClientIdentifier: "u"}

	_, err = c.Check(ctx, req)
	assert.Equal(t, codes.Unavailable, status.Code(err), err)

	open, err := c.Check(ctx, req, client.OnUnreachable(client.FailOpen))
	require.NoError(t, err)
	assert.Equal(t, ratelimitv1.RateLimitResponse_FAILED_OPEN, open.Decision)
	assert.True(t, open.Degraded)
	assert.True(t, client.Local(open))

	closed, err := c.Check(ctx, req, client.OnUnreachable(client.FailClosed))
	require.NoError(t, err)
	assert.Equal(t, ratelimitv1.RateLimitResponse_THROTTLED, closed.Decision)
	assert.True(t, closed.Degraded)
	assert.True(t, client.Local(closed))

	out, err := c.CheckBatch(ctx, []*ratelimitv1.RateLimitRequest{req, req}, client.OnUnreachable(client.FailOpen))
	require.NoError(t, err)
	for _, r := range out {
		assert.Equal(t, ratelimitv1.RateLimitResponse_FAILED_OPEN, r.Decision)
		assert.True(t, client.Local(r))
	}
	_, err = c.CheckBatch(ctx, []*ratelimitv1.RateLimitRequest{req})
	assert.Equal(t, codes.Unavailable, status.Code(err))

	// A deadline the node cannot meet counts as unreachable too.
	short, cancelShort := context.WithTimeout(ctx, time.Nanosecond)
	defer cancelShort()
	<-short.Done()
	open, err = c.Check(short, req, client.OnUnreachable(client.FailOpen))
	require.NoError(t, err)
	assert.Equal(t, ratelimitv1.RateLimitResponse_FAILED_OPEN, open.Decision)
}

// Bad input is an error whatever the failure mode, and in a coalesced
// batch it fails only its own caller.
func TestInvalidArgumentIsNotFailedOpen(t *testing.T) {
	nd := startNode(t)
	c := newClient(t, []string{nd.Addr()}, &rpcs{})
	ctx, cancel := context.WithTimeout(context.Background(), patient)
	defer cancel()
	bad := &ratelimitv1.RateLimitRequest{TenantId: string(make([]byte, 300)), ClientIdentifier: "b"}
	_, err := c.Check(ctx, bad, client.OnUnreachable(client.FailOpen))
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	_, err = c.Check(ctx, nil)
	assert.Equal(t, codes.InvalidArgument, status.Code(err))

	// Coalesced with good checks (held first call, full batch of 3), the
	// bad one fails alone.
	gate, started := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r := &rpcs{hook: func(ctx context.Context, method string, _ any) {
		if method == ratelimitv1.RateLimiterService_CheckRateLimitBatch_FullMethodName {
			once.Do(func() { close(gate) })
		} else if r, ok := ctx.Value(holdKey{}).(bool); ok && r {
			close(started)
			<-gate
		}
	}}
	c = newClient(t, []string{nd.Addr()}, r, client.WithMaxBatch(3), client.WithMaxDelay(time.Hour))
	reqs := []*ratelimitv1.RateLimitRequest{bad, {TenantId: "big", ClientIdentifier: "g1"}, {TenantId: "big", ClientIdentifier: "g2"}}
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	held := make(chan struct{})
	wg.Go(func() { // the first call, in flight until the batch goes
		defer close(held)
		_, err := c.Check(context.WithValue(ctx, holdKey{}, true), &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: "first"})
		assert.NoError(t, err)
	})
	<-started
	for i, req := range reqs {
		wg.Go(func() { _, errs[i] = c.Check(ctx, req) })
	}
	wg.Wait()
	<-held
	assert.Equal(t, codes.InvalidArgument, status.Code(errs[0]), errs[0])
	assert.NoError(t, errs[1])
	assert.NoError(t, errs[2])
	assert.Equal(t, []int{3}, r.sizes, "the three went as one batch first")
}

type holdKey struct{}

// Calls alternate over two serving nodes.
func TestRoundRobinOverTwoNodes(t *testing.T) {
	a, b := startNode(t), startNode(t)
	r := &rpcs{}
	c := newClient(t, []string{a.Addr(), b.Addr()}, r)
	ctx, cancel := context.WithTimeout(context.Background(), patient)
	defer cancel()
	check := func() {
		_, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: "rr"})
		require.NoError(t, err)
	}
	// Until both connections are ready the balancer may use one.
	for r.peer(a.Addr()) == 0 || r.peer(b.Addr()) == 0 {
		require.NoError(t, ctx.Err(), "both nodes never served")
		check()
	}
	beforeA, beforeB := r.peer(a.Addr()), r.peer(b.Addr())
	for range 10 {
		check()
	}
	assert.Equal(t, 5, r.peer(a.Addr())-beforeA)
	assert.Equal(t, 5, r.peer(b.Addr())-beforeB)
}

// stub is a node that answers every check with err, and reports health st.
type stub struct {
	ratelimitv1.UnimplementedRateLimiterServiceServer
	err   error
	calls atomic.Int64
}

func (s *stub) CheckRateLimit(context.Context, *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
	s.calls.Add(1)
	return nil, s.err
}

func startStub(t *testing.T, err error, st healthpb.HealthCheckResponse_ServingStatus) (*stub, string) {
	t.Helper()
	lis, lerr := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, lerr)
	s := &stub{err: err}
	srv := grpc.NewServer()
	ratelimitv1.RegisterRateLimiterServiceServer(srv, s)
	h := health.NewServer()
	h.SetServingStatus(ratelimitv1.RateLimiterService_ServiceDesc.ServiceName, st)
	healthpb.RegisterHealthServer(srv, h)
	go func() { _ = srv.Serve(lis) }() // ends with Stop
	t.Cleanup(srv.Stop)
	return s, lis.Addr().String()
}

// A node whose health says NOT_SERVING gets no checks.
func TestSkipsNotServingNode(t *testing.T) {
	nd := startNode(t)
	s, addr := startStub(t, status.Error(codes.Internal, "must not be asked"), healthpb.HealthCheckResponse_NOT_SERVING)
	r := &rpcs{}
	c := newClient(t, []string{addr, nd.Addr()}, r)
	ctx, cancel := context.WithTimeout(context.Background(), patient)
	defer cancel()
	for range 20 {
		_, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: "h"})
		require.NoError(t, err)
	}
	assert.Zero(t, s.calls.Load())
	assert.Equal(t, 20, r.peer(nd.Addr()))
}

// A node that sheds ("node overloaded", UNAVAILABLE) costs a retry on the
// other node, not an error.
func TestOverloadedNodeIsRetriedElsewhere(t *testing.T) {
	nd := startNode(t)
	s, addr := startStub(t, status.Error(codes.Unavailable, "allot: node overloaded, request shed"), healthpb.HealthCheckResponse_SERVING)
	r := &rpcs{}
	c := newClient(t, []string{addr, nd.Addr()}, r)
	ctx, cancel := context.WithTimeout(context.Background(), patient)
	defer cancel()
	// Until both connections are ready the balancer has only one node to
	// retry on.
	for r.peer(nd.Addr()) == 0 {
		require.NoError(t, ctx.Err(), "the node never served")
		_, _ = c.Check(ctx, &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: "o"})
	}
	s.calls.Store(0)
	for range 20 {
		resp, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: "o"})
		require.NoError(t, err)
		assert.Equal(t, ratelimitv1.RateLimitResponse_ALLOWED, resp.Decision)
	}
	assert.Positive(t, s.calls.Load(), "the overloaded node was never picked: the test proves nothing")
}

func TestCheckBatch(t *testing.T) {
	nd := startNode(t)
	r := &rpcs{}
	c := newClient(t, []string{nd.Addr()}, r)
	ctx, cancel := context.WithTimeout(context.Background(), patient)
	defer cancel()
	reqs := make([]*ratelimitv1.RateLimitRequest, client.MaxBatch+5)
	for i := range reqs {
		reqs[i] = &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: fmt.Sprintf("b%d", i), TokenCost: int32(i%7 + 1)}
	}
	out, err := c.CheckBatch(ctx, reqs)
	require.NoError(t, err)
	require.Len(t, out, len(reqs))
	for i, resp := range out {
		assert.Equal(t, int64(100000-(i%7+1)), resp.Remaining, i)
	}
	assert.Equal(t, []int{client.MaxBatch, 5}, r.sizes)
}

func TestClosedClient(t *testing.T) {
	c, err := client.New([]string{"127.0.0.1:1"})
	require.NoError(t, err)
	require.NoError(t, c.Close())
	_, err = c.Check(context.Background(), &ratelimitv1.RateLimitRequest{})
	assert.ErrorIs(t, err, client.ErrClosed)
	_, err = client.New(nil)
	assert.Error(t, err)
	_, err = client.New([]string{"no-port"})
	assert.Error(t, err)
}
