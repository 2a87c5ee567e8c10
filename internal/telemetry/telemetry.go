// Package telemetry sets up Allot's OpenTelemetry providers and
// instruments: a MeterProvider read by a Prometheus exporter into a
// registry of its own (served by Handler at /metrics), and a
// TracerProvider that exports over OTLP when an endpoint is configured
// and is a no-op otherwise.
//
// Nothing here is global: no otel.Set*Provider, no
// prometheus.DefaultRegisterer. Callers pass the providers on explicitly
// (node, cmd/coordinator), so two nodes in one test process keep separate
// metrics.
//
// Every metric name starts with allot_ and every label is bounded by the
// deployment (policy id, outcome, face, Redis op, shard address), never
// by traffic (tenant, client, key): a label per key would grow the scrape
// and the exporter's memory with every new caller. The package records
// through small methods (ObserveCheck, ObserveRedis, ObserveRebalance)
// and reads existing Stats() through observable instruments, so the
// packages below the node need no import of it and the leased decision
// path gets no extra work.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of Allot's meters and tracers.
const ScopeName = "github.com/allot-dev/allot"

// Config configures New.
type Config struct {
	// Service is the service.name resource attribute of spans
	// ("allot-node", "allot-coordinator").
	Service string
	// OTLPEndpoint is where spans go over OTLP/gRPC: a URL
	// (http://collector:4317 is plaintext, https:// uses TLS) or a bare
	// host:port (plaintext). Empty: no spans are exported and the tracer
	// is a no-op.
	OTLPEndpoint string
	// SpanExporter, when set, receives spans synchronously instead of
	// OTLP (tests: tracetest.InMemoryExporter).
	SpanExporter sdktrace.SpanExporter
	Logger       *slog.Logger
}

// Telemetry owns the providers and Allot's instruments. Its methods are
// safe for concurrent use; a nil *Telemetry records nothing.
type Telemetry struct {
	log      *slog.Logger
	registry *prometheus.Registry
	meters   *sdkmetric.MeterProvider
	tracers  trace.TracerProvider
	sdkTrace *sdktrace.TracerProvider // nil when tracing is off
	meter    metric.Meter
	tracer   trace.Tracer

	decisions        *tally
	degraded         *tally
	decisionDuration metric.Float64Histogram
	redisCalls       *tally
	redisDuration    metric.Float64Histogram
	rebalance        rebalanceInstruments

	// attrs caches measurement options per label combination: building
	// an attribute set per check would allocate on every decision. Its
	// size is bounded like the labels (policies x outcomes, ops x results).
	// A sync.Map (attrKey → options): its reads take no lock, where an
	// RWMutex's read lock is a shared write on every decision.
	attrs sync.Map
	// The hot label sets (node.go): built in New, then read-only, but
	// policies, which a reload can add to.
	faces    map[string]options
	ops      map[string]*labelOptions
	policies sync.Map // policy ID → *labelOptions

	mu   sync.Mutex
	regs []metric.Registration // observable callbacks, unregistered by Shutdown
}

type attrKey struct{ ka, a, kb, b string }

// options are one attribute set as ready-made variadic arguments: a
// slice built per call would escape to the heap through the interface.
type options struct {
	add []metric.AddOption
	rec []metric.RecordOption
	obs []metric.ObserveOption
}

// New builds the providers and instruments. ctx bounds only setup.
func New(ctx context.Context, cfg Config) (*Telemetry, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Service == "" {
		cfg.Service = "allot"
	}
	t := &Telemetry{log: log, registry: prometheus.NewRegistry()}
	// Scope labels (otel_scope_name, ...) would be repeated on every
	// series and say nothing a reader of allot_* does not know.
	exp, err := promexporter.New(promexporter.WithRegisterer(t.registry), promexporter.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", cfg.Service))
	mopts := []sdkmetric.Option{sdkmetric.WithReader(exp), sdkmetric.WithResource(res)}
	if cfg.SpanExporter == nil && cfg.OTLPEndpoint == "" && os.Getenv("OTEL_METRICS_EXEMPLAR_FILTER") == "" {
		// No spans, so no exemplar can ever be kept; the default
		// trace-based filter would still look for a span in every
		// measurement's context (a walk up the gRPC context chain, four
		// times per check).
		mopts = append(mopts, sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	}
	t.meters = sdkmetric.NewMeterProvider(mopts...)
	t.meter = t.meters.Meter(ScopeName)
	if err := t.instruments(); err != nil {
		return nil, errors.Join(err, t.meters.Shutdown(ctx))
	}
	t.faces = make(map[string]options, len(checkFaces))
	for _, f := range checkFaces {
		t.faces[f] = t.option("face", f, "", "")
	}
	t.ops = make(map[string]*labelOptions, len(redisOps))
	for _, op := range redisOps {
		t.ops[op] = t.newLabelOptions(nil, t.redisCalls, "op", op, "result", redisResults)
	}
	switch {
	case cfg.SpanExporter != nil:
		t.sdkTrace = sdktrace.NewTracerProvider(sdktrace.WithSyncer(cfg.SpanExporter), sdktrace.WithResource(res))
	case cfg.OTLPEndpoint != "":
		se, err := otlptracegrpc.New(ctx, otlpOptions(cfg.OTLPEndpoint)...)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("telemetry: otlp exporter %s: %w", cfg.OTLPEndpoint, err), t.meters.Shutdown(ctx))
		}
		// Batched: a span's export never waits on the request path.
		t.sdkTrace = sdktrace.NewTracerProvider(sdktrace.WithBatcher(se), sdktrace.WithResource(res))
		log.Info("tracing to OTLP", "endpoint", cfg.OTLPEndpoint)
	}
	if t.sdkTrace != nil {
		t.tracers = t.sdkTrace
	} else {
		t.tracers = tracenoop.NewTracerProvider()
	}
	t.tracer = t.tracers.Tracer(ScopeName)
	return t, nil
}

