// Command allot-node answers CheckRateLimit over gRPC, Envoy's
// RateLimitService on the same listener, and POST /v1/check over HTTP.
//
//	allot-node --policies examples/policies.yaml                 # standalone, in-process counters
//	allot-node --policies p.yaml --redis 10.0.0.1:6379           # region Redis (one instance)
//	allot-node --policies p.yaml --redis a:7000,b:7001,c:7002    # region Redis Cluster
//	allot-node --policies p.yaml --upstream http://127.0.0.1:9000 \
//	    --identity-api-key-header X-API-Key --trusted-proxies 10.0.0.0/8  # reverse proxy on --proxy-addr
//
//	allot-node --store nats://127.0.0.1:4222 --admin-addr 127.0.0.1:8070 --admin-token T   # live policies + admin API
//
// Every flag can also be set as an ALLOT_ environment variable
// (--grpc-addr is ALLOT_GRPC_ADDR); the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/telemetry"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/middleware"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "allot-node:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("allot-node", flag.ContinueOnError)
	grpcAddr := fs.String("grpc-addr", "127.0.0.1:8081", "gRPC listen address")
	redis := fs.String("redis", "", "comma-separated region Redis addresses; empty runs standalone with in-process counters")
	policies := fs.String("policies", "", "policy file (YAML or JSON), watched for changes; shorthand for --store file:PATH")
	store := fs.String("store", "", "policy store, watched for changes: file:PATH, nats://HOST:PORT (JetStream KV allot-policies) or postgres://...")
	adminAddr := fs.String("admin-addr", "", "admin API listen address (HOST:PORT); empty disables; off loopback it needs --admin-token")
	adminToken := fs.String("admin-token", "", "bearer token admin API writes must present")
	logger := cli.LogLevel(fs, "info", os.Stderr)
	shutdown := fs.Duration("shutdown-timeout", 10*time.Second, "how long in-flight calls may run after SIGTERM")
	drain := fs.Duration("drain-period", node.DefaultDrainPeriod, "after SIGTERM, how long the node keeps serving while /readyz answers 503 and gRPC health NOT_SERVING, before it stops (0: stop at once)")
	httpAddr := fs.String("http-addr", "127.0.0.1:8080", "HTTP listen address for POST /v1/check, /healthz, /readyz; empty disables")
	upstream := fs.String("upstream", "", "reverse-proxy mode: forward admitted requests to this http(s) URL")
	proxyAddr := fs.String("proxy-addr", "127.0.0.1:8090", "listen address of the reverse proxy (with --upstream)")
	apiKeyHeader := fs.String("identity-api-key-header", "", "proxy: request header holding the API key (client_identifier is its SHA-256 digest)")
	userHeader := fs.String("identity-user-header", "", "proxy: request header holding the user id (client_identifier when no API key)")
	tenantHeader := fs.String("identity-tenant-header", "", "proxy: request header holding the tenant id")
	trusted := fs.String("trusted-proxies", "", "proxy: comma-separated CIDRs whose X-Forwarded-For is believed")
	checkTimeout := fs.Duration("check-timeout", 20*time.Millisecond, "proxy: per-request check timeout, after which the request fails open")
	leaseTarget := fs.Duration("lease-target-period", lease.DefaultTargetPeriod, "leased policies: a grant is a key's recent rate times this (longer: fewer Redis calls, more tokens parked per node)")
	leaseTTL := fs.Duration("lease-ttl", lease.DefaultTTL, "leased policies: leased tokens are void this long after the lease was asked for; overshoot is at most rate x ttl")
	leaseLow := fs.Float64("lease-low-watermark", lease.DefaultLowWatermark, "leased policies: refill when this fraction of the last grant is left (higher: fewer waits, more held)")
	leaseColdHits := fs.Int("lease-cold-hits", lease.DefaultColdHits, "leased policies: a key is decided exactly (one Redis check each) until it shows this many checks within half --lease-ttl, and leases from then on (higher: fewer leases for keys at a few checks a second; 1-255)")
	leaseShare := fs.Float64("lease-max-share", lease.DefaultMaxShare, "leased policies: one grant is at most this fraction of the burst (lower: fairer between nodes, more calls)")
	metricsAddr := fs.String("metrics-addr", "", "listen address of GET /metrics (Prometheus); empty serves /metrics on --http-addr")
	maxInFlight := fs.Int("max-inflight", node.DefaultMaxInFlight, "most checks decided at once (every face; batch items count one at a time); more are shed at once: UNAVAILABLE (HTTP 503) \"node overloaded\", counted as outcome shed; negative: no bound")
	pprofOn := fs.Bool("pprof", false, "also serve the Go runtime profiles (/debug/pprof/) on --metrics-addr (required): for measuring a node")
	otlpEndpoint := fs.String("otlp-endpoint", "", "OTLP/gRPC collector for traces of checks (http://HOST:4317 plaintext, https:// TLS, or HOST:PORT plaintext); empty exports no spans")
	grpcMaxConns := fs.Int("grpc-max-connections", node.DefaultGRPCMaxConnections, "most gRPC connections served at once (more wait in the accept queue); -1: unlimited")
	grpcMaxStreams := fs.Uint("grpc-max-streams", node.DefaultGRPCMaxStreams, "most concurrent gRPC calls on one connection")
	grpcHandshake := fs.Duration("grpc-handshake-timeout", node.DefaultGRPCHandshakeTimeout, "a gRPC connection that has not finished its TLS handshake and HTTP/2 preface in this long is closed")
	grpcInFlight := fs.Int("grpc-max-inflight", node.DefaultGRPCMaxInFlight, "most gRPC calls in progress on the node; more are refused with UNAVAILABLE (node overloaded) before their message is read (bounds memory at about this x 3.1 MiB); -1: unlimited")
	grpcIdle := fs.Duration("grpc-idle-timeout", node.DefaultGRPCIdleTimeout, "a gRPC connection with no call in flight for this long is closed (clients reconnect)")
	gcPercent := fs.Int("gc-percent", defaultGCPercent, "Go GC target: the heap may grow this many percent over the live heap between collections (Go's GOGC; higher: less CPU spent collecting, more memory); the GOGC environment variable wins unless this flag is given; 0: Go's default (100)")
	maxProcs := fs.Int("gomaxprocs", 0, "Go's GOMAXPROCS: most OS threads running the node's Go code at once; 0: Go's default (the CPUs the node may use); the GOMAXPROCS environment variable wins unless this flag is given")
	res := resilienceFlags(fs)
	multi := multiRegionFlags(fs)
	transport := transportFlags(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	proxies, err := middleware.ParsePrefixes(*trusted)
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	log, err := logger()
	if err != nil {
		return err
	}
	setGCPercent(fs, *gcPercent, log)
	if *maxProcs < 0 {
		return fmt.Errorf("--gomaxprocs %d: want 0 (Go's default) or a positive count", *maxProcs)
	}
	setMaxProcs(fs, *maxProcs, log)
	if *leaseColdHits < 1 || *leaseColdHits > lease.MaxColdHits {
		return fmt.Errorf("--lease-cold-hits %d: want 1 to %d", *leaseColdHits, lease.MaxColdHits)
	}
	tr, err := transport(log)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tel, err := telemetry.New(ctx, telemetry.Config{Service: "allot-node", OTLPEndpoint: *otlpEndpoint, Logger: log})
	if err != nil {
		return err
	}
	// After the node closed: the last spans and the providers flush.
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("telemetry shutdown", "err", err)
		}
	}()
	n, err := node.Start(ctx, node.Config{
		GRPCAddr:     *grpcAddr,
		Redis:        splitList(*redis),
		PoliciesPath: *policies,
		StoreURL:     *store,
		AdminAddr:    *adminAddr,
		AdminToken:   *adminToken,
		Logger:       log,
		HTTPAddr:     *httpAddr,
		Upstream:     *upstream,
		ProxyAddr:    *proxyAddr,
		Identity: middleware.Identity{
			APIKeyHeader:   *apiKeyHeader,
			UserHeader:     *userHeader,
			TenantHeader:   *tenantHeader,
			TrustedProxies: proxies,
		},
		CheckTimeout:  *checkTimeout,
		Lease:         lease.Config{TargetPeriod: *leaseTarget, TTL: *leaseTTL, LowWatermark: *leaseLow, MaxShare: *leaseShare},
		LeaseColdHits: *leaseColdHits,
		Resilience:    res(),
		MultiRegion:   multi(),
		Transport:     tr,
		Telemetry:     tel,
		MetricsAddr:   *metricsAddr,
		Pprof:         *pprofOn,
		MaxInFlight:   *maxInFlight,
		DrainPeriod:   *drain,
		GRPCLimits: node.GRPCLimits{
			MaxConnections:   *grpcMaxConns,
			MaxStreams:       uint32(min(*grpcMaxStreams, math.MaxUint32)),
			HandshakeTimeout: *grpcHandshake,
			IdleTimeout:      *grpcIdle,
			MaxInFlight:      *grpcInFlight,
		},
	})
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down", "drain_period", *drain, "timeout", *shutdown)
	case err := <-n.Done():
		return fmt.Errorf("grpc server stopped: %w", err)
	case err := <-n.HTTPFailed():
		log.Error("http server stopped; shutting down", "err", err)
		return errors.Join(err, n.Close(*shutdown))
	}
	return n.Close(*shutdown)
}

