package rlqs_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/rlqs"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/policy"
)

// reserver answers every bucket with grant, and records what size asked
// for at rate 1,000/s.
type reserver struct {
	mu    sync.Mutex
	grant decide.Grant
	sizes []int64
	reqs  []policy.Request
}

func (r *reserver) Reserve(_ context.Context, req *policy.Request, size func(float64) (int64, int64)) (decide.Grant, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, _ := size(1000)
	r.sizes = append(r.sizes, n)
	r.reqs = append(r.reqs, *req)
	g := r.grant
	if g.Kind == decide.GrantBatch && g.Requests == 0 {
		g.Requests = n
	}
	return g, nil
}

func serve(t *testing.T, res rlqs.Reserver, maxBuckets int) rlqsv3.RateLimitQuotaServiceClient {
	c, _ := serveWith(t, res, maxBuckets)
	return c
}

func serveWith(t *testing.T, res rlqs.Reserver, maxBuckets int) (rlqsv3.RateLimitQuotaServiceClient, *rlqs.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rs := rlqs.New(rlqs.Config{Reserver: res, Keys: server.DefaultEnvoyKeys(), MaxBuckets: maxBuckets})
	rlqsv3.RegisterRateLimitQuotaServiceServer(srv, rs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return rlqsv3.NewRateLimitQuotaServiceClient(conn), rs
}

type usage = rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage

func report(id map[string]string, elapsed time.Duration, allowed, denied uint64) *usage {
	return &usage{BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

func roundTrip(t *testing.T, s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, domain string, us ...*usage) (*rlqsv3.RateLimitQuotaResponse, error) {
	t.Helper()
	require.NoError(t, s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}))
	return s.Recv()
}

func TestBatchesFollowDemandAndAreFreshEachRound(t *testing.T) {
	res := &reserver{grant: decide.Grant{Kind: decide.GrantBatch}}
	s, err := serve(t, res, 0).StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	id := map[string]string{"tenant": "acme", "route": "/x"}

	resp, err := roundTrip(t, s, "d", report(id, 0, 1, 0))
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 1)
	first := resp.BucketAction[0].GetQuotaAssignmentAction()
	assert.Equal(t, 2*time.Second, first.GetAssignmentTimeToLive().AsDuration(), "1 s assumed before the interval is seen, plus 1 s")
	assert.Equal(t, uint32(1000), first.GetRateLimitStrategy().GetTokenBucket().GetMaxTokens(), "demand unknown: the whole part for one interval")
	assert.Equal(t, policy.Request{Tenant: "acme", Route: "/x"}, res.reqs[0])

	// 2 s interval, 100 requests offered: 50/s, batches of 50*1.25*2.
	resp, err = roundTrip(t, s, "", report(id, 2*time.Second, 90, 10))
	require.NoError(t, err)
	second := resp.BucketAction[0].GetQuotaAssignmentAction()
	assert.Equal(t, 3*time.Second, second.GetAssignmentTimeToLive().AsDuration())
	tb := second.GetRateLimitStrategy().GetTokenBucket()
	assert.Equal(t, uint32(125), tb.GetMaxTokens())
	// The same batch again must still be a new strategy (else the client
	// would only extend the old one's TTL).
	resp, err = roundTrip(t, s, "", report(id, 2*time.Second, 90, 10))
	require.NoError(t, err)
	tb2 := resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	assert.Equal(t, tb.GetMaxTokens(), tb2.GetMaxTokens())
	assert.NotEqual(t, tb.GetFillInterval().AsDuration(), tb2.GetFillInterval().AsDuration())
	for _, b := range []*typev3.TokenBucket{tb, tb2} {
		// At most one token refills in the longest TTL: the batch is all.
		assert.GreaterOrEqual(t, b.GetFillInterval().AsDuration(), time.Hour)
		assert.Equal(t, uint32(1), b.GetTokensPerFill().GetValue())
	}
}

