package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// Outcome label values of allot_decisions_total.
const (
	OutcomeAllowed    = "allowed"
	OutcomeThrottled  = "throttled"
	OutcomeFailedOpen = "failed_open"
	OutcomeError      = "error" // bad input or an internal failure: no decision
	OutcomeShed       = "shed"  // the node was overloaded and shed the check: no decision
)

// NoPolicy is the policy label of checks no policy applied to (allowed
// without a limit) and of checks that failed before a decision.
const NoPolicy = "none"

func outcome(o decide.Outcome) string {
	switch o {
	case decide.Allowed:
		return OutcomeAllowed
	case decide.Throttled:
		return OutcomeThrottled
	case decide.FailedOpen:
		return OutcomeFailedOpen
	}
	return "unknown"
}

// ObserveCheck records one answered check of face ("grpc", "http",
// "envoy"): allot_decisions_total{policy,outcome} by the deciding policy
// (d.PolicyID), and allot_decision_duration_seconds{face}. d is nil when
// err is set. It is the body of the server packages' Observe hooks.
func (t *Telemetry) ObserveCheck(ctx context.Context, face string, d *decide.Decision, err error, elapsed time.Duration) {
	if t == nil {
		return
	}
	policy, out := NoPolicy, OutcomeError
	if err != nil && decide.IsOverloaded(err) {
		out = OutcomeShed
	}
	if err == nil && d != nil {
		out = outcome(d.Outcome)
		if d.PolicyID != "" {
			policy = d.PolicyID
		}
	}
	po := t.policyOptions(policy)
	t.pair(po, t.decisions, "policy", policy, "outcome", out).n.Add(1)
	// Answers by on_store_failure (open, closed, the local fallback) are
	// also allowed or throttled above; this counter is what says the
	// region's count was not consulted, for dashboards and alerts.
	if err == nil && d != nil && d.Degraded {
		po.oneCell.n.Add(1)
	}
	fo, ok := t.faces[face]
	if !ok {
		fo = t.option("face", face, "", "")
	}
	t.decisionDuration.Record(ctx, elapsed.Seconds(), fo.rec...)
}

// The label values a check's telemetry takes on every call have their
// measurement options built once, in plain maps read without a lock
// (faces, ops and results are fixed sets; a policy's outcomes are built
// when the policy is first seen). The general cache, option, hashes a key
// of four strings through an interface on every lookup: four lookups
// were a third of a check's telemetry (BenchmarkObserveCheck).
var (
	checkFaces   = []string{"grpc", "http", "envoy"}
	redisOps     = []string{"take", "refund", "lease", "return"}
	redisResults = []string{ResultOK, ResultError, ResultTimeout, ResultUnavailable, ResultShed}
	outcomes     = []string{OutcomeAllowed, OutcomeThrottled, OutcomeFailedOpen, OutcomeError, OutcomeShed, "unknown"}
)

// labelOptions are one label value's (policy=P, op=O): its options, for
// the histograms, and its tally cells: of the value alone (oneCell, nil
// when no counter takes it alone) and of it paired with each value of a
// second, fixed label (outcome=..., result=...). Read-only once built.
type labelOptions struct {
	one     options
	oneCell *cell
	pairs   map[string]*cell
}

// newLabelOptions builds ka=a's: its pairs with kb's values bs in pairs,
// and the value alone in one (nil: none).
func (t *Telemetry) newLabelOptions(one, pairs *tally, ka, a, kb string, bs []string) *labelOptions {
	lo := &labelOptions{one: t.option(ka, a, "", ""), pairs: make(map[string]*cell, len(bs))}
	if one != nil {
		lo.oneCell = t.cell(one, ka, a, "", "")
	}
	for _, b := range bs {
		lo.pairs[b] = t.cell(pairs, ka, a, kb, b)
	}
	return lo
}

// pair is the cell of ka=a, kb=b in tl, where lo is a's: prebuilt when b
// is one of lo's values.
func (t *Telemetry) pair(lo *labelOptions, tl *tally, ka, a, kb, b string) *cell {
	if c, ok := lo.pairs[b]; ok {
		return c
	}
	return t.cell(tl, ka, a, kb, b)
}

// policyOptions is policy's options, built on first sight. Policies are
// bounded by the loaded files (and every policy ever loaded stays, as
// its series do).
func (t *Telemetry) policyOptions(policy string) *labelOptions {
	if lo, ok := t.policies.Load(policy); ok {
		return lo.(*labelOptions)
	}
	lo, _ := t.policies.LoadOrStore(policy, t.newLabelOptions(t.degraded, t.decisions, "policy", policy, "outcome", outcomes))
	return lo.(*labelOptions)
}

// Redis result label values of allot_redis_calls_total.
const (
	ResultOK          = "ok"
	ResultError       = "error"
	ResultTimeout     = "timeout"     // the call's deadline passed
	ResultUnavailable = "unavailable" // the shard's breaker is open: not sent
	ResultShed        = "shed"        // this node shed the call (overloaded), the shard was healthy
)

