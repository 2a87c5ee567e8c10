package loadgen_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/tools/loadgen"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// stub answers by client key: k0 shed as overloaded, k1 another
// UNAVAILABLE, k2 throttled degraded, k3 allowed degraded, others allowed.
type stub struct {
	ratelimitv1.UnimplementedRateLimiterServiceServer
	n [5]atomic.Int64
}

func (s *stub) CheckRateLimit(_ context.Context, r *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
	switch r.GetClientIdentifier() {
	case "k0":
		s.n[0].Add(1)
		return nil, status.Error(codes.Unavailable, "node overloaded: shedding load")
	case "k1":
		s.n[1].Add(1)
		return nil, status.Error(codes.Unavailable, "connection refused")
	case "k2":
		s.n[2].Add(1)
		return &ratelimitv1.RateLimitResponse{Decision: ratelimitv1.RateLimitResponse_THROTTLED, Degraded: true}, nil
	case "k3":
		s.n[3].Add(1)
		return &ratelimitv1.RateLimitResponse{Degraded: true}, nil
	}
	s.n[4].Add(1)
	return &ratelimitv1.RateLimitResponse{}, nil
}

// Shed calls, other errors and degraded answers are told apart, and a
// warm-up's requests are counted in the totals but not in Measured.
func TestShedDegradedAndWarmup(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	st := &stub{}
	ratelimitv1.RegisterRateLimiterServiceServer(srv, st)
	go func() { _ = srv.Serve(lis) }() // owned: ends with srv.Stop
	t.Cleanup(srv.Stop)

	rep := run(t, loadgen.Config{
		Targets: []loadgen.Target{{Region: "stub", Addr: lis.Addr().String()}},
		Rate:    1000, Duration: 400 * time.Millisecond, Warmup: 200 * time.Millisecond, Concurrency: 8,
		Keys: loadgen.Keys{Dist: loadgen.Uniform, Count: 6},
	})
	c := rep.Total.Counts
	if c.Sent != 400 || c.Shed != st.n[0].Load() || c.Failed != st.n[0].Load()+st.n[1].Load() ||
		c.ThrottledDegraded != st.n[2].Load() || c.Throttled != st.n[2].Load() || c.AllowedDegraded != st.n[3].Load() ||
		c.Allowed != st.n[3].Load()+st.n[4].Load() || c.Degraded() != st.n[2].Load()+st.n[3].Load() {
		t.Fatalf("totals %+v, stub answered shed %d, unavailable %d, throttled degraded %d, allowed degraded %d, allowed %d",
			c, st.n[0].Load(), st.n[1].Load(), st.n[2].Load(), st.n[3].Load(), st.n[4].Load())
	}
	if c.Shed == 0 || c.Failed == c.Shed || c.ThrottledDegraded == 0 || c.AllowedDegraded == 0 {
		t.Fatalf("some outcome never drawn: %+v", c)
	}
	// Open loop at 1,000/s: requests 200..399 are due from 200 ms on.
	m := rep.Measured
	if m.Sent != 200 || m.Shed > c.Shed || m.Latency.Count != m.Sent-m.Failed || rep.Warmup != 200*time.Millisecond {
		t.Fatalf("measured %+v (latency count %d), want the 200 requests due after the warm-up", m.Counts, m.Latency.Count)
	}
	if m.Span <= 0 || m.Span > rep.LastAnswer {
		t.Fatalf("measured span %v, last answer %v", m.Span, rep.LastAnswer)
	}
	if !loadgen.IsShed(status.Error(codes.Unavailable, "overloaded")) || loadgen.IsShed(status.Error(codes.ResourceExhausted, "overloaded")) {
		t.Fatal("IsShed: want UNAVAILABLE with \"overloaded\" only")
	}
}

// Without a warm-up, Measured is the whole run.
func TestMeasuredIsTotalWithoutWarmup(t *testing.T) {
	s := startNoop(t)
	rep := run(t, loadgen.Config{
		Targets: []loadgen.Target{{Region: "noop", Addr: s.Addr()}},
		Rate:    500, Duration: 200 * time.Millisecond, Keys: loadgen.Keys{Dist: loadgen.Hot},
	})
	if rep.Measured.Counts != rep.Total.Counts || rep.Measured.Latency != rep.Total.Latency || rep.Measured.Span != rep.LastAnswer {
		t.Fatalf("measured %+v, total %+v", rep.Measured, rep.Total)
	}
}