// EnvEndpoint is Config.OTLPEndpoint as OpenTelemetry's standard
// variables give it: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else
// OTEL_EXPORTER_OTLP_ENDPOINT (what collectors' documentation and
// operators set for every OTel SDK; the commands take no flag for it).
func EnvEndpoint() string {
	if e := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); e != "" {
		return e
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
}

func otlpOptions(endpoint string) []otlptracegrpc.Option {
	if strings.Contains(endpoint, "://") {
		if u, err := url.Parse(endpoint); err == nil && u.Scheme == "http" {
			return []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(endpoint), otlptracegrpc.WithInsecure()}
		}
		return []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(endpoint)}
	}
	return []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(endpoint), otlptracegrpc.WithInsecure()}
}

func (t *Telemetry) instruments() error {
	m := t.meter
	var errs []error
	keep := func(err error) { errs = append(errs, err) }
	var err error
	// The exporter appends _total to counters and _seconds / _bytes for
	// the units, so the names below become allot_decisions_total,
	// allot_decision_duration_seconds, ...
	t.decisions, err = t.newTally("allot_decisions", "Checks decided, by deciding policy and outcome (allowed, throttled, failed_open, error).")
	keep(err)
	t.degraded, err = t.newTally("allot_decisions_degraded", "Checks answered without the region's count, by the deciding policy's on_store_failure (open, closed or the local fallback), by policy.")
	keep(err)
	t.decisionDuration, err = m.Float64Histogram("allot_decision_duration", metric.WithUnit("s"),
		metric.WithDescription("Time to answer one check, by face (grpc, http, envoy)."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	keep(err)
	t.redisCalls, err = t.newTally("allot_redis_calls", "Calls to the region Redis, by op (take, refund, lease, return) and result (ok, error, timeout, unavailable).")
	keep(err)
	t.redisDuration, err = m.Float64Histogram("allot_redis_call_duration", metric.WithUnit("s"),
		metric.WithDescription("Latency of one pipelined call to the region Redis, by op."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	keep(err)
	keep(t.rebalanceInstruments())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: instruments: %w", err)
	}
	tallies := []*tally{t.decisions, t.degraded, t.redisCalls}
	insts := make([]metric.Observable, len(tallies))
	for i, tl := range tallies {
		insts[i] = tl.inst
	}
	_, err = t.register(func(_ context.Context, o metric.Observer) error {
		for _, tl := range tallies {
			tl.observe(o)
		}
		return nil
	}, insts...)
	return err
}

// latencyBuckets span 50 µs to 1 s: leased checks take microseconds,
// exact ones a Redis round trip, and anything near a second is an outage.
var latencyBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// Handler serves the Prometheus text exposition of this Telemetry's
// registry (mount it at /metrics).
func (t *Telemetry) Handler() http.Handler {
	return promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(t.log.Handler(), slog.LevelWarn)})
}

// Registry is the Prometheus registry the exporter writes to.
func (t *Telemetry) Registry() *prometheus.Registry { return t.registry }

// MeterProvider is the provider of Allot's meters.
func (t *Telemetry) MeterProvider() metric.MeterProvider { return t.meters }

// TracerProvider is the OTLP-backed provider, or a no-op one without an
// endpoint.
func (t *Telemetry) TracerProvider() trace.TracerProvider { return t.tracers }

// Tracer is Allot's tracer.
func (t *Telemetry) Tracer() trace.Tracer { return t.tracer }

// Tracing reports whether spans are exported; without it callers skip
// instrumenting their servers, which costs even with a no-op tracer.
func (t *Telemetry) Tracing() bool { return t != nil && t.sdkTrace != nil }

// Propagator is the W3C trace-context propagator the instrumented
// servers read incoming parents with (passed explicitly: no global).
func (t *Telemetry) Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Shutdown unregisters the observable callbacks, flushes spans and stops
// the providers. ctx bounds the flush.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	var errs []error
	for _, r := range t.regs {
		errs = append(errs, r.Unregister())
	}
	t.regs = nil
	t.mu.Unlock()
	if t.sdkTrace != nil {
		if err := t.sdkTrace.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("telemetry: tracer shutdown: %w", err))
		}
	}
	if err := t.meters.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("telemetry: meter shutdown: %w", err))
	}
	return errors.Join(errs...)
}

// register keeps a callback's registration so Shutdown (or the returned
// func) can drop it: a node that closes must stop being read.
func (t *Telemetry) register(cb metric.Callback, insts ...metric.Observable) (func() error, error) {
	r, err := t.meter.RegisterCallback(cb, insts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: register callback: %w", err)
	}
	t.mu.Lock()
	t.regs = append(t.regs, r)
	t.mu.Unlock()
	return r.Unregister, nil
}

// option returns the cached options for the attribute pair (ka=a,
// kb=b); kb "" means one attribute.
func (t *Telemetry) option(ka, a, kb, b string) options {
	k := attrKey{ka, a, kb, b}
	if o, ok := t.attrs.Load(k); ok {
		return o.(options)
	}
	kvs := []attribute.KeyValue{attribute.String(ka, a)}
	if kb != "" {
		kvs = append(kvs, attribute.String(kb, b))
	}
	m := metric.WithAttributeSet(attribute.NewSet(kvs...))
	o, _ := t.attrs.LoadOrStore(k, options{add: []metric.AddOption{m}, rec: []metric.RecordOption{m}, obs: []metric.ObserveOption{m}})
	return o.(options)
}