// defaultGCPercent is the node's GC target. A node's live heap is small
// (policies, buckets, leases: megabytes) while each check allocates (the
// gRPC transport most of it), so at Go's default of 100 the collector runs
// many times a second under load: at 32 checks in flight on the exact
// path it took about a fifth of the node's CPU, and 400 cut the node's
// CPU per decision by 17-20 % (docs/benchmarks.md, "GC target"). The cost
// is memory: up to five times the live heap instead of twice.
const defaultGCPercent = 400

// setGCPercent applies --gc-percent, unless GOGC is set in the environment
// and the flag was not given (an operator's GOGC, or GOMEMLIMIT with
// GOGC=off, is kept).
func setGCPercent(fs *flag.FlagSet, pct int, log *slog.Logger) {
	if pct == 0 || !overridesEnv(fs, "gc-percent", "GOGC") {
		return
	}
	old := debug.SetGCPercent(pct)
	log.Debug("gc target", "gc_percent", pct, "was", old)
}

// setMaxProcs applies --gomaxprocs, unless GOMAXPROCS is set in the
// environment and the flag was not given. Fewer Go threads than CPUs
// pays where the node shares a small machine: on 2 vCPUs beside Redis and
// the load generator, one thread cut the node's CPU per exact decision by
// 18 % (fewer cross-CPU wake-ups, larger socket writes;
// docs/benchmarks.md, "GOMAXPROCS"); it also caps the node at that many
// CPUs, so Go's default (every CPU the node may use, within a cgroup
// quota) stays the default.
func setMaxProcs(fs *flag.FlagSet, n int, log *slog.Logger) {
	if n <= 0 || !overridesEnv(fs, "gomaxprocs", "GOMAXPROCS") {
		return
	}
	old := runtime.GOMAXPROCS(n)
	log.Debug("gomaxprocs", "gomaxprocs", n, "was", old)
}

// overridesEnv reports whether the runtime setting of flag name applies
// over Go's own environment variable env: the flag was given (on the
// command line or as ALLOT_*), or env is not set.
func overridesEnv(fs *flag.FlagSet, name, env string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given || os.Getenv(env) == ""
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
