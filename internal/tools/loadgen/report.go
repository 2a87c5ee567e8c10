package loadgen

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/allot-dev/allot/algorithm"
)

// StopReason says why a run ended.
type StopReason string

// The reasons a run stops.
const (
	StoppedDuration    StopReason = "duration"
	StoppedMaxRequests StopReason = "max-requests"
	StoppedInterrupted StopReason = "interrupted"
)

// Counts tallies requests by outcome.
type Counts struct {
	Sent    int64 // every request sent (the sum of the four below)
	Allowed int64
	// AllowedDegraded is the part of Allowed that nodes decided without
	// their store (on_store_failure: local): outside the leasing bound.
	AllowedDegraded int64
	Throttled       int64
	// ThrottledDegraded is the part of Throttled that nodes decided
	// without their store.
	ThrottledDegraded int64
	FailedOpen        int64 // allowed because the node's store failed
	Failed            int64 // no decision: transport error, timeout, error status
	// Shed is the part of Failed that nodes shed as overloaded (IsShed):
	// refused on purpose, with an explicit code.
	Shed int64
}

// Degraded is every answer decided without the store, allowed or not.
func (c Counts) Degraded() int64 { return c.AllowedDegraded + c.ThrottledDegraded }

// Admitted is what the node let through: allowed plus failed open.
func (c Counts) Admitted() int64 { return c.Allowed + c.FailedOpen }

func (c *Counts) add(o Counts) {
	c.Sent += o.Sent
	c.Allowed += o.Allowed
	c.AllowedDegraded += o.AllowedDegraded
	c.Throttled += o.Throttled
	c.ThrottledDegraded += o.ThrottledDegraded
	c.FailedOpen += o.FailedOpen
	c.Failed += o.Failed
	c.Shed += o.Shed
}

func countsOf(v [numOutcomes]int64) Counts {
	c := Counts{Allowed: v[allowed] + v[allowedDegraded], AllowedDegraded: v[allowedDegraded],
		Throttled: v[throttled] + v[throttledDegraded], ThrottledDegraded: v[throttledDegraded],
		FailedOpen: v[failedOpen], Failed: v[failed] + v[shed], Shed: v[shed]}
	c.Sent = c.Allowed + c.Throttled + c.FailedOpen + c.Failed
	return c
}

// Quantiles summarises a latency distribution.
type Quantiles struct {
	Count               int64
	P50, P99, P999, Max time.Duration
	Mean                time.Duration
}

func quantilesOf(h *hdrhistogram.Histogram) Quantiles {
	if h == nil || h.TotalCount() == 0 {
		return Quantiles{}
	}
	us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
	return Quantiles{
		Count: h.TotalCount(),
		P50:   us(h.ValueAtQuantile(50)),
		P99:   us(h.ValueAtQuantile(99)),
		P999:  us(h.ValueAtQuantile(99.9)),
		Max:   us(h.Max()),
		Mean:  time.Duration(h.Mean() * float64(time.Microsecond)),
	}
}

// RegionReport is one region's results.
type RegionReport struct {
	Region string
	// Addr is the region's target, or its nodes' joined by commas.
	Addr string
	Counts
	// Latency of answered requests (failed ones excluded), from when each
	// was due (open loop) or sent (closed loop) to its answer.
	Latency Quantiles
}

// Point is one interval of the time series.
type Point struct {
	Offset  time.Duration // start of the interval, from the start of the run
	Total   Counts
	Regions []Counts // in Report.Regions order
	// IdealAdmitted is what the ideal limit admitted of this interval's
	// requests (0 without Config.Ideal).
	IdealAdmitted int64
	P99           time.Duration // answered requests due in this interval
}

// Report is what a run measured.
type Report struct {
	Protocol    Protocol
	Rate        float64 // 0: closed loop
	Concurrency int
	Duration    time.Duration // as configured
	Interval    time.Duration // width of one Series point
	Keys        Keys
	Seed        uint64
	Ideal       *algorithm.Spec
	Stop        StopReason

	Start time.Time
	// FirstSend and LastAnswer bound, from Start, when requests were on
	// the wire: a server saw every request within [FirstSend, LastAnswer],
	// and was seeing them at least over [FirstAnswer, LastSend] (the
	// first request had arrived, the last had not yet). Tests and the
	// chaos suite bound what a limiter may admit with these.
	FirstSend, FirstAnswer, LastSend, LastAnswer time.Duration
	// MaxSendGap bounds the longest pause in sending within
	// [FirstAnswer, LastSend]: a stalled generator shows here.
	MaxSendGap time.Duration

	Total   RegionReport // Region "total"
	Regions []RegionReport
	Series  []Point
	// IdealAdmitted is what a perfect token bucket per key (Ideal) would
	// have admitted of the same requests at the times they were due.
	IdealAdmitted int64
	// Lag is how late requests left against their schedule (open loop);
	// a high p99 means the generator, not the target, was the bottleneck.
	Lag Quantiles
	// Service is from send to answer, leaving out any lateness of the
	// send: the target's and the network's share of Total.Latency.
	Service Quantiles
	// Histogram holds every answered request's latency in microseconds.
	Histogram *hdrhistogram.Histogram

	// Warmup is Config.Warmup; Measured is what was due from Warmup on
	// (everything when Warmup is 0).
	Warmup   time.Duration
	Measured Measured
}

