package server_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/memstore"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/policy"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// memDecider is a decider of the policy file text on an in-process store.
func memDecider(t *testing.T, policies string) *decide.Decider {
	t.Helper()
	set, err := policy.Load("t", []byte(policies))
	require.NoError(t, err)
	return decide.New(decide.Config{Store: memstore.New(nil), Policies: set})
}

// deadlineAt is a decider whose context "expires" at the n-th check: the
// deadline of a batch passing midway.
type deadlineAt struct {
	*decide.Decider
	n, calls int
}

// CheckAppend is the servers' way in (server.Checker).
func (c *deadlineAt) CheckAppend(ctx context.Context, r *decide.Request, buf []decide.Status) (decide.Decision, error) {
	c.calls++
	if c.calls == c.n {
		return decide.Decision{}, context.DeadlineExceeded
	}
	return c.Decider.CheckAppend(ctx, r, buf)
}

// A batch that hits its deadline midway answers only the error, and the
// checks it had decided are given back: it counts nothing. Before, the
// first checks stayed counted.
func TestBatchFailedMidwayCountsNothing(t *testing.T) {
	d := memDecider(t, `
policies:
  - {id: t, per: [tenant], limits: [{name: s, algorithm: token_bucket, limit: 10, period: 1h}]}
  - {id: w, per: [client], limits: [{name: s, algorithm: fixed_window, limit: 10, period: 1h}]}
`)
	s := server.NewGRPC(&deadlineAt{Decider: d, n: 4})
	var reqs []*ratelimitv1.RateLimitRequest
	for range 5 {
		reqs = append(reqs, &ratelimitv1.RateLimitRequest{TenantId: "a", ClientIdentifier: "c"})
	}
	_, err := s.CheckRateLimitBatch(context.Background(), &ratelimitv1.BatchRateLimitRequest{Requests: reqs})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)

	r := decide.Request{Tenant: "a", Client: "c"}
	require.NoError(t, decide.Validate(&r))
	dec, err := d.Check(context.Background(), &r)
	require.NoError(t, err)
	require.Len(t, dec.Statuses, 2)
	for _, st := range dec.Statuses {
		assert.Equal(t, int64(9), st.Remaining, "%s: only this check counted", st.PolicyID)
	}
}

// A batch's working arrays are reused by the next (GRPC keeps them in a
// pool): batches of different sizes, one of them invalid, from several
// goroutines at once, each answer as a batch of its own on a fresh
// service.
func TestBatchesShareNothing(t *testing.T) {
	s := server.NewGRPC(memDecider(t, `
policies:
  - {id: t, per: [tenant], limits: [{name: s, algorithm: token_bucket, limit: 1000000, period: 1h}]}
  - {id: c, per: [client], limits: [{name: s, algorithm: fixed_window, limit: 1000000, period: 1h}]}
`))
	batch := func(n int, client string) *ratelimitv1.BatchRateLimitRequest {
		in := &ratelimitv1.BatchRateLimitRequest{}
		for i := range n {
			r := &ratelimitv1.RateLimitRequest{TenantId: fmt.Sprint("t", i), ClientIdentifier: client}
			in.Requests = append(in.Requests, r)
		}
		return in
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				n := 1 + (g*7+i*13)%40
				if i%10 == 9 {
					bad := batch(n, "")
					bad.Requests[n-1].TenantId = ""
					_, err := s.CheckRateLimitBatch(context.Background(), bad)
					assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
					continue
				}
				client := fmt.Sprint("c", g, "-", i%3)
				out, err := s.CheckRateLimitBatch(context.Background(), batch(n, client))
				if !assert.NoError(t, err) || !assert.Len(t, out.Responses, n) || !assert.Len(t, out.Responses[0].Statuses, 2) {
					return
				}
				first := out.Responses[0].Statuses[1].Remaining
				for j, r := range out.Responses {
					// Every check of the batch has this client, and no
					// other goroutine has it: its counter goes down by
					// one per check, in the order of the batch.
					if assert.Len(t, r.Statuses, 2, "check %d", j) {
						assert.Equal(t, "t", r.Statuses[0].PolicyId)
						assert.Equal(t, "c", r.Statuses[1].PolicyId)
						assert.Equal(t, first-int64(j), r.Statuses[1].Remaining, "check %d", j)
					}
				}
			}
		})
	}
	wg.Wait()
}

