package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/region"
)

// BenchmarkScriptPerAlgorithm is one check.lua call (one group of one key)
// at concurrency 1 against a local redis-server: the round trip plus the
// script. Limits are high enough that (nearly) every call is admitted and
// commits. The log admits 10,000 per 100ms, so its sorted set holds every
// entry of the last 100ms (a few thousand at this call rate).
func BenchmarkScriptPerAlgorithm(b *testing.B) {
	for _, s := range []algorithm.Spec{
		tb(1_000_000, time.Second, 0),
		spec(algorithm.GCRA, 1_000_000, time.Second, 1000),
		spec(algorithm.SlidingWindowLog, 10_000, 100*time.Millisecond, 0),
		spec(algorithm.SlidingWindowCounter, 1_000_000_000, time.Minute, 0),
		spec(algorithm.FixedWindow, 1_000_000_000, 24*time.Hour, 0),
	} {
		b.Run(s.Algorithm.String(), func(b *testing.B) {
			benchTake(b, algorithm.Group{{Key: "rl:{bench}:" + s.Algorithm.String(), Spec: s, Cost: 1}})
		})
	}
	// One subject with all five: the per-key cost of a mixed group.
	var mixed algorithm.Group
	for _, s := range []algorithm.Spec{
		tb(1_000_000, time.Second, 0),
		spec(algorithm.GCRA, 1_000_000, time.Second, 1000),
		spec(algorithm.SlidingWindowLog, 10_000, 100*time.Millisecond, 0),
		spec(algorithm.SlidingWindowCounter, 1_000_000_000, time.Minute, 0),
		spec(algorithm.FixedWindow, 1_000_000_000, 24*time.Hour, 0),
	} {
		mixed = append(mixed, algorithm.Item{Key: "rl:{mixed}:" + s.Algorithm.String(), Spec: s, Cost: 1})
	}
	b.Run("mixed_5_keys", func(b *testing.B) { benchTake(b, mixed) })
}

func benchTake(b *testing.B, g algorithm.Group) {
	ctx := context.Background()
	s, err := region.Open(ctx, []string{redistest.Server(b).Addr}, region.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	groups := []algorithm.Group{g}
	if _, err := s.Take(ctx, groups); err != nil { // loads the script
		b.Fatal(err)
	}
	if err := s.Client().ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	denied := 0
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.Take(ctx, groups)
		if err != nil {
			b.Fatal(err)
		}
		if !res[0].Allowed {
			denied++
		}
	}
	b.ReportMetric(float64(denied)/float64(b.N), "denied/op")
	b.ReportMetric(redistest.UsecPerCall(b, s.Client(), "evalsha"), "redis-µs/call")
}