func TestBlanketAndLocalAnswers(t *testing.T) {
	for _, tc := range []struct {
		grant decide.Grant
		check func(t *testing.T, s *typev3.RateLimitStrategy)
	}{
		{decide.Grant{Kind: decide.GrantAllowAll}, func(t *testing.T, s *typev3.RateLimitStrategy) {
			assert.Equal(t, typev3.RateLimitStrategy_ALLOW_ALL, s.GetBlanketRule())
		}},
		{decide.Grant{Kind: decide.GrantDenyAll}, func(t *testing.T, s *typev3.RateLimitStrategy) {
			assert.Equal(t, typev3.RateLimitStrategy_DENY_ALL, s.GetBlanketRule())
		}},
		{decide.Grant{Kind: decide.GrantBatch, Requests: -1}, func(t *testing.T, s *typev3.RateLimitStrategy) {
			assert.Equal(t, typev3.RateLimitStrategy_DENY_ALL, s.GetBlanketRule(), "an empty batch denies")
		}},
		{decide.Grant{Kind: decide.GrantLocal, LocalBurst: 50, LocalRate: 25}, func(t *testing.T, s *typev3.RateLimitStrategy) {
			tb := s.GetTokenBucket()
			assert.Equal(t, uint32(50), tb.GetMaxTokens())
			assert.Equal(t, 40*time.Millisecond, tb.GetFillInterval().AsDuration(), "25/s")
		}},
	} {
		s, err := serve(t, &reserver{grant: tc.grant}, 0).StreamRateLimitQuotas(context.Background())
		require.NoError(t, err)
		resp, err := roundTrip(t, s, "d", report(map[string]string{"tenant": "a"}, 0, 0, 0))
		require.NoError(t, err)
		tc.check(t, resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy())
	}
}

func TestRefusedBucketIDsAreDenied(t *testing.T) {
	res := &reserver{grant: decide.Grant{Kind: decide.GrantAllowAll}}
	s, err := serve(t, res, 0).StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	for _, id := range []map[string]string{
		{"name": "x"}, // a key that names no field
		{"tenant": "a", "remote_address": "1.2.3.4", "ip": "1.2.3.4"}, // one field twice
		{"tenant": strings.Repeat("a", 2000)},                         // too long
		{"ip": "not-an-ip"},
		{},
	} {
		resp, err := roundTrip(t, s, "d", report(id, 0, 0, 0))
		require.NoError(t, err, "%v", id)
		assert.Equal(t, typev3.RateLimitStrategy_DENY_ALL, resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule(), "%v", id)
	}
	assert.Empty(t, res.reqs, "a refused id is never decided")
}

func TestStreamErrors(t *testing.T) {
	c := serve(t, &reserver{grant: decide.Grant{Kind: decide.GrantAllowAll}}, 3)
	id := func(i int) map[string]string { return map[string]string{"tenant": string(rune('a' + i))} }
	for _, tc := range []struct {
		name string
		msgs [][]*usage
		dom  []string
		code codes.Code
	}{
		{"no domain", [][]*usage{{report(id(0), 0, 0, 0)}}, []string{""}, codes.InvalidArgument},
		{"another domain", [][]*usage{{report(id(0), 0, 0, 0)}, {report(id(0), time.Second, 0, 0)}}, []string{"a", "b"}, codes.InvalidArgument},
		{"too many in one report", [][]*usage{{report(id(0), 0, 0, 0), report(id(1), 0, 0, 0), report(id(2), 0, 0, 0), report(id(3), 0, 0, 0)}}, []string{"a"}, codes.InvalidArgument},
		{"too many buckets", [][]*usage{{report(id(0), 0, 0, 0), report(id(1), 0, 0, 0)}, {report(id(2), 0, 0, 0)}, {report(id(3), 0, 0, 0)}}, []string{"a", "", ""}, codes.ResourceExhausted},
	} {
		s, err := c.StreamRateLimitQuotas(context.Background())
		require.NoError(t, err)
		var last error
		for i, us := range tc.msgs {
			if _, last = roundTrip(t, s, tc.dom[i], us...); last != nil {
				break
			}
		}
		assert.Equal(t, tc.code, status.Code(last), "%s: %v", tc.name, last)
	}
}

func TestAbsurdUsageIsHarmless(t *testing.T) {
	res := &reserver{grant: decide.Grant{Kind: decide.GrantBatch}}
	s, err := serve(t, res, 0).StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	id := map[string]string{"tenant": "a"}
	for _, u := range []*usage{
		report(id, 0, 0, 0),
		report(id, time.Nanosecond, math.MaxUint64, math.MaxUint64),
		report(id, 100*time.Hour, 1, 0),
		{BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: &durationpb.Duration{Seconds: -5}},
		{BucketId: &rlqsv3.BucketId{Bucket: id}},
	} {
		resp, err := roundTrip(t, s, "d", u)
		require.NoError(t, err)
		qa := resp.BucketAction[0].GetQuotaAssignmentAction()
		assert.LessOrEqual(t, qa.GetAssignmentTimeToLive().AsDuration(), time.Minute+time.Second, "the TTL is bounded whatever the report claims")
	}
	for _, n := range res.sizes {
		assert.LessOrEqual(t, n, int64(1000*61), "no batch beyond the part over the longest interval")
	}
}

