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

// latest is the longest wait recent last saw, and how long ago (zero
// when it saw none).
func (l *schedLag) latest(now time.Time) (worst, ago time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at.IsZero() {
		return 0, 0
	}
	return l.worst, now.Sub(l.at)
}

// cpuPressure reads the machine's CPU pressure (Linux PSI,
// /proc/pressure/cpu: when runnable tasks waited for a CPU). On a
// machine whose CPUs are contended, a Redis on the same machine waits for
// a CPU too, and this node's network stack with it: a silent shard is
// then likely slow, not stalled. Two readings of one file: avg10, the
// share of the last 10 s, for a machine contended for long; and the
// cumulative total, sampled by the shards' checks, for the last tens of
// milliseconds, which avg10 averages away: on a shared VM an
// idle-looking machine still makes a ready process wait over 4 ms for a
// CPU a few times a minute, and a redis-server that waits so looks
// frozen (docs/benchmarks.md). The file is read at most every
// psiReadEvery. False where PSI is not available.
type cpuPressure struct {
	mu     sync.Mutex
	read   func() (psi, bool)
	stat   func() (cpuTimes, bool) // /proc/stat's steal; nil: not read
	readAt time.Time               // the last read, successful or not
	avg10  float64                 // avg10 at the last read (0 if it failed)

	// The last samples of total, a ring: samples[next] is the oldest
	// (or empty), the one before it the newest.
	samples [psiSamples]psiSample
	next    int // where the next sample goes

	// The last samples of the machine's CPU times (stat), taken with
	// those of PSI, a ring as they are.
	stolen    [psiSamples]stealSample
	stealNext int
}

type stealSample struct {
	at time.Time
	v  cpuTimes
}

type psiSample struct {
	at    time.Time
	total time.Duration
}

// psiReadEvery is the least time between two reads of the PSI file. At
// every read the kernel folds each CPU's times into the file's total,
// weighted by that CPU's non-idle time since the previous read in whole
// jiffies (kernel/sched/psi.c, collect_percpu_times): read more often
// than a jiffy (4 ms at HZ=250) and the weights round to zero, the
// waiting since the last read is dropped, and the file — its avg10 too,
// for every reader on the machine — shows almost none. Measured here, 3
// busy loops on 2 CPUs: 1-2 % of the time waiting when read every
// millisecond, 51 % when read every 20 ms (docs/benchmarks.md).
const psiReadEvery = 20 * time.Millisecond

// psiSamples is how many samples of total are kept: at the fastest (one
// every psiReadEvery) they span 300 ms.
const psiSamples = 16

// highCPUPressure is the avg10 share of time with tasks waiting for a CPU
// above which the stall threshold is stretched (contendedFactor). A
// shared machine shows 5-20 % with nothing much running; a saturated one
// 60-100 %.
const highCPUPressure = 40.0

// busyCPUPressure is the avg10 at which a judgement with no span of the
// last moments to look at (waited's known is false: the first call after
// an idle spell, whose spell's first sample is too recent) is made as on
// a contended machine. Measured here: the sweep's leased hot-key rows,
// whose shard sees one lease call every 0.75 s while the node decides
// 5-20k checks/s from memory, ran at avg10 10-31 % (under
// highCPUPressure), and one such lone call on a healthy Redis was judged
// stalled at the 4 ms floor, opening the breaker (docs/benchmarks.md).
// An idle machine here reads 0-2 %.
const busyCPUPressure = 10.0

// busy reports whether avg10 was busyCPUPressure or more; false where
// PSI is not available.
func (p *cpuPressure) busy(now time.Time) bool { return p.average(now) >= busyCPUPressure }

// waitedShare is the share of the last moments with tasks waiting for a
// CPU at which the machine counts as contended right now. The file
// averages the CPUs weighted by how busy each was, so one task kept
// waiting on one of two busy CPUs reads as 50 %, on one of four as 25 %.
const waitedShare = 0.25

// contended reports whether avg10 was highCPUPressure or more; false
// where PSI is not available.
func (p *cpuPressure) contended(now time.Time) bool { return p.average(now) >= highCPUPressure }

// average samples (as sample) and returns avg10 at the last read, 0 if
// it failed.
func (p *cpuPressure) average(now time.Time) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sampleLocked(now)
	return p.avg10
}

