package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/telemetry"
	"github.com/allot-dev/allot/internal/testenv/promtext"
	"github.com/allot-dev/allot/rebalance"
	"github.com/allot-dev/allot/region"
)

// scrape serves tel's /metrics handler and scrapes it (promtext).
func scrape(t *testing.T, tel *telemetry.Telemetry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	return promtext.Scrape(t, srv.Client(), srv.URL+"/metrics")
}

func newTel(t *testing.T, cfg telemetry.Config) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, tel.Shutdown(context.Background())) })
	return tel
}

// A coordinator round becomes histograms, gauges and one span with the
// round's own timestamps; shares appear only in aggregate.
func TestObserveRebalance(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := newTel(t, telemetry.Config{SpanExporter: exp})
	start := time.Unix(1000, 0)
	def := rebalance.Default(2)
	tel.ObserveRebalance(context.Background(), coord.Round{
		Start: start, End: start.Add(300 * time.Millisecond),
		Stats:   coord.Stats{Epoch: 7, Heard: 2, Group: true, Keys: 3, Reported: 2, Written: 1, ReportBytes: 900, Chunks: 1, Compute: time.Millisecond},
		Regions: 2, Shares: []rebalance.Share{def / 2, def + def/2},
	})
	fams := scrape(t, tel)
	h := fams["allot_rebalance_duration_seconds"].GetMetric()[0].GetHistogram()
	assert.Equal(t, uint64(1), h.GetSampleCount())
	assert.InDelta(t, 0.3, h.GetSampleSum(), 1e-9)
	assert.InDelta(t, 900, fams["allot_rebalance_report_bytes"].GetMetric()[0].GetHistogram().GetSampleSum(), 0)
	assert.Equal(t, uint64(2), fams["allot_region_share_ratio"].GetMetric()[0].GetHistogram().GetSampleCount())
	assert.InDelta(t, 2.0, fams["allot_region_share_ratio"].GetMetric()[0].GetHistogram().GetSampleSum(), 1e-6)
	assert.Equal(t, 2.0, fams["allot_region_shares"].GetMetric()[0].GetGauge().GetValue())
	assert.Equal(t, 1.0, fams["allot_rebalance_rounds_total"].GetMetric()[0].GetCounter().GetValue())
	assert.Len(t, fams["allot_rebalance_keys"].GetMetric(), 3) // planned, reported, written
	spans := exp.GetSpans()
	require.Len(t, spans, 1)
	assert.Equal(t, "coord.round", spans[0].Name)
	assert.Equal(t, start, spans[0].StartTime)
	assert.Equal(t, 300*time.Millisecond, spans[0].EndTime.Sub(spans[0].StartTime))
}

