package telemetry

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// ObserveRLQS exposes the RLQS face (internal/rlqs): the returned hook
// counts allot_rlqs_assignments_total{kind,policy} (kind: batch, empty,
// allow_all, deny_all, local, abandon, invalid) and allot_rlqs_assigned_requests_total{policy}
// (the requests of the batches), and the gauges allot_rlqs_streams and
// allot_rlqs_buckets are read from open at every scrape. stop stops
// reading open; Shutdown does too.
func (t *Telemetry) ObserveRLQS(open func() (streams, buckets int64)) (hook func(ctx context.Context, kind, policy string, requests int64), stop func() error, err error) {
	m := t.meter
	assignments, e1 := m.Int64Counter("allot_rlqs_assignments", metric.WithDescription("RLQS bucket answers sent, by kind (batch, empty, allow_all, deny_all, local, abandon, invalid) and policy."))
	requests, e2 := m.Int64Counter("allot_rlqs_assigned_requests", metric.WithDescription("Requests assigned to RLQS clients in batches, by policy."))
	streams, e3 := m.Int64ObservableGauge("allot_rlqs_streams", metric.WithDescription("RLQS streams open now."))
	buckets, e4 := m.Int64ObservableGauge("allot_rlqs_buckets", metric.WithDescription("RLQS buckets held by the open streams now."))
	if err := errors.Join(e1, e2, e3, e4); err != nil {
		return nil, nil, fmt.Errorf("telemetry: rlqs instruments: %w", err)
	}
	stop, err = t.register(func(_ context.Context, o metric.Observer) error {
		s, b := open()
		o.ObserveInt64(streams, s)
		o.ObserveInt64(buckets, b)
		return nil
	}, streams, buckets)
	if err != nil {
		return nil, nil, err
	}
	hook = func(ctx context.Context, kind, policy string, n int64) {
		if policy == "" {
			policy = NoPolicy
		}
		assignments.Add(ctx, 1, t.option("kind", kind, "policy", policy).add...)
		requests.Add(ctx, n, t.option("policy", policy, "", "").add...)
	}
	return hook, stop, nil
}
