package rlqsfilter_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/testenv/rlqsfilter"
)

type received struct {
	stream int32
	msg    *rlqsv3.RateLimitQuotaUsageReports
}

// script is an RLQS server the test drives: it passes on every report
// with its stream's number, sends what the test gives it on the current
// stream, and ends that stream when told.
type script struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	reports chan received
	send    chan *rlqsv3.RateLimitQuotaResponse
	end     chan error
	streams atomic.Int32
}

func (s *script) StreamRateLimitQuotas(st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	n := s.streams.Add(1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			s.reports <- received{n, m}
		}
	}()
	for {
		select {
		case r := <-s.send:
			if err := st.Send(r); err != nil {
				return err
			}
		case err := <-s.end:
			return err
		case <-st.Context().Done():
			return nil
		}
	}
}

func serve(t *testing.T) (*script, *grpc.ClientConn) {
	s := &script{reports: make(chan received, 1024), send: make(chan *rlqsv3.RateLimitQuotaResponse), end: make(chan error)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return s, conn
}

// next is the first report from here on that match accepts.
func (s *script) next(t *testing.T, match func(received) bool) received {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case r := <-s.reports:
			if match(r) {
				return r
			}
		case <-timeout:
			t.Fatal("no such report")
		}
	}
}

func usages(r *rlqsv3.RateLimitQuotaUsageReports) map[string]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	out := map[string]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{}
	for _, u := range r.GetBucketQuotaUsages() {
		out[u.GetBucketId().GetBucket()["tenant"]] = u
	}
	return out
}

// The runner on a real stream: the stream opens at the first bucket, an
// assignment is enforced, and a stream the server ends is reopened by the
// next report, which carries every bucket.
func TestFilterOnAStream(t *testing.T) {
	s, conn := serve(t)
	// A 50 ms report interval departs from Envoy's 5 s to keep the test
	// short; nothing here depends on its length.
	f, err := rlqsfilter.Start(context.Background(), conn, rlqsfilter.Config{Domain: "d", ReportInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	defer f.Close()
	assert.Zero(t, f.Streams(), "no stream before the first bucket")

	assert.True(t, f.Allow(id("a"), time.Now()), "no no_assignment_behavior: ALLOW_ALL")
	first := s.next(t, func(received) bool { return true })
	assert.Equal(t, int32(1), first.stream)
	assert.Equal(t, "d", first.msg.GetDomain())
	require.Len(t, first.msg.GetBucketQuotaUsages(), 1)
	u := first.msg.GetBucketQuotaUsages()[0]
	assert.Equal(t, uint64(1), u.GetNumRequestsAllowed())
	assert.Zero(t, u.GetTimeElapsed().AsDuration())

	// Two tokens that do not come back within the test; a TTL of
	// 3600.9 s lasts 3600 s.
	before := time.Now()
	s.send <- &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{
		assign("a", 3600*time.Second+900*time.Millisecond, tokens(2, 1, time.Hour)),
	}}
	require.Eventually(t, func() bool { return f.Responses() == 1 }, 10*time.Second, time.Millisecond)
	after := time.Now()
	assert.True(t, f.Allow(id("a"), time.Now()))
	assert.True(t, f.Allow(id("a"), time.Now()))
	assert.False(t, f.Allow(id("a"), time.Now()))
	st, exp := f.Strategy(id("a"))
	require.NotNil(t, st.GetTokenBucket())
	assert.False(t, exp.Before(before.Add(3600*time.Second)))
	assert.False(t, exp.After(after.Add(3600*time.Second)))

	// A second bucket, reported on the first stream; then the server ends
	// that stream.
	assert.True(t, f.Allow(id("b"), time.Now()))
	s.next(t, func(r received) bool { return r.stream == 1 && usages(r.msg)["b"] != nil })
	s.end <- status.Error(codes.Unavailable, "going away")
	again := s.next(t, func(r received) bool { return r.stream == 2 })
	assert.Len(t, usages(again.msg), 2, "the first report on the new stream has every bucket")
	assert.Equal(t, 2, f.Streams())
	require.Eventually(t, func() bool { return f.Err() == nil }, 10*time.Second, time.Millisecond)

	// The assignment outlived the stream.
	st, _ = f.Strategy(id("a"))
	assert.NotNil(t, st.GetTokenBucket())
	assert.False(t, f.Allow(id("a"), time.Now()))
}
