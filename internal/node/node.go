// Package node assembles a rate-limit node from the other packages: the
// policy set and its live reloads (policies.go), the store (Redis or in
// process) and what happens when it fails (resilience.go, crash.go), the
// decider, admission control (admission.go, grpclimits.go), the gRPC
// listener with health (health.go) and reflection, the HTTP face
// (http.go), RLQS (rlqs.go), multi-region shares (multiregion.go), TLS
// (tls.go) and telemetry (telemetry.go). cmd/node parses flags into a
// Config and runs it; tests and the sandbox start nodes in process the
// same way.
//
// It owns the wiring and the node's lifecycle (start, drain, stop). It
// must not decide checks, speak a wire format or hold counters itself:
// those belong to decide, server and the stores it wires.
package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/memstore"
	"github.com/allot-dev/allot/internal/ratelog"
	"github.com/allot-dev/allot/internal/rlqs"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/internal/telemetry"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/middleware"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/region"
)

// Config is everything a node needs to start.
type Config struct {
	GRPCAddr     string   // listen address, e.g. 127.0.0.1:8081 (":0" picks a port)
	Redis        []string // region Redis addresses; empty runs standalone
	PoliciesPath string   // policy file (YAML or JSON); shorthand for StoreURL "file:PATH"
	// Policy store and admin API (internal/node/policies.go).
	StoreURL   string // file:PATH, nats://HOST:PORT or postgres://...; watched and hot-reloaded
	AdminAddr  string // admin API listen address; empty disables
	AdminToken string // bearer token for admin writes; required off loopback
	Logger     *slog.Logger
	// HTTP face and reverse proxy (internal/node/http.go).
	HTTPAddr     string              // POST /v1/check, /healthz, /readyz; empty disables
	Upstream     string              // reverse-proxy target URL; empty disables the proxy
	ProxyAddr    string              // the proxy's listen address (required with Upstream)
	Identity     middleware.Identity // how the proxy identifies callers
	CheckTimeout time.Duration       // the proxy's per-request check timeout; 0 means middleware.DefaultTimeout
	// Lease holds the default lease knobs of `precision: leased` policies
	// (a policy's lease: block overrides them); zero fields take package
	// lease's defaults. Leases need Redis: standalone decides leased
	// policies on the in-process store.
	Lease lease.Config
	// Resilience: Redis deadlines, breakers, local fallback and gossip
	// (internal/node/resilience.go).
	Resilience Resilience
	// MultiRegion: global limits shared between regions (internal/node/multiregion.go).
	MultiRegion MultiRegion
	// Telemetry, when set, receives the node's metrics and spans
	// (internal/node/telemetry.go). The caller owns it: shut it down after Close.
	Telemetry *telemetry.Telemetry
	// MetricsAddr serves /metrics on a listener of its own; empty serves
	// it on the HTTP listener (HTTPAddr). Needs Telemetry.
	MetricsAddr string
	// MaxInFlight bounds the checks decided at once; more are shed
	// (UNAVAILABLE, "node overloaded"). Zero means DefaultMaxInFlight;
	// negative, no bound.
	MaxInFlight int
	// Pprof serves the runtime profiles (net/http/pprof, /debug/pprof/) on
	// the metrics listener; it needs MetricsAddr. Off by default: profiles
	// are for operators measuring a node, not for the network at large.
	Pprof bool
	// Transport: TLS on the listeners, credentials and TLS to Redis and
	// NATS (internal/node/tls.go).
	Transport Transport
	// GRPCLimits bound connections, streams, handshakes and idle
	// connections of the gRPC listener (internal/node/grpclimits.go).
	GRPCLimits GRPCLimits
	// HTTPLimits bound connections of the HTTP listeners and the waits
	// of the reverse proxy on its callers (internal/node/httplimits.go).
	HTTPLimits HTTPLimits
	// DrainPeriod is how long Close keeps serving after it marked the node
	// not ready (/readyz 503, health NOT_SERVING), so that load balancers
	// and health-checking clients move away before the listeners close;
	// 0: none. The flag --drain-period defaults to DefaultDrainPeriod.
	DrainPeriod time.Duration
}

// DefaultDrainPeriod is --drain-period's default: longer than a load
// balancer's usual readiness probe interval, short enough to fit a
// Kubernetes termination grace period (30 s) with allot-node's 10 s
// shutdown timeout.
const DefaultDrainPeriod = 5 * time.Second

// streamWorkers is how many gRPC calls in flight reuse a parked
// goroutine (grpc.NumStreamWorkers); an idle one costs its stack only.
const streamWorkers = 128

