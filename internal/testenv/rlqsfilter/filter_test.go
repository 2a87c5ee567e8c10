package rlqsfilter_test

import (
	"context"
	"net"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/internal/testenv/rlqsfilter"
)

// scripted is an RLQS server that answers each report with the next
// scripted action for the bucket it names, and passes on the reports.
type scripted struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	actions chan *rlqsv3.RateLimitQuotaResponse_BucketAction
	reports chan *rlqsv3.RateLimitQuotaUsageReports
}

func (s *scripted) StreamRateLimitQuotas(st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	for {
		in, err := st.Recv()
		if err != nil {
			return nil
		}
		s.reports <- in
		a := <-s.actions
		a.BucketId = in.GetBucketQuotaUsages()[0].GetBucketId()
		if err := st.Send(&rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{a}}); err != nil {
			return nil
		}
	}
}

func tokens(n uint32, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl),
			RateLimitStrategy: &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
				MaxTokens: n, TokensPerFill: wrapperspb.UInt32(1), FillInterval: durationpb.New(1000 * time.Hour),
			}}},
		}}}
}

// The filter follows the documented behaviour the node's tests rely on.
func TestFilterFollowsTheDocumentedBehaviour(t *testing.T) {
	s := &scripted{actions: make(chan *rlqsv3.RateLimitQuotaResponse_BucketAction, 1), reports: make(chan *rlqsv3.RateLimitQuotaUsageReports, 1)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	// Reports an hour apart: only first reports (subscriptions) are sent.
	f, err := rlqsfilter.Start(context.Background(), conn, rlqsfilter.Config{Domain: "d", ReportInterval: time.Hour, AllowExpired: true})
	require.NoError(t, err)
	defer f.Close()
	id := map[string]string{"tenant": "a"}
	answered := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return f.Responses() == n }, 5*time.Second, time.Millisecond)
	}

	// The first request subscribes (an immediate report, with the domain)
	// and, unassigned, is denied (AllowUnassigned false).
	s.actions <- tokens(2, time.Hour)
	now := time.Now()
	assert.False(t, f.Allow(id, now))
	first := <-s.reports
	assert.Equal(t, "d", first.GetDomain())
	answered(1)
	assert.True(t, f.Allow(id, now))
	assert.True(t, f.Allow(id, now))
	assert.False(t, f.Allow(id, now), "a token bucket of 2 that does not refill")

	// An assignment past its TTL: the expired behaviour (allow here).
	later := now.Add(2 * time.Hour)
	assert.True(t, f.Allow(id, later))
	st, exp := f.Strategy(id)
	require.NotNil(t, st)
	assert.WithinDuration(t, now.Add(time.Hour), exp, time.Minute)

	// Abandon forgets the bucket; its next request subscribes it again.
	s.actions <- &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
		AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
	f.Allow(map[string]string{"tenant": "b"}, now) // a new bucket: the server answers with abandon for it
	<-s.reports
	answered(2)
	st, _ = f.Strategy(map[string]string{"tenant": "b"})
	assert.Nil(t, st, "abandoned")
}