// A mid-interval round is counted by outcome and leaves the epoch's
// figures alone.
func TestObserveMidIntervalRounds(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := newTel(t, telemetry.Config{SpanExporter: exp})
	start := time.Unix(1000, 0)
	for _, st := range []coord.Stats{
		{Mid: true, Heard: 2, Group: true, Keys: 1, Written: 1},
		{Mid: true, Heard: 2, Group: true, Keys: 1, Written: 1},
		{Mid: true, Heard: 2},
		{Mid: true, Heard: 1},
		{Mid: true, Heard: 2, Keys: 1, Written: 1},
	} {
		tel.ObserveRebalance(context.Background(), coord.Round{Start: start, End: start.Add(time.Millisecond), Stats: st, Regions: 2})
	}
	fams := scrape(t, tel)
	got := map[string]float64{}
	for _, m := range fams["allot_rebalance_mid_rounds_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" {
				got[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	assert.Equal(t, map[string]float64{"moved": 2, "quiet": 1, "skipped": 1, "shrunk": 1}, got)
	assert.Nil(t, fams["allot_rebalance_rounds_total"], "epochs counted")
	assert.Nil(t, fams["allot_rebalance_duration_seconds"], "epoch durations recorded")
	spans := exp.GetSpans()
	require.Len(t, spans, 5)
	assert.Equal(t, "coord.mid", spans[0].Name)
}

// Redis results are classified; breakers read at scrape time.
func TestObserveRedisAndBreakers(t *testing.T) {
	tel := newTel(t, telemetry.Config{})
	ctx := context.Background()
	tel.ObserveRedis(ctx, "take", nil, time.Millisecond)
	tel.ObserveRedis(ctx, "take", context.DeadlineExceeded, 5*time.Millisecond)
	tel.ObserveRedis(ctx, "take", region.ErrUnavailable, 0)
	tel.ObserveRedis(ctx, "lease", errors.New("boom"), time.Millisecond)
	state := region.BreakerClosed
	stop, err := tel.ObserveBreakers(func() []region.ShardHealth {
		return []region.ShardHealth{{Shard: "10.0.0.1:6379", State: state}, {Shard: "10.0.0.2:6379", State: region.BreakerOpen}}
	})
	require.NoError(t, err)
	fams := scrape(t, tel)
	byLabels := func(f *dto.MetricFamily) map[string]float64 {
		out := map[string]float64{}
		for _, m := range f.GetMetric() {
			k := ""
			for _, l := range m.GetLabel() {
				k += l.GetName() + "=" + l.GetValue() + ","
			}
			out[k] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		return out
	}
	assert.Equal(t, map[string]float64{
		"op=take,result=ok,": 1, "op=take,result=timeout,": 1, "op=take,result=unavailable,": 1, "op=lease,result=error,": 1,
	}, byLabels(fams["allot_redis_calls_total"]))
	assert.Equal(t, map[string]float64{"shard=10.0.0.1:6379,": 0, "shard=10.0.0.2:6379,": 2}, byLabels(fams["allot_breaker_state"]))
	require.NoError(t, stop())
	assert.NotContains(t, scrape(t, tel), "allot_breaker_state")
}

// Recording a decision allocates nothing once its label pair is cached:
// the per-check cost is two atomic adds and a map read.
func TestObserveCheckDoesNotAllocate(t *testing.T) {
	tel := newTel(t, telemetry.Config{})
	d := &decide.Decision{Outcome: decide.Allowed, PolicyID: "p"}
	ctx := context.Background()
	tel.ObserveCheck(ctx, "grpc", d, nil, time.Microsecond)
	allocs := testing.AllocsPerRun(1000, func() { tel.ObserveCheck(ctx, "grpc", d, nil, time.Microsecond) })
	assert.Zero(t, allocs)
}

// Recording a successful Redis call allocates nothing either (classifying
// its nil error once allocated an errors.As target per call).
func TestObserveRedisOKDoesNotAllocate(t *testing.T) {
	tel := newTel(t, telemetry.Config{})
	ctx := context.Background()
	tel.ObserveRedis(ctx, "check", nil, time.Microsecond)
	allocs := testing.AllocsPerRun(1000, func() { tel.ObserveRedis(ctx, "check", nil, time.Microsecond) })
	assert.Zero(t, allocs)
}

// A check decided by on_store_failure counts under its outcome and, once
// more, as degraded: the counter alerts read to see the store was not
// consulted.
func TestObserveCheckDegraded(t *testing.T) {
	tel := newTel(t, telemetry.Config{})
	ctx := context.Background()
	tel.ObserveCheck(ctx, "grpc", &decide.Decision{Outcome: decide.Allowed, PolicyID: "p", Degraded: true}, nil, time.Microsecond)
	tel.ObserveCheck(ctx, "grpc", &decide.Decision{Outcome: decide.Allowed, PolicyID: "p"}, nil, time.Microsecond)
	fams := scrape(t, tel)
	require.Contains(t, fams, "allot_decisions_degraded_total")
	m := fams["allot_decisions_degraded_total"].GetMetric()
	require.Len(t, m, 1)
	assert.Equal(t, 1.0, m[0].GetCounter().GetValue())
	assert.Equal(t, "p", m[0].GetLabel()[0].GetValue())
}

// A Redis call under a traced check becomes a client span, child of the
// check's span, covering the call's elapsed time; one with no parent
// (a background lease refill) makes none.
func TestObserveRedisSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel := newTel(t, telemetry.Config{SpanExporter: exp})
	tel.ObserveRedis(context.Background(), "lease", nil, time.Millisecond)
	ctx, parent := tel.Tracer().Start(context.Background(), "check")
	tel.ObserveRedis(ctx, "take", context.DeadlineExceeded, 2*time.Millisecond)
	parent.End()
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	redis := spans[0]
	assert.Equal(t, "redis.take", redis.Name)
	assert.Equal(t, parent.SpanContext().SpanID(), redis.Parent.SpanID())
	assert.Equal(t, 2*time.Millisecond, redis.EndTime.Sub(redis.StartTime))
	attrs := map[string]string{}
	for _, a := range redis.Attributes {
		attrs[string(a.Key)] = a.Value.String()
	}
	assert.Equal(t, map[string]string{"db.system.name": "redis", "allot.redis.op": "take", "allot.redis.result": "timeout"}, attrs)
	assert.Equal(t, "Error", redis.Status.Code.String())
}

// A nil Telemetry records nothing and does not panic.
func TestNilTelemetry(t *testing.T) {
	var tel *telemetry.Telemetry
	tel.ObserveCheck(context.Background(), "http", nil, errors.New("x"), 0)
	tel.ObserveRedis(context.Background(), "take", nil, 0)
	tel.ObserveRebalance(context.Background(), coord.Round{})
	assert.False(t, tel.Tracing())
	assert.NoError(t, tel.Shutdown(context.Background()))
}

// BenchmarkObserveCheck is the telemetry of one check: a decision and the
// Redis call under it. "deep" passes a context of the depth a gRPC
// handler's has (the transport, peer, metadata and stream values), which
// is what a lookup of a span in it walks.
func BenchmarkObserveCheck(b *testing.B) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	require.NoError(b, err)
	defer tel.Shutdown(context.Background())
	d := &decide.Decision{Outcome: decide.Allowed, PolicyID: "p"}
	type ctxKey int
	deep := context.Background()
	for i := range 12 {
		deep = context.WithValue(deep, ctxKey(i), i)
	}
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{{"background", context.Background()}, {"deep", deep}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					tel.ObserveRedis(bc.ctx, "take", nil, time.Microsecond)
					tel.ObserveCheck(bc.ctx, "grpc", d, nil, time.Microsecond)
				}
			})
		})
	}
}