// sample reads the file, unless it was read less than psiReadEvery ago.
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
	if !p.readAt.IsZero() && now.Sub(p.readAt) < psiReadEvery {
		return
	}
	p.readAt = now
	v, ok := p.read()
	p.avg10 = 0
	if ok {
		p.avg10 = v.avg10
		p.samples[p.next] = psiSample{at: now, total: v.total}
		p.next = (p.next + 1) % psiSamples
	}
	if p.stat == nil {
		return
	}
	if t, ok := p.stat(); ok {
		p.stolen[p.stealNext] = stealSample{at: now, v: t}
		p.stealNext = (p.stealNext + 1) % psiSamples
	}
}

// stealWindow is how far back the hypervisor's steal is looked at: the
// ring's samples within it, over at least stealMinSpan. On a shared VM
// the hypervisor takes a CPU away in bursts (measured here: up to 40 ms
// at a time with 2.8 % stolen on average, docs/benchmarks.md): a vCPU
// paused that way runs nothing, and its steal appears in /proc/stat only
// when it runs again, so a pause under way cannot be seen; bursts in the
// last moments say that more may come. PSI does not see it (no task of
// the guest waits: the CPU itself is gone), nor do the runtime's
// scheduling latencies.
const (
	stealWindow  = 500 * time.Millisecond
	stealMinSpan = 3 * psiReadEvery
)

// stolenShare is the share of the machine's CPU time taken by the
// hypervisor over stealWindow at which silence of a shard may be a
// paused vCPU rather than a frozen Redis. /proc/stat counts in 10 ms
// ticks: over the ring's 300 ms on two CPUs one tick is 1.6 %, and an
// ordinary phase here shows 0-3 % on average.
const stolenShare = 0.05

// stealShare samples (as sample) and returns the share of the machine's
// CPU time stolen between the newest sample and the oldest one within
// stealWindow of now, and that span; ok is false when the span is
// shorter than stealMinSpan, or /proc/stat is not available.
func (p *cpuPressure) stealShare(now time.Time) (share float64, span time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sampleLocked(now)
	last := p.stolen[(p.stealNext+psiSamples-1)%psiSamples]
	if last.at.IsZero() {
		return 0, 0, false
	}
	var first stealSample
	for i := 2; i <= psiSamples; i++ {
		s := p.stolen[(p.stealNext+psiSamples-i)%psiSamples]
		if s.at.IsZero() || now.Sub(s.at) > stealWindow {
			break
		}
		first = s
	}
	span = last.at.Sub(first.at)
	if first.at.IsZero() || span < stealMinSpan || last.v.all <= first.v.all || last.v.steal < first.v.steal {
		return 0, 0, false
	}
	return float64(last.v.steal-first.v.steal) / float64(last.v.all-first.v.all), span, true
}

// stealing reports whether the hypervisor took stolenShare or more of
// the machine's CPU time lately (stealShare).
func (p *cpuPressure) stealing(now time.Time) bool {
	share, _, ok := p.stealShare(now)
	return ok && share >= stolenShare
}

// waited samples (as sample) and reports whether tasks waited for a CPU
// at least waitedShare of the time over the most recent span waitedShare
// can measure, and whether there was such a span (known; waitedShare's
// ok).
func (p *cpuPressure) waited(now time.Time, window time.Duration) (waited, known bool) {
	share, _, ok := p.waitedShare(now, window)
	return ok && share >= waitedShare, ok
}

// waitedShare samples (as sample) and returns the share of time tasks
// waited for a CPU between the newest sample and the newest one at least
// max(window/2, psiReadEvery) before it, and that span; ok is false when
// there is no such sample within 2×(window+psiReadEvery) of now (an idle
// shard between two calls: a long span says nothing about the last
// moments), or PSI is not available.
func (p *cpuPressure) waitedShare(now time.Time, window time.Duration) (share float64, span time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sampleLocked(now)
	last := p.latest()
	minSpan, maxAge := max(window/2, psiReadEvery), 2*(window+psiReadEvery)
	for i := 2; i <= psiSamples; i++ {
		s := p.samples[(p.next+psiSamples-i)%psiSamples]
		if s.at.IsZero() || now.Sub(s.at) > maxAge {
			return 0, 0, false
		}
		span := last.at.Sub(s.at)
		if span < minSpan {
			continue
		}
		if last.total < s.total {
			return 0, 0, false
		}
		return float64(last.total-s.total) / float64(span), span, true
	}
	return 0, 0, false
}
