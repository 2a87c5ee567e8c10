package region_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/region"
)

// BenchmarkTakeConcurrent is the exact path's store call: 32 goroutines
// each taking one token bucket of 1,000 keys through one Store on a
// local redis-server, so calls coalesce into shared pipelines. Beside
// ns/op (wall time, which on a shared machine depends on what else runs)
// it reports what does not: this process's CPU per call (cpu-µs/op, from
// getrusage, the node's side of the call), calls per round trip, Redis's
// own time per Take (redis-µs/op: the checks of a round trip share one
// script call) and per script call.
func BenchmarkTakeConcurrent(b *testing.B) {
	const conc = 32
	ctx := context.Background()
	s, err := region.Open(ctx, []string{redistest.Server(b).Addr}, region.Options{PoolSize: 64})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	sp := algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 1_000_000_000, Period: time.Second}
	groups := make([][]algorithm.Group, 1000)
	for i := range groups {
		groups[i] = []algorithm.Group{{{Key: fmt.Sprintf("rl:{t%d}:tenant", i), Spec: sp, Cost: 1}}}
	}
	if _, err := s.Take(ctx, groups[0]); err != nil { // loads the script
		b.Fatal(err)
	}
	if err := s.Client().ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	st0 := s.Stats()
	cpu0 := cpuTime(b)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := b.N/conc + 1
	for w := range conc {
		wg.Go(func() {
			for i := range per {
				if _, err := s.Take(ctx, groups[(w*per+i)%len(groups)]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	n := float64(per * conc)
	st := s.Stats()
	b.ReportMetric(float64(cpuTime(b)-cpu0)/n/float64(time.Microsecond), "cpu-µs/op")
	b.ReportMetric(float64(st.Calls-st0.Calls)/float64(max(st.Pipelines-st0.Pipelines, 1)), "calls/rtt")
	b.ReportMetric(redistest.Usec(b, s.Client(), "evalsha")/n, "redis-µs/op")
	b.ReportMetric(redistest.UsecPerCall(b, s.Client(), "evalsha"), "redis-µs/call")
}

// cpuTime is this process's user + system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
