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
// /proc/pressure/cpu: the share of the last 10 s in which runnable tasks
// waited for a CPU). On a machine whose CPUs are contended, a Redis on
// the same machine waits for a CPU too, and this node's network stack
// with it: a silent shard is then likely slow, not stalled. Read at most
// every 100 ms; false where PSI is not available.
type cpuPressure struct {
	mu   sync.Mutex
	at   time.Time
	high bool
	read func() (float64, bool) // the avg10 percentage
}

// highCPUPressure is the avg10 share of time with tasks waiting for a CPU
// above which the stall threshold is stretched (contendedFactor). A
// shared machine shows 5-20 % with nothing much running; a saturated one
// 60-100 %.
const highCPUPressure = 40.0

func (p *cpuPressure) contended(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.at) >= 100*time.Millisecond {
		v, ok := p.read()
		p.high, p.at = ok && v >= highCPUPressure, now
	}
	return p.high
}
