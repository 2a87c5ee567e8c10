package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// NoopServer is a RateLimiterService that answers ALLOWED to everything
// without looking at the request. Running the same load against it and
// against a node on the same machine gives the limiter's own cost as a
// ratio, with the gRPC stack and the generator cancelled out.
type NoopServer struct {
	lis  net.Listener
	srv  *grpc.Server
	svc  *noop
	done chan struct{} // closed when Serve returns
	err  error         // Serve's error; read only after done is closed
}

type noop struct {
	ratelimitv1.UnimplementedRateLimiterServiceServer
	checks atomic.Int64
}

func (n *noop) CheckRateLimit(context.Context, *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
	n.checks.Add(1)
	return &ratelimitv1.RateLimitResponse{}, nil // Decision's zero value is ALLOWED
}

func (*noop) CheckRateLimitBatch(_ context.Context, in *ratelimitv1.BatchRateLimitRequest) (*ratelimitv1.BatchRateLimitResponse, error) {
	out := &ratelimitv1.BatchRateLimitResponse{Responses: make([]*ratelimitv1.RateLimitResponse, len(in.GetRequests()))}
	for i := range out.Responses {
		out.Responses[i] = &ratelimitv1.RateLimitResponse{}
	}
	return out, nil
}

// StartNoop listens on addr (":0" picks a port) and serves the no-op
// service until Close. The server is a default grpc.NewServer, as the
// node's is, so the comparison is like for like.
func StartNoop(addr string) (*NoopServer, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	s := &NoopServer{lis: lis, srv: grpc.NewServer(), svc: &noop{}, done: make(chan struct{})}
	ratelimitv1.RegisterRateLimiterServiceServer(s.srv, s.svc)
	go func() {
		defer close(s.done)
		s.err = s.srv.Serve(lis)
	}()
	return s, nil
}

// Addr is the listen address.
func (s *NoopServer) Addr() string { return s.lis.Addr().String() }

// Checks is the number of CheckRateLimit calls answered so far: what a
// run sent this node, counted where it arrived.
func (s *NoopServer) Checks() int64 { return s.svc.checks.Load() }

// Done is closed when the server stops, by Close or by a serve error.
func (s *NoopServer) Done() <-chan struct{} { return s.done }

// Close stops the server, letting calls in flight finish, and returns the
// serve error, if serving failed. It may be called more than once.
func (s *NoopServer) Close() error {
	s.srv.GracefulStop()
	<-s.done
	if s.err != nil && !errors.Is(s.err, grpc.ErrServerStopped) {
		return fmt.Errorf("noop server: %w", s.err)
	}
	return nil
}