// Node is a running node. Close stops it.
type Node struct {
	cfg     Config
	log     *slog.Logger
	reqLog  *slog.Logger // rate-limited: see perRequestLog
	lis     net.Listener
	grpc    *grpc.Server
	health  *healthServer
	decider *decide.Decider
	rlqs    *rlqs.Server
	admit   *admission // bounds the checks in flight, in front of decider
	closers []func() error
	leases  *lease.Manager // nil in standalone mode
	// policies is the policy store, reloader and admin API (internal/node/policies.go).
	policies *policySource
	served   chan error
	// HTTP (internal/node/http.go).
	https      []*httpListener
	httpFailed chan error
	closing    atomic.Bool // set by Close: /readyz answers 503
	res        resilience  // internal/node/resilience.go

	// crashHooks cut connections without a goodbye, first thing in Crash
	// (internal/node/crash.go).
	crashHooks []func()
}

// Start loads the policies, connects the store and starts serving. A bad
// policy file fails here with the file, policy id and field at fault.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	policies, set, err := openPolicies(ctx, &cfg, log)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: log, served: make(chan error, 1), httpFailed: make(chan error, 1)}
	n.policies = policies
	n.closers = append(n.closers, policies.close)
	store, err := n.openStore(ctx)
	if err != nil {
		return nil, errors.Join(err, n.closeAll())
	}
	rs, _ := store.(*region.Store)
	if err := n.startResilience(rs); err != nil {
		return nil, errors.Join(err, n.closeAll())
	}
	if err := cfg.MultiRegion.validate(); err != nil {
		return nil, errors.Join(err, n.closeAll())
	}
	dc := decide.Config{
		Store: n.instrument(store), Policies: set, Log: n.perRequestLog(),
		Leases:  n.leases,                  // nil standalone: leased policies take the exact path
		Regions: cfg.MultiRegion.regions(), // 0 without multi-region
		Demand:  n.publishesDemand(),       // counted only for the publisher that drains it
		// No Timeout: the store judges its shards' health itself (a
		// stalled shard fails its calls after the stall threshold,
		// --redis-timeout) and sheds what this node cannot get answered
		// (1 s, region.DefaultMaxWait); a wall-clock bound per check would shed
		// checks of a merely busy node.
	}
	if n.res.fallback != nil { // standalone has no store to fall back from
		dc.Fallback = n.res.fallback
	}
	n.decider = decide.New(dc)
	n.admit = &admission{next: n.decider, max: int64(cmp.Or(cfg.MaxInFlight, DefaultMaxInFlight))}
	if err := n.startMultiRegion(); err != nil {
		return nil, errors.Join(err, n.closeAll())
	}
	lis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		n.closeAll()
		return nil, fmt.Errorf("listen on %s: %w", cfg.GRPCAddr, err)
	}
	n.lis = lis
	opts := append(cfg.Transport.grpcOptions(), cfg.GRPCLimits.serverOptions()...)
	opts = append(opts, server.MalformedIsInvalid(server.FanOut{ // what the RLQS handler takes
		Message: (&rlqsv3.RateLimitQuotaUsageReports{}).ProtoReflect().Descriptor().FullName(),
		Field:   2, Name: "bucket_quota_usages", Max: rlqs.MaxUsages,
	})...)
	opts = append(opts, n.grpcTelemetry()...)
	// Reuse stream goroutines: a fresh goroutine per call regrows its
	// stack through the handler's call depth every time (a tenth of the
	// node's CPU at 32 calls in flight). Calls beyond the workers still
	// get a goroutine of their own.
	opts = append(opts, grpc.NumStreamWorkers(streamWorkers))
	n.grpc = grpc.NewServer(opts...)
	server.NewGRPC(n.checker(), server.GRPCOptions{Observe: n.observeHook()}).Register(n.grpc)
	n.health = newHealthServer()
	healthpb.RegisterHealthServer(n.grpc, n.health)
	// Every service the listener serves has an entry, so a probe that
	// names the Envoy service (grpc-health-probe -service ...) is answered.
	n.health.SetServingStatus(ratelimitv1.RateLimiterService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	n.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	n.health.SetServingStatus(rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	n.watchStore()
	rlsv3.RegisterRateLimitServiceServer(n.grpc, server.NewEnvoy(n.checker(), server.EnvoyOptions{Observe: n.observeHook()}))
	if err := n.startRLQS(); err != nil {
		n.grpc.Stop()
		return nil, errors.Join(err, n.closeAll())
	}
	reflection.Register(n.grpc)
	go func() { n.served <- n.grpc.Serve(cfg.GRPCLimits.listener(lis)) }()
	if err := errors.Join(n.startHTTP(), n.startTelemetry()); err != nil {
		n.closing.Store(true)
		n.grpc.Stop()
		<-n.served
		return nil, errors.Join(err, n.closeHTTP(context.Background()), n.closeAll())
	}
	policies.run(n.decider)
	log.Info("node serving", "grpc", lis.Addr().String(), "store", n.storeName(), "policies", set.Len())
	return n, nil
}

func (n *Node) openStore(ctx context.Context) (decide.Store, error) {
	if len(n.cfg.Redis) == 0 {
		return memstore.New(nil), nil
	}
	call, err := n.cfg.Resilience.callTimeout()
	if err != nil {
		return nil, err
	}
	st, err := region.Open(ctx, n.cfg.Redis, n.cfg.Transport.region(n.cfg.Resilience.regionOptions(n, call)))
	if err != nil {
		return nil, fmt.Errorf("connect to region redis %v: %w", n.cfg.Redis, err)
	}
	m, err := lease.New(lease.Options{
		Source: n.leaseSource(st), Defaults: n.cfg.Lease, Logger: n.perRequestLog(), ColdExact: true,
		CallTimeout: n.cfg.Resilience.RedisMaxWait, // zero: 1 s, as a check waits
	})
	if err != nil {
		_ = st.Close()
		return nil, fmt.Errorf("lease manager: %w", err)
	}
	n.leases = m
	// The lease manager gives its unspent tokens back before Redis closes.
	n.closers = append(n.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return errors.Join(m.Close(ctx), st.Close())
	})
	return st, nil
}

