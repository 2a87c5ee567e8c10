package telemetry

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/rebalance"
)

// rebalanceInstruments are the coordinator's. Shares are per key, so they
// are exposed only in aggregate (a histogram of ratios, a count): a label
// per key would grow with traffic.
type rebalanceInstruments struct {
	rounds      metric.Int64Counter
	midRounds   metric.Int64Counter
	duration    metric.Float64Histogram
	compute     metric.Float64Histogram
	reportBytes metric.Int64Histogram
	keys        metric.Int64Gauge
	heard       metric.Int64Gauge
	group       metric.Int64Gauge
	shareRatio  metric.Float64Histogram
	shares      metric.Int64Gauge
}

func (t *Telemetry) rebalanceInstruments() error {
	m, r := t.meter, &t.rebalance
	var e [10]error
	r.rounds, e[0] = m.Int64Counter("allot_rebalance_rounds", metric.WithDescription("Rebalance epochs run as the region's active coordinator."))
	r.duration, e[1] = m.Float64Histogram("allot_rebalance_duration", metric.WithUnit("s"),
		metric.WithDescription("Wall time of one rebalance epoch (report, shrink, ack, grow), waits included."),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
	r.compute, e[2] = m.Float64Histogram("allot_rebalance_compute", metric.WithUnit("s"),
		metric.WithDescription("CPU work of one rebalance epoch (encode, decode, plan), without waits."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	r.reportBytes, e[3] = m.Int64Histogram("allot_rebalance_report", metric.WithUnit("By"),
		metric.WithDescription("Size of this region's demand report per epoch."),
		metric.WithExplicitBucketBoundaries(256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304))
	r.keys, e[4] = m.Int64Gauge("allot_rebalance_keys", metric.WithDescription("Keys of the last epoch, by kind: planned, reported, written."))
	r.heard, e[5] = m.Int64Gauge("allot_rebalance_regions_heard", metric.WithDescription("Regions whose complete reports the last epoch used (this one included)."))
	r.group, e[6] = m.Int64Gauge("allot_rebalance_group", metric.WithDescription("1 when every heard region acknowledged the same view in the last epoch (shares could grow)."))
	r.shareRatio, e[7] = m.Float64Histogram("allot_region_share_ratio",
		metric.WithDescription("This region's share of each global key with a non-default share, over the default 1/n, observed every epoch (1 = fair share)."),
		metric.WithExplicitBucketBoundaries(0.1, 0.25, 0.5, 0.75, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 5))
	r.shares, e[8] = m.Int64Gauge("allot_region_shares", metric.WithDescription("Global keys for which this region holds a non-default share."))
	r.midRounds, e[9] = m.Int64Counter("allot_rebalance_mid_rounds", metric.WithDescription("Mid-interval rounds run as the region's active coordinator, by outcome: skipped (not every region heard), quiet (no key moved), shrunk (planned, no group), moved (planned and grown)."))
	if err := errors.Join(e[:]...); err != nil {
		return fmt.Errorf("rebalance: %w", err)
	}
	return nil
}

// ObserveRebalance records one finished coordinator epoch and a span
// "coord.round" covering it. It is coord.Config.Observe's body.
func (t *Telemetry) ObserveRebalance(ctx context.Context, r coord.Round) {
	if t == nil {
		return
	}
	in, st := &t.rebalance, r.Stats
	if st.Mid {
		t.observeMid(ctx, r)
		return
	}
	in.rounds.Add(ctx, 1)
	in.duration.Record(ctx, r.End.Sub(r.Start).Seconds())
	in.compute.Record(ctx, st.Compute.Seconds())
	in.reportBytes.Record(ctx, int64(st.ReportBytes))
	in.keys.Record(ctx, int64(st.Keys), t.option("kind", "planned", "", "").rec...)
	in.keys.Record(ctx, int64(st.Reported), t.option("kind", "reported", "", "").rec...)
	in.keys.Record(ctx, int64(st.Written), t.option("kind", "written", "", "").rec...)
	in.heard.Record(ctx, int64(st.Heard))
	g := int64(0)
	if st.Group {
		g = 1
	}
	in.group.Record(ctx, g)
	in.shares.Record(ctx, int64(len(r.Shares)))
	if def := rebalance.Default(max(r.Regions, 1)); def > 0 {
		for _, s := range r.Shares {
			in.shareRatio.Record(ctx, float64(s)/float64(def))
		}
	}
	// The span is made after the fact with the epoch's own timestamps:
	// coord stays free of OpenTelemetry and the epoch's work is untouched.
	_, span := t.tracer.Start(ctx, "coord.round", trace.WithTimestamp(r.Start), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			attribute.Int64("allot.epoch", st.Epoch),
			attribute.Int("allot.regions_heard", st.Heard),
			attribute.Bool("allot.group", st.Group),
			attribute.Int("allot.keys", st.Keys),
			attribute.Int("allot.keys_written", st.Written),
			attribute.Int("allot.report_bytes", st.ReportBytes),
			attribute.Int("allot.asked", st.Asked),
		))
	span.End(trace.WithTimestamp(r.End))
}

// observeMid records one mid-interval round and a span "coord.mid".
func (t *Telemetry) observeMid(ctx context.Context, r coord.Round) {
	st, outcome := r.Stats, "moved"
	switch {
	case st.Heard < r.Regions:
		outcome = "skipped"
	case st.Keys == 0:
		outcome = "quiet"
	case !st.Group:
		outcome = "shrunk"
	}
	t.rebalance.midRounds.Add(ctx, 1, t.option("outcome", outcome, "", "").add...)
	_, span := t.tracer.Start(ctx, "coord.mid", trace.WithTimestamp(r.Start), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			attribute.Int64("allot.epoch", st.Epoch),
			attribute.String("allot.outcome", outcome),
			attribute.Int("allot.keys", st.Keys),
			attribute.Int("allot.keys_written", st.Written),
		))
	span.End(trace.WithTimestamp(r.End))
}
