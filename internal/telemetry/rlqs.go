package telemetry

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// ObserveRLQS exposes the RLQS face (internal/rlqs): the returned hook
// counts allot_rlqs_assignments_total{kind,policy} (kind: rate, same,
// allow_all, deny_all, local, abandon, overflow, invalid) and adds the
// rate of each new rate assignment (requests/s) to
// allot_rlqs_assigned_rate_total{policy}; the gauges allot_rlqs_streams
// and allot_rlqs_buckets and the counter allot_rlqs_streams_refused_total
// are read from open at every scrape. stop stops reading open; Shutdown
// does too.
func (t *Telemetry) ObserveRLQS(open func() (streams, buckets, refused int64)) (hook func(ctx context.Context, kind, policy string, rate float64), stop func() error, err error) {
	m := t.meter
	assignments, e1 := m.Int64Counter("allot_rlqs_assignments", metric.WithDescription("RLQS bucket answers sent, by kind (rate, same, allow_all, deny_all, local, abandon, overflow, invalid) and policy."))
	rates, e2 := m.Float64Counter("allot_rlqs_assigned_rate", metric.WithDescription("The rates (requests/s) of new RLQS rate assignments, summed, by policy: over the count of kind=rate answers, their mean."))
	streams, e3 := m.Int64ObservableGauge("allot_rlqs_streams", metric.WithDescription("RLQS streams open now."))
	buckets, e4 := m.Int64ObservableGauge("allot_rlqs_buckets", metric.WithDescription("RLQS buckets held by the open streams now."))
	refusedC, e5 := m.Int64ObservableCounter("allot_rlqs_streams_refused", metric.WithDescription("RLQS streams refused: at the node's stream cap or while it drains."))
	if err := errors.Join(e1, e2, e3, e4, e5); err != nil {
		return nil, nil, fmt.Errorf("telemetry: rlqs instruments: %w", err)
	}
	stop, err = t.register(func(_ context.Context, o metric.Observer) error {
		s, b, r := open()
		o.ObserveInt64(streams, s)
		o.ObserveInt64(buckets, b)
		o.ObserveInt64(refusedC, r)
		return nil
	}, streams, buckets, refusedC)
	if err != nil {
		return nil, nil, err
	}
	hook = func(ctx context.Context, kind, policy string, rate float64) {
		if policy == "" {
			policy = NoPolicy
		}
		assignments.Add(ctx, 1, t.option("kind", kind, "policy", policy).add...)
		if kind != "rate" {
			rate = 0 // the series exists from the first answer on
		}
		rates.Add(ctx, rate, t.option("policy", policy, "", "").add...)
	}
	return hook, stop, nil
}
