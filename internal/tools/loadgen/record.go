package loadgen

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/algorithm"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// Latencies are recorded in microseconds from 1 µs to a minute; longer
// ones (a request can only be that late when the generator itself
// stalls) are clamped to the top.
const (
	histMin = 1
	histMax = int64(time.Minute / time.Microsecond)
)

// outcome is what one request got.
type outcome uint8

const (
	allowed outcome = iota
	throttled
	failedOpen
	failed            // no answer: transport error, timeout or an error status
	allowedDegraded   // allowed by a node deciding without its store (its local fallback)
	throttledDegraded // throttled by a node deciding without its store
	shed              // no answer: the node shed the call as overloaded (see IsShed)
	numOutcomes
)

func outcomeOf(a Answer, err error) outcome {
	d := a.Decision
	switch {
	case err != nil && IsShed(err):
		return shed
	case err != nil:
		return failed
	case d == ratelimitv1.RateLimitResponse_ALLOWED && a.Degraded:
		return allowedDegraded
	case d == ratelimitv1.RateLimitResponse_ALLOWED:
		return allowed
	case d == ratelimitv1.RateLimitResponse_THROTTLED && a.Degraded:
		return throttledDegraded
	case d == ratelimitv1.RateLimitResponse_THROTTLED:
		return throttled
	case d == ratelimitv1.RateLimitResponse_FAILED_OPEN:
		return failedOpen
	}
	return failed // a decision this generator does not know is not an answer it can count
}

// IsShed reports whether err is a node shedding load: a gRPC UNAVAILABLE
// status whose message says "overloaded". Such a call got no decision,
// on purpose; any other error is a failure of another kind.
func IsShed(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unavailable && strings.Contains(st.Message(), "overloaded")
}

// hist is an HDR histogram behind a mutex: workers record into shared
// histograms, and a lock held for one RecordValue costs far less than a
// per-worker histogram's memory (about 140 KB each at 3 digits).
type hist struct {
	mu     sync.Mutex
	digits int
	h      *hdrhistogram.Histogram // created on first record
}

func (h *hist) record(d time.Duration) {
	v := min(max(d.Microseconds(), histMin), histMax)
	h.mu.Lock()
	if h.h == nil {
		h.h = hdrhistogram.New(histMin, histMax, h.digits)
	}
	_ = h.h.RecordValue(v) // cannot fail: v is clamped into range
	h.mu.Unlock()
}

// snapshot returns a copy (nil if nothing was recorded).
func (h *hist) snapshot() *hdrhistogram.Histogram {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h == nil {
		return nil
	}
	return hdrhistogram.Import(h.h.Export())
}

// counts is one region's tally in one interval.
type counts [numOutcomes]atomic.Int64

// point is one interval of the time series.
type point struct {
	regions []counts
	ideal   atomic.Int64 // admitted by the ideal bucket
	latency hist         // 2 digits: enough for a p99 per interval, 16x smaller
}

// recorder collects a run's results. All methods are safe for concurrent
// use by the workers.
type recorder struct {
	start    time.Time
	interval time.Duration
	points   []point
	regions  []hist // latency per region, 3 digits
	lag      hist   // how late requests left against their schedule
	service  hist   // from send to answer, whatever the schedule
	ideal    *idealSim
	first    atomic.Int64 // ns after start of the first send; MaxInt64 before
	last     atomic.Int64 // ns after start of the last answer
	lastSend atomic.Int64 // ns after start of the last send
	maxGap   atomic.Int64 // ns: the longest time with no send, between sends
	firstAns atomic.Int64 // ns after start of the first answer; MaxInt64 before
	done     atomic.Int64 // requests answered or failed

	// warmup > 0: requests due at or after it are also tallied apart
	// (Report.Measured), so a warm-up is left out of the figures.
	warmup        time.Duration
	measured      [numOutcomes]atomic.Int64
	measuredIdeal atomic.Int64
	measuredLat   hist         // 3 digits
	measuredN     atomic.Int64 // measured requests recorded
}

// measuredDone is how many requests of the measured part were answered
// or failed so far (every request when there is no warm-up).
func (r *recorder) measuredDone() int64 {
	if r.warmup <= 0 {
		return r.done.Load()
	}
	return r.measuredN.Load()
}

