package lease

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// BenchmarkTakeCold is the lease manager's part of a leased decision on a
// cold key (Options.ColdExact): many keys, each taken about twice per
// window of half the lease TTL, so every Take answers Result.Exact and
// the caller goes on to the exact path. It is the overhead a leased
// policy adds to the exact path for a large warm key set (issue 12's
// "many warm keys"); the keys are visited in a shuffled order, as
// tenants arrive, so their state is not in cache.
func BenchmarkTakeCold(b *testing.B) {
	ctx := context.Background()
	for _, keys := range []int{10_000, 100_000} {
		b.Run("keys="+strconv.Itoa(keys), func(b *testing.B) {
			clk := NewManualClock()
			m, err := New(Options{Source: newFake(clk), Clock: clk, SweepEvery: -1, ColdExact: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = m.Close(ctx) })
			lim := newLimit(b, m, spec(1<<40, time.Second, 1<<40), Config{TargetPeriod: time.Second, TTL: 2 * time.Second}, false)
			subjects := make([][]byte, keys)
			for i := range subjects {
				subjects[i] = []byte("tenant=t" + strconv.Itoa(1_000_000+i))
			}
			rnd := rand.New(rand.NewPCG(1, 2))
			shuffle := func() { rnd.Shuffle(keys, func(i, j int) { subjects[i], subjects[j] = subjects[j], subjects[i] }) }
			shuffle()
			// Two Takes per key per window of 1 s.
			step := time.Second / time.Duration(2*keys)
			var r Result
			for _, s := range subjects { // first sight of every key
				_ = m.TakeTo(ctx, lim, s, 1, &r)
				clk.Advance(step)
			}
			// Visited in another order than first seen: whatever the first
			// sight allocated is not walked in address order.
			shuffle()
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				if err := m.TakeTo(ctx, lim, subjects[i], 1, &r); err != nil || !r.Exact {
					b.Fatalf("take %d: %v, exact %v", i, err, r.Exact)
				}
				if i++; i == keys {
					i = 0
				}
				clk.Advance(step)
			}
			b.StopTimer()
			b.ReportMetric(float64(m.Stats().Keys)/float64(keys), "tracked/key")
		})
	}
}
