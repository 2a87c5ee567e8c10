// Command allot-node answers CheckRateLimit over gRPC, Envoy's
// RateLimitService on the same listener, and POST /v1/check over HTTP.
//
//	allot-node --store examples/policies.yaml                    # standalone, in-process counters
//	allot-node --store p.yaml --redis 10.0.0.1:6379              # region Redis (one instance)
//	allot-node --store p.yaml --redis a:7000,b:7001,c:7002       # region Redis Cluster
//	ALLOT_REDIS=rediss://allot:PW@redis:6380 allot-node --store p.yaml --client-tls-ca ca.crt  # Redis over TLS with a user
//	allot-node --store p.yaml --upstream http://127.0.0.1:9000 \
//	    --identity-headers api-key=X-API-Key --trusted-proxies 10.0.0.0/8  # reverse proxy on --proxy-addr
//
//	allot-node --store nats://127.0.0.1:4222   # live policies (allot-coordinator serves the admin API)
//
// Every flag can also be set as an ALLOT_ environment variable
// (--grpc-addr is ALLOT_GRPC_ADDR); the command line wins. Knobs that are
// not flags are derived, fixed (ARCHITECTURE.md, "Fixed settings") or in
// the policy file's lease: block (docs/policies.md).
//
// SIGINT (Ctrl-C) or SIGTERM drains, then stops: for --drain-period the
// node answers unready while it still serves, so load balancers move
// away. A node whose listeners are all on loopback skips the default
// drain. A second signal stops it at once.
//
// This command only turns flags, the environment and signals into a
// node.Config with its telemetry, a start and a drained stop, and sets
// the GC target; everything a node does is package internal/node's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/cmd/internal/transportflags"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/telemetry"
	"github.com/allot-dev/allot/middleware"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "allot-node:", err)
		os.Exit(1)
	}
}

// flags are allot-node's command line (README, "Node flags"; the test
// there holds the two equal).
type flags struct {
	grpcAddr, redis, store, policies, httpAddr, metricsAddr *string
	adminAddr, adminToken                                   *string
	upstream, proxyAddr, identity, trusted                  *string
	drain                                                   *time.Duration
	maxInFlight                                             *int
	logger                                                  func() (*slog.Logger, error)
	res                                                     func() node.Resilience
	gossip                                                  func(*node.Resilience)
	multi                                                   func() node.MultiRegion
	transport                                               *transportflags.Flags
}

// register declares every flag of allot-node on fs.
func register(fs *flag.FlagSet) *flags {
	f := &flags{
		grpcAddr:    fs.String("grpc-addr", "127.0.0.1:8081", "gRPC listen address"),
		redis:       fs.String("redis", "", "region Redis: comma-separated HOST:PORT addresses (several: a cluster's seeds), or a URL redis[s]://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...] (rediss: TLS; put a password in ALLOT_REDIS, not on the command line); empty runs standalone with in-process counters"),
		store:       fs.String("store", "", "policy store, watched for changes: a policy file PATH (YAML or JSON; also file:PATH), nats://HOST:PORT (JetStream KV allot-policies) or postgres://..."),
		policies:    fs.String("policies", "", "policy file (YAML or JSON), watched for changes; shorthand for --store file:PATH"),
		adminAddr:   fs.String("admin-addr", "", "admin API listen address (HOST:PORT); empty disables; off loopback it needs --admin-token"),
		adminToken:  fs.String("admin-token", "", "bearer token admin API writes must present"),
		httpAddr:    fs.String("http-addr", "127.0.0.1:8080", "HTTP listen address for POST /v1/check, /healthz, /readyz; empty disables"),
		metricsAddr: fs.String("metrics-addr", "", "listen address of GET /metrics (Prometheus), and of the Go runtime profiles (/debug/pprof/) when it is a loopback address; empty serves /metrics on --http-addr"),
		upstream:    fs.String("upstream", "", "reverse-proxy mode: forward admitted requests to this http(s) URL"),
		proxyAddr:   fs.String("proxy-addr", "127.0.0.1:8090", "listen address of the reverse proxy (with --upstream)"),
		identity:    fs.String("identity-headers", "", "proxy: request headers identity comes from, comma-separated KIND=HEADER with KIND api-key (client_identifier is its SHA-256 digest), user (client_identifier when no API key) or tenant; e.g. api-key=X-API-Key,tenant=X-Tenant-ID"),
		trusted:     fs.String("trusted-proxies", "", "proxy: comma-separated CIDRs whose X-Forwarded-For is believed"),
		drain:       fs.Duration("drain-period", node.DefaultDrainPeriod, "after SIGINT or SIGTERM, how long the node keeps serving while /readyz answers 503 and gRPC health NOT_SERVING, before it stops (0: stop at once); calls in flight then get 10s more; a second signal stops at once; a node whose listeners are all on loopback skips the drain unless this is set"),
		maxInFlight: fs.Int("max-inflight", node.DefaultMaxInFlight, "concurrency: most checks decided at once (every face; batch items count one at a time); more are shed at once: UNAVAILABLE (HTTP 503) \"node overloaded\", counted as outcome shed; a quarter of it bounds the gRPC calls in progress (memory: each may hold a 3.1 MiB message); negative: no bound"),
	}
	f.logger = cli.LogLevel(fs, "info", os.Stderr)
	f.res = resilienceFlags(fs)
	f.gossip = gossipFlags(fs)
	f.multi = multiRegionFlags(fs)
	f.transport = transportflags.Register(fs, "gRPC, HTTP, metrics and proxy")
	return f
}

