package algorithm_test

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// BenchmarkDecide is one key's in-process decision (what memstore runs
// under its shard lock), admitted and stored each time, the clock moving
// 10µs per call. The log holds about Limit·(10µs/rate) entries: 1000
// tokens per 100ms at one call per 10µs keeps it near 1000 live entries.
func BenchmarkDecide(b *testing.B) {
	for _, s := range []algorithm.Spec{
		spec(algorithm.TokenBucket, 1_000_000, time.Second, 0),
		spec(algorithm.GCRA, 1_000_000, time.Second, 1000),
		spec(algorithm.SlidingWindowLog, 10_000, 100*time.Millisecond, 0),
		spec(algorithm.SlidingWindowCounter, 1_000_000_000, time.Minute, 0),
		spec(algorithm.FixedWindow, 1_000_000_000, 24*time.Hour, 0),
	} {
		b.Run(s.Algorithm.String(), func(b *testing.B) {
			var st algorithm.State
			now, denied := t0, 0
			b.ReportAllocs()
			for b.Loop() {
				now += 10
				d := algorithm.Decide(s, st, now, 1)
				if d.OK {
					st = d.Next
				} else {
					denied++
				}
			}
			b.ReportMetric(float64(denied)/float64(b.N), "denied/op")
		})
	}
}
