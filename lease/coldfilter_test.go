package lease

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hashIn is a hash whose key falls in bucket b with fingerprint fp.
func hashIn(b, fp uint32) uint32 { return b<<(32-coldBucketBits) | fp<<3 }

// The filter counts each key of a bucket on its own, by fingerprint, in
// windows of half the TTL: the Take that reaches ColdHits is warm, and a
// new window counts from one again.
func TestColdFilterCountsEachKey(t *testing.T) {
	var f coldFilter
	const half, hits = int64(time.Second), 3
	a, b := hashIn(7, 1), hashIn(7, 2)
	assert.Equal(t, filterCold, f.take(a, 1, half, hits))
	assert.Equal(t, filterCold, f.take(b, 1, half, hits))
	assert.Equal(t, filterCold, f.take(a, 2, half, hits))
	assert.Equal(t, filterWarm, f.take(a, 3, half, hits), "a's third take in its window")
	assert.Equal(t, filterCold, f.take(b, 3, half, hits), "b counted apart from a")
	assert.Equal(t, filterWarm, f.take(a, 4, half, hits), "past ColdHits: still warm")
	// A window later a's count starts again.
	assert.Equal(t, filterCold, f.take(a, 2*half, half, hits))
	assert.Equal(t, filterCold, f.take(hashIn(8, 1), 2*half, half, hits), "another bucket")
}

// A bucket full of keys seen more than once in their windows sends a
// newcomer to the key table; one seen once is forgotten for it; a cell
// whose window ended is free.
func TestColdFilterCrowdedBucket(t *testing.T) {
	var f coldFilter
	const half, hits = int64(time.Second), 16
	for fp := uint32(1); fp < coldWays; fp++ {
		f.take(hashIn(3, fp), 1, half, hits)
		f.take(hashIn(3, fp), 1, half, hits)
	}
	newcomer := hashIn(3, 100)
	assert.Equal(t, filterTable, f.take(newcomer, 2, half, hits), "every cell holds a key seen twice")

	var g coldFilter
	for fp := uint32(1); fp < coldWays; fp++ {
		g.take(hashIn(3, fp), 1, half, hits)
	}
	g.take(hashIn(3, 1), 1, half, hits) // key 1 seen twice
	assert.Equal(t, filterCold, g.take(newcomer, 2, half, hits), "a key seen once gives way")
	assert.Equal(t, filterCold, g.take(newcomer, 3, half, hits))
	kept := 0
	for i := 1; i < coldWays; i++ {
		if c := g.cells[coldBucket(newcomer)+uint32(i)].Load(); c>>cellPrintAt&0xffff == coldPrint(hashIn(3, 1)) {
			kept++
			assert.Equal(t, uint64(2), c&cellHits, "the key seen twice keeps its count")
		}
	}
	assert.Equal(t, 1, kept)

	assert.Equal(t, filterCold, f.take(newcomer, 1+half+1<<cellStep, half, hits), "windows ended: cells free again")
}

// A key holding lease state pins its cell, so that its Takes go to the
// key table, until it is released; in a bucket whose cells are all
// pinned, a further hold counts in the bucket's overflow, which sends
// every key of the bucket to the table until released.
func TestColdFilterPins(t *testing.T) {
	var f coldFilter
	const half, hits = int64(time.Second), 16
	k := hashIn(5, 9)
	assert.Equal(t, filterCold, f.take(k, 1, half, hits))
	f.hold(k)
	assert.Equal(t, filterTable, f.take(k, 2, half, hits))
	assert.Equal(t, filterTable, f.take(k, 10*half, half, hits), "a pin does not expire")
	assert.Equal(t, filterCold, f.take(hashIn(5, 10), 2, half, hits), "other keys of the bucket are judged here")
	f.release(k)
	assert.Equal(t, filterCold, f.take(k, 11*half, half, hits))

	for fp := uint32(20); fp < 20+coldWays-1; fp++ {
		f.hold(hashIn(5, fp))
	}
	assert.Equal(t, filterTable, f.take(hashIn(5, 10), 11*half, half, hits), "no cell left: the key table")
	over := hashIn(5, 99)
	f.hold(over)
	assert.Equal(t, uint64(1), f.cells[coldBucket(over)].Load(), "counted in the overflow")
	f.release(hashIn(5, 20))
	assert.Equal(t, filterTable, f.take(hashIn(5, 10), 11*half, half, hits), "overflow: the whole bucket goes to the table")
	f.release(over)
	assert.Equal(t, filterCold, f.take(hashIn(5, 10), 11*half, half, hits))
	for fp := uint32(21); fp < 20+coldWays-1; fp++ {
		f.release(hashIn(5, fp))
	}
	for i := range coldWays {
		assert.Zero(t, f.cells[coldBucket(over)+uint32(i)].Load()&cellPins, "cell %d unpinned", i)
	}
}