// serveReuse serves, over a real listener, a node's gRPC service and
// codec on an in-process store with three policies: "t" for every tenant,
// "route" for route /r and "client" for client c.
func serveReuse(t *testing.T) (*grpc.ClientConn, ratelimitv1.RateLimiterServiceClient) {
	t.Helper()
	d := memDecider(t, `
policies:
  - {id: t, per: [tenant], limits: [{name: s, algorithm: token_bucket, limit: 1000000, period: 1h}]}
  - {id: route, match: {route: /r}, per: [tenant], limits: [{name: s, algorithm: token_bucket, limit: 1000000, period: 1h}]}
  - {id: client, match: {client: c}, per: [client], limits: [{name: s, algorithm: token_bucket, limit: 1000000, period: 1h}]}
`)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(server.MalformedIsInvalid()...)
	server.NewGRPC(d).Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	c := ratelimitv1.NewRateLimiterServiceClient(conn)
	return conn, c
}

// Over gRPC, a batch decodes into the message and arrays of an earlier
// call (GRPC.Register): nothing of the earlier checks may remain. Each
// batch alternates checks with every field set and checks with only a
// tenant; a field left over from an earlier call would match policy
// "route" or "client", or fail validation.
func TestBatchOverGRPCReusesNothingOfEarlierCalls(t *testing.T) {
	conn, c := serveReuse(t)

	ctx := context.Background()
	sizes := []int{40, 3, 60, 1, 25, 0, 60}
	sizes = append(append(sizes, sizes...), sizes...) // a reuse on each P
	for call, n := range sizes {
		in := &ratelimitv1.BatchRateLimitRequest{}
		for i := range n {
			r := &ratelimitv1.RateLimitRequest{TenantId: fmt.Sprint("t", i)}
			if (i+call)%2 == 0 {
				r.ClientIdentifier, r.Route, r.Method, r.Ip, r.Tier, r.TokenCost = "c", "/r", "get", "10.0.0.1", "x", 2
			}
			in.Requests = append(in.Requests, r)
		}
		out, err := c.CheckRateLimitBatch(ctx, in)
		require.NoError(t, err, "call %d", call)
		require.Len(t, out.Responses, n, "call %d", call)
		for i, r := range out.Responses {
			want := []string{"t"}
			if (i+call)%2 == 0 {
				want = []string{"t", "route", "client"}
			}
			var got []string
			for _, st := range r.Statuses {
				got = append(got, st.PolicyId)
			}
			assert.Equal(t, want, got, "call %d, check %d", call, i)
		}
		// A malformed call between them is answered INVALID_ARGUMENT and
		// leaves nothing behind either.
		err = conn.Invoke(ctx, ratelimitv1.RateLimiterService_CheckRateLimitBatch_FullMethodName, wrapperspb.Bytes([]byte{0xff}), new(ratelimitv1.BatchRateLimitResponse))
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	}
}

// The same for single checks: each call decodes into a message an
// earlier call used (GRPC.Register), and none may see its fields.
func TestCheckOverGRPCReusesNothingOfEarlierCalls(t *testing.T) {
	conn, c := serveReuse(t)

	ctx := context.Background()
	for call := range 40 { // several reuses on each P
		in := &ratelimitv1.RateLimitRequest{TenantId: fmt.Sprint("t", call)}
		want, cost := []string{"t"}, int64(1)
		if call%2 == 0 {
			in.Route, in.TokenCost = "/r", 2
			want, cost = append(want, "route"), 2
		}
		out, err := c.CheckRateLimit(ctx, in)
		require.NoError(t, err, "call %d", call)
		var got []string
		for _, st := range out.Statuses {
			got = append(got, st.PolicyId)
			// A new tenant each call: its buckets are fresh.
			assert.Equal(t, 1_000_000-cost, st.Remaining, "call %d, %s", call, st.PolicyId)
		}
		assert.Equal(t, want, got, "call %d", call)
		err = conn.Invoke(ctx, ratelimitv1.RateLimiterService_CheckRateLimit_FullMethodName, wrapperspb.Bytes([]byte{0xff}), new(ratelimitv1.RateLimitResponse))
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	}
}