// shutdownTimeout is how long calls in flight may run after the drain
// period (ARCHITECTURE.md, "Fixed settings").
const shutdownTimeout = 10 * time.Second

func run(args []string) error {
	fs := flag.NewFlagSet("allot-node", flag.ContinueOnError)
	f := register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	proxies, err := middleware.ParsePrefixes(*f.trusted)
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	identity, err := parseIdentity(*f.identity)
	if err != nil {
		return err
	}
	identity.TrustedProxies = proxies
	log, err := f.logger()
	if err != nil {
		return err
	}
	setGCPercent(log)
	tr, redis, err := transport(f.transport, *f.redis, log)
	if err != nil {
		return err
	}
	res := f.res()
	f.gossip(&res)

	sigs := notifySignals(func(s os.Signal) {
		log.Info("second signal: stopping at once", "signal", signalName(s))
	})
	defer sigs.release()
	ctx := sigs.stop
	started := false
	defer func() { // the last line, once everything below has stopped
		if started {
			log.Info("node stopped")
		}
	}()
	tel, err := telemetry.New(ctx, telemetry.Config{Service: "allot-node", OTLPEndpoint: telemetry.EnvEndpoint(), Logger: log})
	if err != nil {
		return err
	}
	// After the node closed: the last spans and the providers flush (cut
	// by a second signal).
	defer func() {
		sctx, cancel := context.WithTimeout(sigs.now, 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil && sigs.now.Err() == nil {
			log.Warn("telemetry shutdown", "err", err)
		}
	}()
	n, err := node.Start(ctx, node.Config{
		GRPCAddr:     *f.grpcAddr,
		Redis:        redis,
		StoreURL:     storeURL(*f.store),
		PoliciesPath: *f.policies,
		AdminAddr:    *f.adminAddr,
		AdminToken:   *f.adminToken,
		Logger:       log,
		HTTPAddr:     *f.httpAddr,
		Upstream:     *f.upstream,
		ProxyAddr:    *f.proxyAddr,
		Identity:     identity,
		Resilience:   res,
		MultiRegion:  f.multi(),
		Transport:    tr,
		Telemetry:    tel,
		MetricsAddr:  *f.metricsAddr,
		Pprof:        node.IsLoopbackAddr(*f.metricsAddr), // profiles: this host only (kubectl port-forward)
		MaxInFlight:  *f.maxInFlight,
		DrainPeriod:  *f.drain,
		GRPCLimits: node.GRPCLimits{
			MaxConnections: node.DefaultGRPCMaxConnections,
			MaxInFlight:    grpcMaxInFlight(*f.maxInFlight),
		},
	})
	if err != nil {
		return err
	}
	started = true
	drain := drainPeriod(n, *f.drain, flagSet(fs, "drain-period"))
	select {
	case <-ctx.Done():
		logStopping(log, signalOf(ctx), drain, *f.drain)
		return n.Shutdown(sigs.now, drain, shutdownTimeout)
	case err := <-n.Done():
		return fmt.Errorf("grpc server stopped: %w", err)
	case err := <-n.HTTPFailed():
		log.Error("http server stopped; shutting down (a signal stops at once)", "err", err, "drain_period", drain)
		return errors.Join(err, n.Shutdown(ctx, drain, shutdownTimeout))
	}
}

// drainPeriod is how long the node drains once told to stop:
// --drain-period, except that a node whose listeners are all on loopback
// skips the default drain. Its callers are on this host and no load
// balancer needs time to see it unready, so a drain would only delay the
// stop. A --drain-period given explicitly (flag or ALLOT_DRAIN_PERIOD)
// holds even there: local callers (a sidecar proxy) may want one.
func drainPeriod(n *node.Node, drain time.Duration, explicit bool) time.Duration {
	if !explicit && n.LoopbackOnly() {
		return 0
	}
	return drain
}

// logStopping is the line the node logs when a signal tells it to stop:
// what it does now, for how long, and that a second signal stops it at
// once (a drain with no line looked like a hung process).
func logStopping(log *slog.Logger, sig string, drain, flagDrain time.Duration) {
	switch {
	case drain > 0:
		log.Info(fmt.Sprintf("draining for %v, then stopping: /readyz answers 503 and gRPC health NOT_SERVING while the node still serves, so load balancers move away; Ctrl-C again (a second SIGINT or SIGTERM) stops at once", drain),
			"signal", sig, "drain_period", drain)
	case flagDrain > 0:
		log.Info(fmt.Sprintf("stopping without a drain: every listener is on loopback, so no load balancer needs telling (an explicit --drain-period drains anyway); calls in flight get up to %v, Ctrl-C again cuts them", shutdownTimeout),
			"signal", sig)
	default:
		log.Info(fmt.Sprintf("stopping (--drain-period 0: no drain); calls in flight get up to %v, Ctrl-C again cuts them", shutdownTimeout),
			"signal", sig)
	}
}

// flagSet reports whether the flag name was given, on the command line or
// as its ALLOT_ variable (cli.Parse sets those through fs).
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// grpcMaxInFlight derives the bound on gRPC calls in progress from
// --max-inflight: a quarter of it (512 of the default 2048), since a call
// carries one check or a batch of them. It bounds memory (each call may
// hold a message of up to 3.1 MiB), where --max-inflight bounds
// concurrency. Negative stays "no bound"; zero takes the node's defaults.
func grpcMaxInFlight(maxInFlight int) int {
	switch {
	case maxInFlight < 0:
		return -1
	case maxInFlight == 0:
		return 0
	}
	return max(1, maxInFlight/4)
}

// parseIdentity reads --identity-headers: KIND=HEADER pairs.
func parseIdentity(s string) (middleware.Identity, error) {
	var id middleware.Identity
	for _, p := range cli.List(s) {
		kind, header, ok := strings.Cut(p, "=")
		header = strings.TrimSpace(header)
		var dst *string
		switch strings.TrimSpace(kind) {
		case "api-key":
			dst = &id.APIKeyHeader
		case "user":
			dst = &id.UserHeader
		case "tenant":
			dst = &id.TenantHeader
		}
		switch {
		case !ok || dst == nil || header == "":
			return id, fmt.Errorf("--identity-headers %q: want KIND=HEADER with KIND api-key, user or tenant", p)
		case *dst != "":
			return id, fmt.Errorf("--identity-headers: %s given twice", kind)
		}
		*dst = header
	}
	return id, nil
}

// storeURL is --store as a store URL: a path without a scheme is a
// policy file.
func storeURL(s string) string {
	if s == "" || strings.Contains(s, "://") || strings.HasPrefix(s, "file:") || strings.HasPrefix(s, "memory:") {
		return s
	}
	return "file:" + s
}

// defaultGCPercent is the node's GC target. A node's live heap is small
// (policies, buckets, leases: megabytes) while each check allocates (the
// gRPC transport most of it), so at Go's default of 100 the collector runs
// many times a second under load: at 32 checks in flight on the exact
// path it took about a fifth of the node's CPU, and 400 cut the node's
// CPU per decision by 17-20 % (docs/performance.md, "GC target"). The cost
// is memory: up to five times the live heap instead of twice.
const defaultGCPercent = 400

// setGCPercent applies defaultGCPercent unless GOGC is set in the
// environment (an operator's GOGC, or GOMEMLIMIT with GOGC=off, is kept).
func setGCPercent(log *slog.Logger) {
	if os.Getenv("GOGC") != "" {
		return
	}
	old := debug.SetGCPercent(defaultGCPercent)
	log.Debug("gc target", "gc_percent", defaultGCPercent, "was", old)
}
