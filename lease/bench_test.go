package lease

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// benchManager is a manager over the in-memory fake region with a bucket
// so large that no decision is ever denied: the benchmarks measure the
// decision itself.
func benchManager(b *testing.B) (*Manager, *Limit) {
	clk := NewManualClock()
	m := newManager(b, newFake(clk), clk)
	lim := newLimit(b, m, spec(1<<40, time.Second, 1<<40), Config{TTL: time.Hour, TargetPeriod: time.Hour}, false)
	return m, lim
}

// BenchmarkTake is one leased decision including the key lookup (hash of
// the subject bytes, lock-free probe, CAS on the tokens).
func BenchmarkTake(b *testing.B) {
	ctx := context.Background()
	b.Run("hot-key", func(b *testing.B) {
		m, lim := benchManager(b)
		subj := []byte("tenant=acme,route=/v1/users")
		_, _ = m.Take(ctx, lim, subj, 1)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if r, _ := m.Take(ctx, lim, subj, 1); !r.Allowed {
				b.Fatal("denied")
			}
		}
	})
	// TakeTo, the form the decision path (decide) uses: the Result is
	// written in place instead of returned.
	b.Run("hot-key-to", func(b *testing.B) {
		m, lim := benchManager(b)
		benchHotTakeTo(b, m, lim)
	})
	// The same with Options.ColdExact, as a node runs: the hot key is
	// pinned in the cold filter, which a Take reads first.
	b.Run("hot-key-to-cold-exact", func(b *testing.B) {
		clk := NewManualClock()
		m, err := New(Options{Source: newFake(clk), Clock: clk, SweepEvery: -1, ColdExact: true, Defaults: Config{ColdHits: 1}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close(ctx) })
		benchHotTakeTo(b, m, newLimit(b, m, spec(1<<40, time.Second, 1<<40), Config{TTL: time.Hour, TargetPeriod: time.Hour}, false))
	})
	b.Run("hot-key-parallel", func(b *testing.B) {
		m, lim := benchManager(b)
		subj := []byte("tenant=acme,route=/v1/users")
		_, _ = m.Take(ctx, lim, subj, 1)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if r, _ := m.Take(ctx, lim, subj, 1); !r.Allowed {
					b.Error("denied")
					return
				}
			}
		})
	})
	b.Run("1024-keys-parallel", func(b *testing.B) {
		m, lim := benchManager(b)
		subjects := make([][]byte, 1024)
		for i := range subjects {
			subjects[i] = []byte("tenant=t" + strconv.Itoa(i))
			_, _ = m.Take(ctx, lim, subjects[i], 1)
		}
		waitIdle(b, m)
		var seq atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(1)) * 7919
			for pb.Next() {
				i++
				if r, _ := m.Take(ctx, lim, subjects[i&1023], 1); !r.Allowed {
					b.Error("denied")
					return
				}
			}
		})
	})
}

// benchHotTakeTo times TakeTo of one key, leased before the timer starts.
func benchHotTakeTo(b *testing.B, m *Manager, lim *Limit) {
	ctx := context.Background()
	subj := []byte("tenant=acme,route=/v1/users")
	_, _ = m.Take(ctx, lim, subj, 1)
	var r Result
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _ = m.TakeTo(ctx, lim, subj, 1, &r); !r.Allowed {
			b.Fatal("denied")
		}
	}
}

// BenchmarkMemoryPerKey tracks 1,000,000 keys and reports the heap bytes
// per key (entries, subject strings, tables), measured with
// runtime.MemStats after a GC. The keys are tracked but hold no lease:
// what a key the key table judges cold costs (Options.ColdExact; most
// cold keys are counted in the cold filter instead, at no cost per key).
// BenchmarkMemoryPerLeasedKey is the same keys each holding a lease.
func BenchmarkMemoryPerKey(b *testing.B) { benchMemoryPerKey(b, false) }

// BenchmarkMemoryPerLeasedKey is BenchmarkMemoryPerKey with every key
// holding its lease state, as after its first refill.
func BenchmarkMemoryPerLeasedKey(b *testing.B) { benchMemoryPerKey(b, true) }

func benchMemoryPerKey(b *testing.B, leased bool) {
	const keys = 1_000_000
	for b.Loop() {
		clk := NewManualClock()
		m := newManager(b, newFake(clk), clk)
		lim := newLimit(b, m, spec(100, time.Second, 100), Config{}, false)
		subjects := make([][]byte, keys)
		for i := range subjects {
			subjects[i] = []byte("tenant=t" + strconv.Itoa(1_000_000+i)) // 15 bytes, like a real tenant id
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for _, s := range subjects {
			h := mapBytes(m, s) ^ lim.mix
			sh := &m.stripes[h>>(64-stripeBits)]
			sh.mu.Lock()
			e := sh.insert(h, lim, s, m.coldKeys)
			if leased {
				e.holdLocked(lim, m.coldKeys)
			}
			sh.mu.Unlock()
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/keys, "bytes/key")
		runtime.KeepAlive(subjects)
		runtime.KeepAlive(m)
	}
}

// BenchmarkReferenceXTimeRate is golang.org/x/time/rate's single-key
// Allow, the yardstick of the leased decision's target (run both in one
// go test invocation so the ratio is measured under the same load).
func BenchmarkReferenceXTimeRate(b *testing.B) {
	// Finite, so Allow does the bucket maths (rate.Inf short-circuits).
	l := rate.NewLimiter(1e12, 1e9)
	b.ReportAllocs()
	for b.Loop() {
		if !l.Allow() {
			b.Fatal("denied")
		}
	}
}
