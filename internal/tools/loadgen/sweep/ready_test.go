package sweep

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// allowAll answers ALLOWED and counts the checks of each tenant.
type allowAll struct {
	ratelimitv1.UnimplementedRateLimiterServiceServer
	ready, load atomic.Int64
}

func (s *allowAll) CheckRateLimit(_ context.Context, r *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
	if r.GetTenantId() == readyTenant {
		s.ready.Add(1)
	} else {
		s.load.Add(1)
	}
	return &ratelimitv1.RateLimitResponse{}, nil
}

// slowStart listens now, as a starting process does (startNoop's dial
// succeeds), and serves gRPC only after delay: the late first answer of
// a process starved at start (issue 45).
func slowStart(t *testing.T, delay time.Duration) (addr string, svc *allowAll) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	svc = &allowAll{}
	ratelimitv1.RegisterRateLimiterServiceServer(srv, svc)
	served := make(chan struct{})
	timer := time.AfterFunc(delay, func() { // the injected slow start, not synchronisation
		defer close(served)
		_ = srv.Serve(lis)
	})
	t.Cleanup(func() {
		if timer.Stop() {
			lis.Close()
			return
		}
		srv.Stop()
		<-served
	})
	return lis.Addr().String(), svc
}

// A baseline row of TestSweepRunsRealProcesses (2 workers, 100 ms
// warm-up, 400 ms measured) on a server whose first answer comes after
// the whole row: the row waits for it and then measures load, instead of
// ending with nothing sent, as it did when the connection was made
// inside the row's window.
func TestRowWaitsForFirstAnswer(t *testing.T) {
	const warmup, window = 100 * time.Millisecond, 400 * time.Millisecond
	addr, svc := slowStart(t, warmup+window+200*time.Millisecond)
	rep, err := measure(t.Context(), closedLoop(addr, Uniform10k, 2, warmup, window, 2*time.Second, 2))
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Measured
	if m.Sent == 0 || m.Allowed != m.Sent || m.Latency.Count != m.Sent {
		t.Fatalf("measured %d sent, %d allowed, %d latencies: want some, every one answered ALLOWED", m.Sent, m.Allowed, m.Latency.Count)
	}
	// An answered check opened each of the two connections; every
	// answer of the load was the server's.
	if svc.ready.Load() < 2 || svc.load.Load() < rep.Total.Allowed {
		t.Fatalf("server saw %d opening checks and %d of load; want 2 or more, and the %d answers the report counts", svc.ready.Load(), svc.load.Load(), rep.Total.Allowed)
	}
}

// A server that never answers fails the row within readyTimeout with
// the address named, instead of measuring an empty window.
func TestRowFailsWithoutAnswer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond) // stands in for readyTimeout
	defer cancel()
	_, err = measure(ctx, closedLoop(lis.Addr().String(), Uniform10k, 2, 10*time.Millisecond, 40*time.Millisecond, 100*time.Millisecond, 1))
	if err == nil || ctx.Err() == nil {
		t.Fatalf("measure on a silent listener: %v; want an error once the context ended", err)
	}
}
