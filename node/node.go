// Package node assembles a rate-limit node: the policy set, the store
// (Redis or in-process), the decider and the gRPC listener with health and
// reflection. cmd/node parses flags into a Config and runs it; tests and
// the sandbox start nodes in process the same way.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/allot-dev/allot/decide"
	"github.com/allot-dev/allot/memstore"
	"github.com/allot-dev/allot/policy"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/server"
)

// Config is everything a node needs to start.
type Config struct {
	GRPCAddr     string   // listen address, e.g. 127.0.0.1:8081 (":0" picks a port)
	Redis        []string // region Redis addresses; empty runs standalone
	PoliciesPath string   // policy file (YAML or JSON)
	Logger       *slog.Logger
}

// Node is a running node. Close stops it.
type Node struct {
	cfg     Config
	log     *slog.Logger
	lis     net.Listener
	grpc    *grpc.Server
	health  *health.Server
	decider *decide.Decider
	closers []func() error
	served  chan error
}

// Start loads the policies, connects the store and starts serving. A bad
// policy file fails here with the file, policy id and field at fault.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	set, err := loadPolicies(cfg.PoliciesPath)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: log, served: make(chan error, 1)}
	store, err := n.openStore(ctx)
	if err != nil {
		return nil, err
	}
	n.decider = decide.New(store, set, log)
	lis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		n.closeAll()
		return nil, fmt.Errorf("listen on %s: %w", cfg.GRPCAddr, err)
	}
	n.lis = lis
	n.grpc = grpc.NewServer()
	ratelimitv1.RegisterRateLimiterServiceServer(n.grpc, server.NewGRPC(n.decider))
	n.health = health.NewServer()
	healthpb.RegisterHealthServer(n.grpc, n.health)
	n.health.SetServingStatus(ratelimitv1.RateLimiterService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	reflection.Register(n.grpc)
	go func() { n.served <- n.grpc.Serve(lis) }()
	log.Info("node serving", "grpc", lis.Addr().String(), "store", n.storeName(), "policies", set.Len())
	return n, nil
}

func loadPolicies(path string) (*policy.Set, error) {
	if path == "" {
		return policy.Compile("(no policy file)", &policy.File{})
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policies: %w", err)
	}
	return policy.Load(path, data)
}

func (n *Node) openStore(ctx context.Context) (decide.Store, error) {
	if len(n.cfg.Redis) == 0 {
		return memstore.New(nil), nil
	}
	st, err := region.Open(ctx, n.cfg.Redis, region.Options{})
	if err != nil {
		return nil, fmt.Errorf("connect to region redis %v: %w", n.cfg.Redis, err)
	}
	n.closers = append(n.closers, st.Close)
	return st, nil
}

func (n *Node) storeName() string {
	if len(n.cfg.Redis) == 0 {
		return "standalone (in-process)"
	}
	return fmt.Sprintf("redis %v", n.cfg.Redis)
}

// Addr is the gRPC listen address.
func (n *Node) Addr() string { return n.lis.Addr().String() }

// Decider is the node's decider (for reloads and tests).
func (n *Node) Decider() *decide.Decider { return n.decider }

// Done is closed with the serve error when the gRPC server stops.
func (n *Node) Done() <-chan error { return n.served }

// Close stops the node gracefully: health goes NOT_SERVING, in-flight
// calls finish (up to timeout, then they are cut), the store is closed.
func (n *Node) Close(timeout time.Duration) error {
	n.health.Shutdown()
	stopped := make(chan struct{})
	go func() { n.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(timeout):
		n.log.Warn("graceful stop timed out; closing open calls", "timeout", timeout)
		n.grpc.Stop()
		<-stopped
	}
	err := <-n.served
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return errors.Join(err, n.closeAll())
}

func (n *Node) closeAll() error {
	var errs []error
	for _, c := range n.closers {
		errs = append(errs, c())
	}
	n.closers = nil
	return errors.Join(errs...)
}