// Measured is the part of a run after its warm-up.
type Measured struct {
	Counts
	// Latency of the answered requests due from the warm-up on.
	Latency Quantiles
	// IdealAdmitted is what the ideal bucket admitted of these requests;
	// the bucket was fed the warm-up's requests too, so it is in the
	// state the warm-up left, as the node's is.
	IdealAdmitted int64
	// Span is from the end of the warm-up to the last answer.
	Span time.Duration
}

// Throughput is the measured requests per second of Span.
func (m Measured) Throughput() float64 {
	if m.Span <= 0 {
		return 0
	}
	return float64(m.Sent) / m.Span.Seconds()
}

// Throughput is requests answered or failed per second of the run
// (from Start to the last answer).
func (r *Report) Throughput() float64 {
	if r.LastAnswer <= 0 {
		return 0
	}
	return float64(r.Total.Sent) / r.LastAnswer.Seconds()
}

// Mode describes the load model, e.g. "open loop 5000/s" or "closed loop, 64 workers".
func (r *Report) Mode() string {
	if r.Rate > 0 {
		return fmt.Sprintf("open loop %g/s (up to %d in flight)", r.Rate, r.Concurrency)
	}
	return fmt.Sprintf("closed loop, %d workers", r.Concurrency)
}

func (g *gen) report(interrupted bool) *Report {
	rec := g.rec
	r := &Report{
		Protocol: g.cfg.Protocol, Rate: g.cfg.Rate, Concurrency: g.cfg.Concurrency, Duration: g.cfg.Duration,
		Interval: g.cfg.Interval, Keys: g.cfg.Keys, Seed: g.cfg.Seed, Ideal: g.cfg.Ideal, Stop: g.stopReason(interrupted),
		Start: g.start, LastAnswer: time.Duration(rec.last.Load()),
		Total: RegionReport{Region: "total"},
	}
	if f := rec.first.Load(); f != math.MaxInt64 {
		r.FirstSend = time.Duration(f)
		r.FirstAnswer = time.Duration(rec.firstAns.Load())
		r.LastSend = time.Duration(rec.lastSend.Load())
		r.MaxSendGap = time.Duration(rec.maxGap.Load())
	}
	all := hdrhistogram.New(histMin, histMax, 3)
	for i, v := range rec.totals() {
		h := rec.regions[i].snapshot()
		if h != nil {
			all.Merge(h)
		}
		rr := RegionReport{Region: g.regions[i].name, Addr: strings.Join(g.regions[i].addrs, ","), Counts: countsOf(v), Latency: quantilesOf(h)}
		r.Regions = append(r.Regions, rr)
		r.Total.add(rr.Counts)
	}
	r.Total.Latency = quantilesOf(all)
	r.Histogram = all
	r.Lag = quantilesOf(rec.lag.snapshot())
	r.Service = quantilesOf(rec.service.snapshot())
	// The series ends with the last interval anything was due in, so an
	// interrupted run does not trail empty points.
	last := -1
	for i := range rec.points {
		p := &rec.points[i]
		pt := Point{Offset: time.Duration(i) * rec.interval, IdealAdmitted: p.ideal.Load(), P99: quantilesOf(p.latency.snapshot()).P99}
		for g := range p.regions {
			var v [numOutcomes]int64
			for o := range numOutcomes {
				v[o] = p.regions[g][o].Load()
			}
			c := countsOf(v)
			pt.Regions = append(pt.Regions, c)
			pt.Total.add(c)
		}
		if pt.Total.Sent > 0 {
			last = i
		}
		r.IdealAdmitted += pt.IdealAdmitted
		r.Series = append(r.Series, pt)
	}
	r.Series = r.Series[:last+1]
	r.Warmup = g.cfg.Warmup
	if r.Warmup > 0 {
		var v [numOutcomes]int64
		for o := range numOutcomes {
			v[o] = rec.measured[o].Load()
		}
		r.Measured = Measured{Counts: countsOf(v), Latency: quantilesOf(rec.measuredLat.snapshot()), IdealAdmitted: rec.measuredIdeal.Load()}
	} else {
		r.Measured = Measured{Counts: r.Total.Counts, Latency: r.Total.Latency, IdealAdmitted: r.IdealAdmitted}
	}
	r.Measured.Span = max(0, r.LastAnswer-r.Warmup)
	return r
}

