package node

import (
	"context"
	"errors"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/internal/telemetry"
	"github.com/allot-dev/allot/lease"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/region"
)

// This file wires Config.Telemetry into the node: decisions are counted
// at the server faces' Observe hooks (never inside the decider or the
// lease manager, whose leased path stays allocation-free), Redis calls at
// a thin wrapper around the region store, lease and breaker figures by
// observable instruments reading Stats() and Shards() at scrape time, and
// spans by the gRPC stats handler and the HTTP middleware of
// OpenTelemetry's contrib packages, when tracing is configured.

// observe is the server faces' Observe hook.
func (n *Node) observe(ctx context.Context, ev server.Event) {
	n.cfg.Telemetry.ObserveCheck(ctx, ev.Face, ev.Decision, ev.Err, ev.Elapsed)
}

// observeHook is observe, or nil without telemetry so that the faces skip
// their timing entirely.
func (n *Node) observeHook() func(context.Context, server.Event) {
	if n.cfg.Telemetry == nil {
		return nil
	}
	return n.observe
}

// grpcTelemetry is the gRPC server options telemetry adds: a stats
// handler that opens a server span per check, only when spans are
// exported (the handler costs even with a no-op tracer).
func (n *Node) grpcTelemetry() []grpc.ServerOption {
	tel := n.cfg.Telemetry
	if !tel.Tracing() {
		return nil
	}
	check := "/" + ratelimitv1.RateLimiterService_ServiceDesc.ServiceName + "/"
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(tel.TracerProvider()),
		// Only allot_* metrics: otelgrpc's own rpc.server.* would add a
		// second, differently named view of the same calls.
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgrpc.WithPropagators(tel.Propagator()),
		// Checks only (ours and Envoy's): health probes and reflection
		// would drown them.
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
			return strings.HasPrefix(info.FullMethodName, check) ||
				strings.HasPrefix(info.FullMethodName, "/envoy.service.ratelimit.")
		}),
	))}
}

// httpTelemetry wraps the HTTP face: a span per POST /v1/check when
// tracing, and /metrics on this listener when Config.MetricsAddr is
// empty. /metrics is outside the traced handler so scrapes make no spans.
func (n *Node) httpTelemetry(h http.Handler) http.Handler {
	tel := n.cfg.Telemetry
	if tel == nil {
		return h
	}
	if tel.Tracing() {
		h = otelhttp.NewHandler(h, "POST /v1/check",
			otelhttp.WithTracerProvider(tel.TracerProvider()),
			otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
			otelhttp.WithPropagators(tel.Propagator()),
			otelhttp.WithFilter(func(r *http.Request) bool { return r.URL.Path == "/v1/check" }))
	}
	if n.cfg.MetricsAddr != "" {
		return h
	}
	mux := n.metricsMux(tel)
	mux.Handle("/", h)
	return mux
}

// metricsMux serves /metrics, and the profiles with --pprof: on the
// metrics listener, or on the HTTP one when there is no metrics address.
func (n *Node) metricsMux(tel *telemetry.Telemetry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.Handler())
	if n.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// startTelemetry registers the observable lease and breaker instruments
// and, with Config.MetricsAddr, serves /metrics on a listener of its own.
// It runs once the store, the lease manager and the breakers exist.
func (n *Node) startTelemetry() error {
	tel := n.cfg.Telemetry
	if tel == nil {
		if n.cfg.MetricsAddr != "" {
			return errors.New("metrics address is set but the node has no Telemetry")
		}
		return nil
	}
	if n.leases != nil {
		stop, err := tel.ObserveLeases(n.leases.Stats)
		if err != nil {
			return err
		}
		n.closers = append(n.closers, stop)
	}
	if n.policies != nil && n.policies.reloader != nil {
		stop, err := tel.ObservePolicies(func() telemetry.PolicyStats {
			st := n.PolicyStatus()
			return telemetry.PolicyStats{AppliedRevision: uint64(st.Applied), AppliedAt: st.AppliedAt, Policies: st.Policies,
				Rejections: st.Rejections, Rejected: st.Err != nil}
		})
		if err != nil {
			return err
		}
		n.closers = append(n.closers, stop)
	}
	if n.res.store != nil {
		stop, err := tel.ObserveBreakers(n.res.store.Shards)
		if err != nil {
			return err
		}
		n.closers = append(n.closers, stop)
		stop, err = tel.ObserveStore(n.res.store.Stats)
		if err != nil {
			return err
		}
		n.closers = append(n.closers, stop)
	}
	if n.cfg.MetricsAddr == "" {
		if n.cfg.Pprof {
			return errors.New("pprof needs a metrics address (--metrics-addr): profiles are not served on the public HTTP listener")
		}
		if n.cfg.HTTPAddr == "" {
			n.log.Warn("no /metrics: --metrics-addr is empty and the HTTP listener is disabled")
		}
		return nil
	}
	srv := &http.Server{Handler: n.metricsMux(tel), ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	return n.serveHTTP("metrics", n.cfg.MetricsAddr, srv)
}

// MetricsAddr is the address /metrics is served on: the metrics listener,
// else the HTTP listener; "" without telemetry.
func (n *Node) MetricsAddr() string {
	if n.cfg.Telemetry == nil {
		return ""
	}
	if a := n.httpAddr("metrics"); a != "" {
		return a
	}
	return n.HTTPAddr()
}

// observedStore is the region store with every call timed and counted
// (allot_redis_calls_total, allot_redis_call_duration_seconds). It wraps
// only the decider's and the lease manager's view of the store: the node
// keeps the *region.Store itself for breakers and health.
type observedStore struct {
	*region.Store
	tel *telemetry.Telemetry
}

// instrument returns st observed, or st itself without telemetry or Redis.
func (n *Node) instrument(st decide.Store) decide.Store {
	rs, ok := st.(*region.Store)
	if !ok || n.cfg.Telemetry == nil {
		return st
	}
	return observedStore{rs, n.cfg.Telemetry}
}

// leaseSource is the lease manager's view of rs.
func (n *Node) leaseSource(rs *region.Store) lease.Source {
	if n.cfg.Telemetry == nil {
		return rs
	}
	return observedStore{rs, n.cfg.Telemetry}
}

func (s observedStore) Take(ctx context.Context, groups []algorithm.Group) ([]algorithm.Result, error) {
	start := time.Now()
	res, err := s.Store.Take(ctx, groups)
	s.tel.ObserveRedis(ctx, "take", err, time.Since(start))
	return res, err
}

func (s observedStore) Refund(ctx context.Context, groups []algorithm.Group) error {
	start := time.Now()
	err := s.Store.Refund(ctx, groups)
	s.tel.ObserveRedis(ctx, "refund", err, time.Since(start))
	return err
}

func (s observedStore) Lease(ctx context.Context, groups []lease.Group) ([]lease.Reply, error) {
	start := time.Now()
	res, err := s.Store.Lease(ctx, groups)
	// A lease call fails per group (lease.Reply.Err); count the call as
	// failed by its first failure, but hand the results back untouched.
	failed := err
	for i := 0; failed == nil && i < len(res); i++ {
		failed = res[i].Err
	}
	s.tel.ObserveRedis(ctx, "lease", failed, time.Since(start))
	return res, err
}

func (s observedStore) Return(ctx context.Context, items []lease.ReturnItem) (int64, error) {
	start := time.Now()
	n, err := s.Store.Return(ctx, items)
	s.tel.ObserveRedis(ctx, "return", err, time.Since(start))
	return n, err
}
