package region

import (
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
}

const schedLatencies = "/sched/latencies:seconds"

func newSchedLag() *schedLag {
	return &schedLag{sample: []metrics.Sample{{Name: schedLatencies}}}
}

// recent reports whether some goroutine waited at least d for a CPU since
// the previous call (the first call looks at the whole run so far).
func (l *schedLag) recent(d time.Duration) bool {
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
	found := false
	for i, c := range h.Counts {
		// Buckets[i] is the lower bound of Counts[i].
		if c > l.prev[i] && h.Buckets[i] >= d.Seconds() {
			found = true
		}
		l.prev[i] = c
	}
	return found
}