// ObserveRedis records one call to the region Redis: op is "take",
// "refund", "lease" or "return"; err is the call's error (nil: ok).
func (t *Telemetry) ObserveRedis(ctx context.Context, op string, err error, elapsed time.Duration) {
	if t == nil {
		return
	}
	result := redisResult(err)
	lo, ok := t.ops[op]
	if !ok {
		lo = &labelOptions{one: t.option("op", op, "", "")}
	}
	t.pair(lo, t.redisCalls, "op", op, "result", result).n.Add(1)
	t.redisDuration.Record(ctx, elapsed.Seconds(), lo.one.rec...)
	t.redisSpan(ctx, op, result, err, elapsed)
}

// redisSpan records the call as a client span "redis.OP" under the
// check's span in ctx, after the fact (start = now - elapsed), so the
// store path carries no tracing code. Calls without a sampled parent (the
// lease manager's background refills and returns) make no span: they
// would each be a root trace of their own.
func (t *Telemetry) redisSpan(ctx context.Context, op, result string, err error, elapsed time.Duration) {
	if t.sdkTrace == nil || !trace.SpanContextFromContext(ctx).IsSampled() {
		return
	}
	end := time.Now()
	_, span := t.tracer.Start(ctx, "redis."+op, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(end.Add(-elapsed)),
		trace.WithAttributes(attribute.String("db.system.name", "redis"), attribute.String("allot.redis.op", op), attribute.String("allot.redis.result", result)))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, result)
	}
	span.End(trace.WithTimestamp(end))
}

// redisResult classifies a store call's error. A stall
// (region.ErrStalled) and a socket timeout (go-redis's "i/o timeout", a
// net.Error) are timeouts like a passed deadline; a call refused by an
// open breaker is unavailable.
func redisResult(err error) string {
	switch {
	case err == nil:
		return ResultOK
	case decide.IsOverloaded(err):
		return ResultShed
	case errors.Is(err, context.DeadlineExceeded), netTimeout(err):
		return ResultTimeout
	case errors.Is(err, region.ErrUnavailable):
		return ResultUnavailable
	}
	return ResultError
}

// netTimeout reports a net.Error timeout. Its own function so that the
// target errors.As needs escapes only when there is an error: a call that
// succeeded costs no allocation.
func netTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ObserveLeases exposes a lease manager's counters, read from stats at
// every scrape (nothing is added to the leased decision path):
// allot_lease_refills_total (lease round trips to Redis),
// allot_lease_refill_groups_total (lease script calls),
// allot_lease_tokens_granted_total, allot_lease_tokens_returned_total,
// allot_lease_denials_total, allot_lease_evictions_total and the gauge
// allot_lease_keys. The returned func stops reading stats (call it when
// the manager closes); Shutdown does too.
func (t *Telemetry) ObserveLeases(stats func() lease.Stats) (func() error, error) {
	m := t.meter
	refills, e1 := m.Int64ObservableCounter("allot_lease_refills", metric.WithDescription("Lease round trips to the region Redis (one pipeline of lease script calls each)."))
	groups, e2 := m.Int64ObservableCounter("allot_lease_refill_groups", metric.WithDescription("Lease script calls (one per key group refilled)."))
	granted, e3 := m.Int64ObservableCounter("allot_lease_tokens_granted", metric.WithDescription("Tokens the region granted to this node's leases."))
	returned, e4 := m.Int64ObservableCounter("allot_lease_tokens_returned", metric.WithDescription("Unspent leased tokens credited back to the region."))
	denials, e5 := m.Int64ObservableCounter("allot_lease_denials", metric.WithDescription("Lease calls the region could not serve."))
	evicted, e6 := m.Int64ObservableCounter("allot_lease_evictions", metric.WithDescription("Idle lease keys evicted."))
	keys, e7 := m.Int64ObservableGauge("allot_lease_keys", metric.WithDescription("Keys holding a lease on this node now."))
	if err := errors.Join(e1, e2, e3, e4, e5, e6, e7); err != nil {
		return nil, fmt.Errorf("telemetry: lease instruments: %w", err)
	}
	return t.register(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(refills, s.Calls)
		o.ObserveInt64(groups, s.Groups)
		o.ObserveInt64(granted, s.Granted)
		o.ObserveInt64(returned, s.Returned)
		o.ObserveInt64(denials, s.Denials)
		o.ObserveInt64(evicted, s.Evicted)
		o.ObserveInt64(keys, int64(s.Keys))
		return nil
	}, refills, groups, granted, returned, denials, evicted, keys)
}

