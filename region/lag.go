package region

import (
	"math"
	"runtime/metrics"
	"sync"
	"time"
)

// schedLag reads how long this process's goroutines waited for a CPU
// (the runtime's /sched/latencies histogram: time spent runnable before
// running). A node on busy cores may start a pipeline's goroutine, write
// its request or read its reply long after the shard was ready; while
// that happens, silence from the shard is not evidence of a stall.
type schedLag struct {
	mu     sync.Mutex
	sample []metrics.Sample
	prev   []uint64
	// worst is the longest wait seen in the last read's delta, at.
	worst time.Duration
	at    time.Time
}

const schedLatencies = "/sched/latencies:seconds"

func newSchedLag() *schedLag {
	return &schedLag{sample: []metrics.Sample{{Name: schedLatencies}}}
}

// recent reports whether some goroutine waited at least d for a CPU
// within the last `within` (as far as reads of the histogram, which are
// made by these calls, can tell: the first call sees the whole run).
func (l *schedLag) recent(now time.Time, d, within time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	metrics.Read(l.sample)
	if l.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return false // not this runtime's metric
	}
	h := l.sample[0].Value.Float64Histogram()
	if len(l.prev) != len(h.Counts) {
		l.prev = make([]uint64, len(h.Counts))
	}
	var worst time.Duration
	for i, c := range h.Counts {
		// Buckets[i] is the lower bound of Counts[i].
		if c > l.prev[i] && !math.IsInf(h.Buckets[i], 0) {
			worst = max(worst, time.Duration(h.Buckets[i]*float64(time.Second)))
		}
		l.prev[i] = c
	}
	if worst > 0 && (worst >= l.worst || now.Sub(l.at) >= within) {
		l.worst, l.at = worst, now
	}
	return l.worst >= d && now.Sub(l.at) < within
}

// cpuPressure reads the machine's CPU pressure (Linux PSI,
// /proc/pressure/cpu: when runnable tasks waited for a CPU). On a
// machine whose CPUs are contended, a Redis on the same machine waits for
// a CPU too, and this node's network stack with it: a silent shard is
// then likely slow, not stalled. Two readings: avg10, the share of the
// last 10 s (read at most every 100 ms), for a machine contended for
// long; and the cumulative total, sampled by the shards' checks (at most
// every millisecond), for the last few milliseconds, which avg10 averages
// away: on a shared VM an idle-looking machine still makes a ready
// process wait over 4 ms for a CPU a few times a minute, and a
// redis-server that waits so looks frozen (docs/benchmarks.md). False
// where PSI is not available.
type cpuPressure struct {
	mu   sync.Mutex
	at   time.Time
	high bool
	read func() (psi, bool)

	// The last samples of total, a ring: samples[next] is the oldest
	// (or empty), the one before it the newest.
	samples [psiSamples]psiSample
	next    int // where the next sample goes
}

type psiSample struct {
	at    time.Time
	total time.Duration
}

// psiSamples is how many samples of total are kept: at the fastest (one
// a millisecond) they reach back 16 ms, two thresholds of an idle node
// (4 ms) and then some. A threshold stretched past 8 ms by slow round
// trips comes with a loaded machine, which avg10 sees; there, waited
// finds no sample old enough and says no.
const psiSamples = 16

// highCPUPressure is the avg10 share of time with tasks waiting for a CPU
// above which the stall threshold is stretched (contendedFactor). A
// shared machine shows 5-20 % with nothing much running; a saturated one
// 60-100 %.
const highCPUPressure = 40.0

// waitedShare is the share of the last moments with tasks waiting for a
// CPU at which the machine counts as contended right now. Idle, this
// machine shows half of a 4 ms window in under 1 % of windows; a
// redis-server kept from running for milliseconds fills most of it.
const waitedShare = 0.5

func (p *cpuPressure) contended(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.at) >= 100*time.Millisecond {
		p.readLocked(now)
	}
	return p.high
}

// readLocked reads the file once for both readings: avg10's verdict
// (renewed) and, if the last sample is a millisecond old or more, a
// sample of total.
func (p *cpuPressure) readLocked(now time.Time) {
	v, ok := p.read()
	p.high, p.at = ok && v.avg10 >= highCPUPressure, now
	if !ok {
		return
	}
	if last := p.latest(); last.at.IsZero() || now.Sub(last.at) >= time.Millisecond {
		p.samples[p.next] = psiSample{at: now, total: v.total}
		p.next = (p.next + 1) % psiSamples
	}
}

// sample reads the cumulative total, unless it was read less than a
// millisecond ago.
func (p *cpuPressure) sample(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sampleLocked(now)
}

// latest is the newest sample (zero if none).
func (p *cpuPressure) latest() psiSample {
	return p.samples[(p.next+psiSamples-1)%psiSamples]
}

func (p *cpuPressure) sampleLocked(now time.Time) {
	if last := p.latest(); !last.at.IsZero() && now.Sub(last.at) < time.Millisecond {
		return
	}
	p.readLocked(now)
}

// waited samples (as sample) and reports whether tasks waited for a CPU
// at least waitedShare of the time since a sample between window/2 and
// 2×window old (the newest such): the moments a silence of window
// spans, measured over no less than half of it, so that one brief wait
// in a short span does not count.
func (p *cpuPressure) waited(now time.Time, window time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sampleLocked(now)
	last := p.latest()
	for i := 2; i <= psiSamples; i++ {
		s := p.samples[(p.next+psiSamples-i)%psiSamples]
		age := now.Sub(s.at)
		if s.at.IsZero() || age > 2*window {
			return false
		}
		if age < window/2 {
			continue
		}
		span := last.at.Sub(s.at)
		return span > 0 && last.total >= s.total && float64(last.total-s.total) >= waitedShare*float64(span)
	}
	return false
}