func newRecorder(start time.Time, cfg *Config, regions int) *recorder {
	n := int((cfg.Duration + cfg.Interval - 1) / cfg.Interval)
	r := &recorder{
		start:    start,
		interval: cfg.Interval,
		points:   make([]point, n),
		regions:  make([]hist, regions),
		lag:      hist{digits: 3},
		service:  hist{digits: 3},
		warmup:   cfg.Warmup,
	}
	r.measuredLat.digits = 3
	for i := range r.points {
		r.points[i].regions = make([]counts, regions)
		r.points[i].latency.digits = 2
	}
	for i := range r.regions {
		r.regions[i].digits = 3
	}
	if cfg.Ideal != nil {
		r.ideal = &idealSim{spec: *cfg.Ideal}
	}
	r.first.Store(math.MaxInt64)
	r.firstAns.Store(math.MaxInt64)
	return r
}

// record files one request due at offset at (the interval it counts in),
// sent at sent and finished at end, with latency measured from due.
func (r *recorder) record(region int, at time.Duration, due, sent, end time.Time, key int, cost int64, o outcome) {
	p := &r.points[min(int(at/r.interval), len(r.points)-1)]
	p.regions[region][o].Add(1)
	warm := r.warmup > 0 && at >= r.warmup
	if warm {
		r.measured[o].Add(1)
	}
	if r.ideal != nil && r.ideal.take(key, at, cost) {
		p.ideal.Add(1)
		if warm {
			r.measuredIdeal.Add(1)
		}
	}
	if o != failed && o != shed {
		lat := end.Sub(due)
		r.regions[region].record(lat)
		p.latency.record(lat)
		r.service.record(end.Sub(sent))
		if warm {
			r.measuredLat.record(lat)
		}
	}
	r.lag.record(sent.Sub(due))
	storeMin(&r.first, int64(sent.Sub(r.start)))
	r.noteSend(int64(sent.Sub(r.start)))
	storeMin(&r.firstAns, int64(end.Sub(r.start)))
	storeMax(&r.last, int64(end.Sub(r.start)))
	r.done.Add(1)
	if warm {
		r.measuredN.Add(1)
	}
}

// noteSend advances lastSend to s and keeps the longest step it made.
// Sends are recorded after their answers, so out of order; the steps of
// the running maximum still cover every gap between consecutive sends
// after the first one recorded, which was sent before FirstAnswer. So
// maxGap bounds every pause in sending within [FirstAnswer, LastSend].
func (r *recorder) noteSend(s int64) {
	for {
		prev := r.lastSend.Load()
		if s <= prev {
			return
		}
		if r.lastSend.CompareAndSwap(prev, s) {
			if prev > 0 {
				storeMax(&r.maxGap, s-prev)
			}
			return
		}
	}
}

func storeMax(a *atomic.Int64, v int64) {
	for cur := a.Load(); v > cur && !a.CompareAndSwap(cur, v); cur = a.Load() {
	}
}

func storeMin(a *atomic.Int64, v int64) {
	for cur := a.Load(); v < cur && !a.CompareAndSwap(cur, v); cur = a.Load() {
	}
}

// totals sums the intervals, per region.
func (r *recorder) totals() (perRegion [][numOutcomes]int64) {
	perRegion = make([][numOutcomes]int64, len(r.regions))
	for i := range r.points {
		for g := range r.points[i].regions {
			for o := range numOutcomes {
				perRegion[g][o] += r.points[i].regions[g][o].Load()
			}
		}
	}
	return perRegion
}

// idealSim is a perfect token bucket per key, fed the requests at their
// due offsets: what an exact limiter with no network would admit of the
// same traffic. Requests reach it out of order by at most the spread of
// the workers; BucketState.Refill treats a step back in time as no
// elapsed time, so that costs at most the tokens refilled in that spread.
type idealSim struct {
	spec   algorithm.Spec
	shards [64]struct {
		mu      sync.Mutex
		buckets map[int]algorithm.BucketState
	}
}

func (s *idealSim) take(key int, at time.Duration, cost int64) bool {
	sh := &s.shards[key%len(s.shards)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.buckets == nil {
		sh.buckets = map[int]algorithm.BucketState{}
	}
	b := sh.buckets[key].Refill(s.spec, at.Microseconds())
	ok, _ := b.Check(s.spec, cost)
	if ok {
		b.Tokens -= float64(cost)
	}
	sh.buckets[key] = b
	return ok
}