// ObserveBreakers exposes allot_breaker_state{shard} (0 closed, 1
// half-open, 2 open) and allot_breaker_openings_total{shard} from shards
// at every scrape. Shards are the region's Redis masters: bounded by the
// deployment; each is reported for as long as it masters slots, busy or
// idle.
func (t *Telemetry) ObserveBreakers(shards func() []region.ShardHealth) (func() error, error) {
	state, e1 := t.meter.Int64ObservableGauge("allot_breaker_state",
		metric.WithDescription("Circuit breaker of each region Redis shard: 0 closed, 1 half-open, 2 open."))
	openings, e2 := t.meter.Int64ObservableCounter("allot_breaker_openings",
		metric.WithDescription("Times the circuit breaker of each region Redis shard opened."))
	if err := errors.Join(e1, e2); err != nil {
		return nil, fmt.Errorf("telemetry: breaker instruments: %w", err)
	}
	return t.register(func(_ context.Context, o metric.Observer) error {
		for _, h := range shards() {
			opt := t.option("shard", h.Shard, "", "").obs
			o.ObserveInt64(state, breakerValue(h.State), opt...)
			o.ObserveInt64(openings, int64(h.Openings), opt...)
		}
		return nil
	}, state, openings)
}

// ObserveStore exposes the region store's counters at every scrape:
// allot_store_round_trips_total (pipelines sent), allot_store_calls_total
// (store calls in them, one per group: calls per round trip is the coalescing),
// allot_store_stalls_total (shards judged stalled) and
// allot_store_shed_total (calls shed because this node was overloaded).
func (t *Telemetry) ObserveStore(stats func() region.StoreStats) (func() error, error) {
	m := t.meter
	trips, e1 := m.Int64ObservableCounter("allot_store_round_trips", metric.WithDescription("Pipelines sent to the region Redis (calls to one shard coalesced)."))
	calls, e2 := m.Int64ObservableCounter("allot_store_calls", metric.WithDescription("Store calls (one group's check, refund, lease or return) sent to the region Redis; the token-bucket checks of one round trip share one EVALSHA."))
	stalls, e3 := m.Int64ObservableCounter("allot_store_stalls", metric.WithDescription("Times a region Redis shard was judged stalled (calls held, nothing received)."))
	shed, e4 := m.Int64ObservableCounter("allot_store_shed", metric.WithDescription("Store calls shed because this node was overloaded (the shard was healthy)."))
	if err := errors.Join(e1, e2, e3, e4); err != nil {
		return nil, fmt.Errorf("telemetry: store instruments: %w", err)
	}
	return t.register(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(trips, s.Pipelines)
		o.ObserveInt64(calls, s.Calls)
		o.ObserveInt64(stalls, s.Stalls)
		o.ObserveInt64(shed, s.Shed)
		return nil
	}, trips, calls, stalls, shed)
}

func breakerValue(s region.BreakerState) int64 {
	switch s {
	case region.BreakerClosed:
		return 0
	case region.BreakerHalfOpen:
		return 1
	}
	return 2
}

// PolicyStats is what ObservePolicies reports of a node's policy reloader.
type PolicyStats struct {
	AppliedRevision uint64    // revision of the set in force
	AppliedAt       time.Time // when it was applied
	Policies        int       // policies in it
	Rejections      uint64    // snapshots rejected since start
	Rejected        bool      // the latest snapshot was rejected (the set in force is older)
}

// ObservePolicies registers the policy-set instruments, read from stats
// at each collection, so a rejected push is visible to alerting and not
// only in the log: allot_policy_set_rejections (counter),
// allot_policy_set_rejected (1 while the store's latest set is rejected),
// allot_policy_set_applied_timestamp (unix seconds),
// allot_policy_set_applied_revision (the store's revision: a sequence for
// NATS and PostgreSQL, a content hash for a file, so only its changes
// mean something) and allot_policy_set_policies.
func (t *Telemetry) ObservePolicies(stats func() PolicyStats) (func() error, error) {
	m := t.meter
	rejections, err1 := m.Int64ObservableCounter("allot_policy_set_rejections",
		metric.WithDescription("Policy sets the node rejected (it kept the last good set); each store revision once."))
	rejected, err2 := m.Int64ObservableGauge("allot_policy_set_rejected",
		metric.WithDescription("1 while the store's latest policy set is rejected and an older set is in force, else 0."))
	at, err3 := m.Float64ObservableGauge("allot_policy_set_applied_timestamp", metric.WithUnit("s"),
		metric.WithDescription("When the policy set in force was applied, in Unix seconds."))
	rev, err4 := m.Float64ObservableGauge("allot_policy_set_applied_revision",
		metric.WithDescription("Store revision of the policy set in force (NATS/PostgreSQL: a sequence; file: a content hash)."))
	n, err5 := m.Int64ObservableGauge("allot_policy_set_policies",
		metric.WithDescription("Policies in the set in force."))
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return nil, fmt.Errorf("telemetry: policy instruments: %w", err)
	}
	return t.register(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(rejections, int64(min(s.Rejections, 1<<63-1)))
		var r int64
		if s.Rejected {
			r = 1
		}
		o.ObserveInt64(rejected, r)
		if !s.AppliedAt.IsZero() {
			o.ObserveFloat64(at, float64(s.AppliedAt.UnixNano())/1e9)
		}
		o.ObserveFloat64(rev, float64(s.AppliedRevision))
		o.ObserveInt64(n, int64(s.Policies))
		return nil
	}, rejections, rejected, at, rev, n)
}