func TestAStreamThatNeverReadsHoldsOnlyItself(t *testing.T) {
	c, rs := serveWith(t, &reserver{grant: decide.Grant{Kind: decide.GrantAllowAll}}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	bad, err := c.StreamRateLimitQuotas(ctx)
	require.NoError(t, err)
	long := map[string]string{"route": strings.Repeat("/x", 400), "tenant": "a"}
	// Reports whose answers are never read: the server's sends fill the
	// stream's window and block, then its reads stop, then ours do.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for {
			if bad.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*usage{report(long, time.Second, 1, 0)}}) != nil {
				return
			}
		}
	}()
	// Another stream is served meanwhile.
	good, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	resp, err := roundTrip(t, good, "d", report(map[string]string{"tenant": "b"}, 0, 0, 0))
	require.NoError(t, err)
	assert.Len(t, resp.BucketAction, 1)
	streams, buckets := rs.Open()
	assert.Equal(t, int64(2), streams)
	assert.Equal(t, int64(2), buckets)
	cancel()
	<-sent
	assert.Eventually(t, func() bool { s, _ := rs.Open(); return s == 1 }, 5*time.Second, 10*time.Millisecond, "the blocked stream is freed when its client goes")
}

// A stream at its cap of buckets, each id at its largest, holds a bounded
// heap; the next bucket ends it.
func TestAFullStreamIsBounded(t *testing.T) {
	c, rs := serveWith(t, &reserver{grant: decide.Grant{Kind: decide.GrantAllowAll}}, 0)
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	pad := strings.Repeat("x", rlqs.MaxIDBytes-len("tenant")-len("route")-12)
	const perReport = 512
	for i := 0; i < rlqs.DefaultMaxBuckets; i += perReport {
		us := make([]*usage, perReport)
		for j := range us {
			us[j] = report(map[string]string{"tenant": fmt.Sprintf("%06d", i+j), "route": pad}, 0, 0, 0)
		}
		_, err := roundTrip(t, s, "d", us...)
		require.NoError(t, err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	_, buckets := rs.Open()
	require.Equal(t, int64(rlqs.DefaultMaxBuckets), buckets)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d buckets of %d-byte ids: heap grew %.1f MiB", buckets, rlqs.MaxIDBytes, float64(grew)/(1<<20))
	assert.Less(t, grew, int64(16<<20))
	_, err = roundTrip(t, s, "", report(map[string]string{"tenant": "one-more"}, 0, 0, 0))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
}

// slowReserver answers after a delay that falls with the tenant's number,
// so that reservations run side by side finish in reverse order, and
// counts the most that ran at once.
type slowReserver struct {
	mu        sync.Mutex
	now, most int
}

func (r *slowReserver) Reserve(_ context.Context, req *policy.Request, size func(float64) (int64, int64)) (decide.Grant, error) {
	r.mu.Lock()
	r.now++
	r.most = max(r.most, r.now)
	r.mu.Unlock()
	var i int
	_, _ = fmt.Sscanf(req.Tenant, "t%d", &i)
	time.Sleep(time.Duration(200-i) * 50 * time.Microsecond) // the work a reservation does, not a synchronisation
	r.mu.Lock()
	r.now--
	r.mu.Unlock()
	n, _ := size(1000)
	return decide.Grant{Kind: decide.GrantBatch, Requests: n + int64(i)}, nil
}

// A report's buckets are reserved side by side, at most 64 at a time, and
// answered in the report's order; a bucket named twice is answered once.
func TestReportReservesSideBySideInOrder(t *testing.T) {
	res := &slowReserver{}
	s, err := serve(t, res, 0).StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	var us []*usage
	for i := range 200 {
		us = append(us, report(map[string]string{"tenant": fmt.Sprintf("t%d", i)}, 0, 1, 0))
	}
	us = append(us, report(map[string]string{"tenant": "t7"}, 0, 1, 0))
	resp, err := roundTrip(t, s, "d", us...)
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 200, "t7 named twice, answered once")
	for i, a := range resp.BucketAction {
		require.Equal(t, fmt.Sprintf("t%d", i), a.GetBucketId().GetBucket()["tenant"], "action %d", i)
		require.Equal(t, uint32(1000+i), a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens(), "action %d", i)
	}
	assert.Greater(t, res.most, 1, "reservations ran side by side")
	assert.LessOrEqual(t, res.most, 64, "reservations at once")
}