// The prebuilt label sets (faces, ops and results, a policy's outcomes)
// and the general cache behind them give the same series: values outside
// the fixed sets are recorded too, under their own labels.
func TestObserveLabelsInAndOutsideTheFixedSets(t *testing.T) {
	tel := newTel(t, telemetry.Config{})
	ctx := context.Background()
	tel.ObserveCheck(ctx, "grpc", &decide.Decision{Outcome: decide.Allowed, PolicyID: "p"}, nil, time.Millisecond)
	tel.ObserveCheck(ctx, "grpc", &decide.Decision{Outcome: decide.Throttled, PolicyID: "p"}, nil, time.Millisecond)
	tel.ObserveCheck(ctx, "batch", &decide.Decision{Outcome: decide.Outcome(99), PolicyID: "q"}, nil, time.Millisecond)
	tel.ObserveCheck(ctx, "http", nil, errors.New("bad input"), time.Millisecond)
	tel.ObserveRedis(ctx, "take", nil, time.Millisecond)
	tel.ObserveRedis(ctx, "sweep", nil, time.Millisecond)
	fams := scrape(t, tel)
	labels := func(name string) map[string]uint64 {
		out := map[string]uint64{}
		for _, m := range fams[name].GetMetric() {
			k := ""
			for _, l := range m.GetLabel() {
				k += l.GetName() + "=" + l.GetValue() + ","
			}
			out[k] = uint64(m.GetCounter().GetValue()) + m.GetHistogram().GetSampleCount()
		}
		return out
	}
	assert.Equal(t, map[string]uint64{
		"outcome=allowed,policy=p,": 1, "outcome=throttled,policy=p,": 1, "outcome=unknown,policy=q,": 1, "outcome=error,policy=none,": 1,
	}, labels("allot_decisions_total"))
	assert.Equal(t, map[string]uint64{"face=grpc,": 2, "face=batch,": 1, "face=http,": 1}, labels("allot_decision_duration_seconds"))
	assert.Equal(t, map[string]uint64{"op=take,result=ok,": 1, "op=sweep,result=ok,": 1}, labels("allot_redis_calls_total"))
	assert.Equal(t, map[string]uint64{"op=take,": 1, "op=sweep,": 1}, labels("allot_redis_call_duration_seconds"))
}

// Counts recorded from many goroutines while /metrics is scraped, and
// while new policies' label sets are made, all arrive: none is lost to a
// scrape or to two goroutines making one policy's cells at once.
func TestCountsUnderConcurrentScrapes(t *testing.T) {
	tel := newTel(t, telemetry.Config{})
	ctx := context.Background()
	const workers, each = 8, 2000
	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	done := make(chan struct{})
	scraped := make(chan int)
	go func() { // scrapes until done (no t here: it is not the test's goroutine)
		n := 0
		for {
			select {
			case <-done:
				scraped <- n
				return
			default:
			}
			if resp, err := srv.Client().Get(srv.URL + "/metrics"); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				n++
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				d := &decide.Decision{Outcome: decide.Allowed, PolicyID: fmt.Sprintf("p%d", i%50), Degraded: w%2 == 0}
				tel.ObserveCheck(ctx, "grpc", d, nil, time.Microsecond)
				tel.ObserveRedis(ctx, "take", nil, time.Microsecond)
			}
		})
	}
	wg.Wait()
	close(done)
	assert.Positive(t, <-scraped, "scrapes ran while the counts were recorded")
	sum := func(name string) (n float64) {
		for _, m := range scrape(t, tel)[name].GetMetric() {
			n += m.GetCounter().GetValue()
		}
		return n
	}
	assert.Equal(t, float64(workers*each), sum("allot_decisions_total"))
	assert.Equal(t, float64(workers*each/2), sum("allot_decisions_degraded_total"))
	assert.Equal(t, float64(workers*each), sum("allot_redis_calls_total"))
	assert.Len(t, scrape(t, tel)["allot_decisions_total"].GetMetric(), 50, "one series per policy and outcome")
}