// perRequestLog is the logger of the parts that log per request or per
// refill (the decider, the lease manager, RLQS): one line per message per
// 10 s, with the count suppressed, so an outage cannot flood the log.
// Those parts do not limit their lines themselves. One limiter for all,
// made on first use.
func (n *Node) perRequestLog() *slog.Logger {
	if n.reqLog == nil {
		n.reqLog = ratelog.New(n.log, ratelog.DefaultEvery, nil)
	}
	return n.reqLog
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

// checker is what the node's faces ask: the decider behind the bound on
// checks in flight.
func (n *Node) checker() server.Checker { return n.admit }

// Done is closed with the serve error when the gRPC server stops.
func (n *Node) Done() <-chan error { return n.served }

// Close stops the node gracefully: Shutdown with Config.DrainPeriod and
// nothing to cut it short.
func (n *Node) Close(timeout time.Duration) error {
	return n.Shutdown(context.Background(), n.cfg.DrainPeriod, timeout)
}

// Shutdown stops the node: health goes NOT_SERVING and /readyz 503, the
// node keeps serving for drain so that traffic moves away, then in-flight
// calls finish (up to timeout, then they are cut) and the store is
// closed. Closing the listeners at the instant the node went unready gave
// clients thousands of UNAVAILABLE at once.
//
// When ctx ends (allot-node: a second SIGINT or SIGTERM) the node stops at
// once: the rest of the drain is skipped and calls in flight are cut. The
// listeners, the store and the policy source still close as they would.
func (n *Node) Shutdown(ctx context.Context, drain, timeout time.Duration) error {
	n.closing.Store(true)
	n.health.Shutdown()
	// RLQS streams never end on their own: end them now, so that their
	// clients reconnect to another node while this one drains.
	n.rlqs.Drain()
	if drain > 0 {
		// The command says what it is doing (cmd/node); Close's callers
		// (tests, the sandbox) see it at debug level.
		n.log.Debug("not ready; draining before stopping", "drain_period", drain)
		t := time.NewTimer(drain)
		select { // serving goes on meanwhile: this is the drain
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	n.health.endWatches()
	// HTTP first, then gRPC, sharing one deadline; ctx's end cuts both.
	httpCtx, cancel := context.WithTimeout(ctx, timeout)
	httpErr := n.closeHTTP(httpCtx)
	deadline, _ := httpCtx.Deadline()
	cancel()
	stopped := make(chan struct{})
	go func() { n.grpc.GracefulStop(); close(stopped) }()
	grace := time.NewTimer(time.Until(deadline))
	defer grace.Stop()
	select {
	case <-stopped:
	case <-grace.C:
		n.log.Warn("graceful stop timed out; closing open calls", "timeout", timeout)
		n.grpc.Stop()
		<-stopped
	case <-ctx.Done():
		n.grpc.Stop()
		<-stopped
	}
	err := <-n.served
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return errors.Join(err, httpErr, n.closeAll())
}

// ListenAddrs are the addresses the node's listeners are bound to: gRPC,
// then HTTP, the proxy and metrics when they are on, the admin API and
// gossip (its configured bind address).
func (n *Node) ListenAddrs() []string {
	addrs := []string{n.Addr()}
	for _, l := range n.https {
		addrs = append(addrs, l.lis.Addr().String())
	}
	if a := n.AdminAddr(); a != "" {
		addrs = append(addrs, a)
	}
	if n.res.members != nil {
		addrs = append(addrs, n.cfg.Resilience.GossipAddr)
	}
	return addrs
}

// LoopbackOnly reports whether every listener of the node is bound to a
// loopback address. Such a node's callers are on its own host: no load
// balancer is there to see it go unready, so a drain only delays its
// stop.
func (n *Node) LoopbackOnly() bool {
	for _, a := range n.ListenAddrs() {
		if !IsLoopbackAddr(a) {
			return false
		}
	}
	return true
}

// IsLoopbackAddr reports whether addr (HOST:PORT) is bound to loopback
// only: localhost, 127.0.0.0/8 or ::1. An empty host, 0.0.0.0 and :: are
// every interface.
func IsLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

func (n *Node) closeAll() error {
	var errs []error
	for _, c := range n.closers {
		errs = append(errs, c())
	}
	n.closers = nil
	return errors.Join(errs...)
}
