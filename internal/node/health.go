package node

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// healthServer is grpc-go's health server whose Watch streams end when the
// node stops. grpc-go's Watch runs until the client goes, so one open
// watch (grpc-health-probe, a load balancer) held GracefulStop for the
// whole shutdown timeout. Watchers see NOT_SERVING first (Shutdown),
// then UNAVAILABLE as the stream ends.
type healthServer struct {
	*health.Server
	stop     chan struct{}
	stopOnce sync.Once
}

func newHealthServer() *healthServer {
	return &healthServer{Server: health.NewServer(), stop: make(chan struct{})}
}

// endWatches ends every Watch stream, open or to come.
func (h *healthServer) endWatches() { h.stopOnce.Do(func() { close(h.stop) }) }

// Watch serves inner Watch on a stream whose context also ends with the
// node.
func (h *healthServer) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() { // ends with the call: cancel runs on return
		select {
		case <-h.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := h.Server.Watch(req, &watchStream{Health_WatchServer: stream, ctx: ctx})
	select {
	case <-h.stop:
		return status.Error(codes.Unavailable, "node shutting down")
	default:
		return err
	}
}

type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (w *watchStream) Context() context.Context { return w.ctx }