// WriteText writes the human-readable summary.
func (r *Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("allot-load: %s, %s, %v, %s, seed %d; stopped by %s\n", r.Protocol, r.Mode(), r.Duration, r.Keys, r.Seed, r.Stop)
	ew.printf("sent %d in %.3fs: %.1f req/s; admitted %d (allowed %d + failed open %d), throttled %d, failed %d\n",
		r.Total.Sent, r.LastAnswer.Seconds(), r.Throughput(), r.Total.Admitted(), r.Total.Allowed, r.Total.FailedOpen, r.Total.Throttled, r.Total.Failed)
	if r.Total.AllowedDegraded > 0 {
		ew.printf("of the allowed, %d were decided without the store (a node's local fallback)\n", r.Total.AllowedDegraded)
	}
	if r.Total.Shed > 0 {
		ew.printf("of the failed, %d were shed by the node as overloaded\n", r.Total.Shed)
	}
	from := "sent"
	if r.Rate > 0 {
		from = "due"
	}
	ew.printf("latency (from %s to answer): p50 %v  p99 %v  p99.9 %v  max %v\n", from, r.Total.Latency.P50, r.Total.Latency.P99, r.Total.Latency.P999, r.Total.Latency.Max)
	if r.Rate > 0 {
		ew.printf("service time (from send to answer): p50 %v  p99 %v  p99.9 %v  max %v\n", r.Service.P50, r.Service.P99, r.Service.P999, r.Service.Max)
		ew.printf("send lag behind schedule: p50 %v  p99 %v  max %v; longest pause in sending %v\n", r.Lag.P50, r.Lag.P99, r.Lag.Max, r.MaxSendGap)
	}
	if r.Ideal != nil {
		pct := 0.0
		if r.IdealAdmitted > 0 {
			pct = 100 * float64(r.Total.Admitted()) / float64(r.IdealAdmitted)
		}
		ew.printf("ideal (token bucket %d/%v, burst %d, per key): %d; admitted %d = %.1f%% of ideal\n",
			r.Ideal.Limit, r.Ideal.Period, r.Ideal.Capacity(), r.IdealAdmitted, r.Total.Admitted(), pct)
	}
	if ew.err != nil {
		return ew.err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "region\tsent\tallowed\tthrottled\tfailed_open\tfailed\tp50\tp99\tp99.9\t")
	for _, rr := range append(r.Regions, r.Total) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%v\t%v\t%v\t\n", rr.Region, rr.Sent, rr.Allowed, rr.Throttled, rr.FailedOpen, rr.Failed,
			rr.Latency.P50, rr.Latency.P99, rr.Latency.P999)
	}
	return tw.Flush()
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

// WriteCSV writes the time series, one row per interval: totals, the
// ideal, cumulative admitted and ideal, the interval's p99, then
// sent/allowed/throttled/failed_open/failed per region.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	head := []string{"t_seconds", "sent", "allowed", "throttled", "failed_open", "failed", "admitted", "ideal_admitted",
		"cum_admitted", "cum_ideal_admitted", "p99_ms"}
	for _, rr := range r.Regions {
		for _, c := range []string{"sent", "allowed", "throttled", "failed_open", "failed"} {
			head = append(head, rr.Region+"_"+c)
		}
	}
	if err := cw.Write(head); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	var cum, cumIdeal int64
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, p := range r.Series {
		cum += p.Total.Admitted()
		cumIdeal += p.IdealAdmitted
		row := []string{strconv.FormatFloat(p.Offset.Seconds(), 'f', -1, 64),
			i64(p.Total.Sent), i64(p.Total.Allowed), i64(p.Total.Throttled), i64(p.Total.FailedOpen), i64(p.Total.Failed),
			i64(p.Total.Admitted()), i64(p.IdealAdmitted), i64(cum), i64(cumIdeal),
			strconv.FormatFloat(float64(p.P99)/float64(time.Millisecond), 'f', 3, 64)}
		for _, c := range p.Regions {
			row = append(row, i64(c.Sent), i64(c.Allowed), i64(c.Throttled), i64(c.FailedOpen), i64(c.Failed))
		}
		if err := cw.Write(row); err != nil {
			return fmt.Errorf("write csv: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	return nil
}