// Cold keys (Options.ColdExact) are judged by the filter: none is
// tracked in the key table, where each cost an entry and a lookup.
func TestColdKeysAreNotTracked(t *testing.T) {
	clk := NewManualClock()
	m, err := New(Options{Source: newFake(clk), Clock: clk, SweepEvery: -1, ColdExact: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	lim := newLimit(t, m, spec(100, time.Second, 100), Config{TargetPeriod: time.Second, TTL: 2 * time.Second}, false)
	const keys, rounds = 2000, 5
	for range rounds {
		for i := range keys {
			r, err := m.Take(context.Background(), lim, []byte("tenant="+strconv.Itoa(i)), 1)
			require.NoError(t, err)
			require.True(t, r.Exact)
		}
		clk.Advance(300 * time.Millisecond)
	}
	s := m.Stats()
	assert.Equal(t, int64(keys*rounds), s.Exact)
	assert.Zero(t, s.Keys, "cold keys tracked in the key table")
	assert.Zero(t, s.Calls)
}

// Under -race: hot keys that lease and cold keys that do not, taken from
// many goroutines while the clock moves and the sweeper evicts. Every
// tracked key holding lease state is pinned in the filter, so it is never
// judged there; once every key is evicted, no pin is left.
func TestColdFilterStaysBalanced(t *testing.T) {
	clk := NewManualClock()
	m, err := New(Options{Source: newFake(clk), Clock: clk, SweepEvery: -1, IdleAfter: time.Second, ColdExact: true, Defaults: Config{ColdHits: 4}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	lim := newLimit(t, m, spec(1000, time.Second, 1000), Config{TargetPeriod: 100 * time.Millisecond, TTL: 200 * time.Millisecond}, false)
	ctx := context.Background()
	var wg sync.WaitGroup
	var takes atomic.Int64
	stop := make(chan struct{})
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				subj := "cold=" + strconv.Itoa(w*100_000+i%5000)
				if i%3 == 0 {
					subj = "hot=" + strconv.Itoa(i%20)
				}
				if _, err := m.Take(ctx, lim, []byte(subj), 1); err != nil {
					t.Error(err)
					return
				}
				takes.Add(1)
			}
		})
	}
	for step := range 200 {
		// Each step of the clock waits for 100 more Takes.
		for next := takes.Load() + 100; takes.Load() < next && !t.Failed(); {
			runtime.Gosched()
		}
		clk.Advance(10 * time.Millisecond)
		if step%10 == 0 {
			m.Sweep()
		}
	}
	close(stop)
	wg.Wait()
	waitIdle(t, m)

	leased := 0
	for i := range m.stripes {
		tb := m.stripes[i].table.Load()
		for j := range tb.slots {
			if e := tb.slots[j].Load(); e != nil && e.held.Load() != nil {
				leased++
				assert.Equal(t, filterTable, m.coldKeys.take(e.hash, clk.Now(), int64(time.Hour), 255),
					"leased key %q judged by the filter", e.subject)
			}
		}
	}
	require.Positive(t, leased, "some hot keys leased")

	clk.Advance(time.Minute)
	m.Sweep()
	require.Zero(t, m.Stats().Keys)
	for i := range m.coldKeys.cells {
		c := m.coldKeys.cells[i].Load()
		if i%coldWays == 0 {
			require.Zero(t, c, "bucket %d overflow left", i/coldWays)
		} else {
			require.Zero(t, c&cellPins, "cell %d pinned", i)
		}
	}
}
