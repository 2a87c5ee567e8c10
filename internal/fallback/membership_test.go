package fallback_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/fallback"
	"github.com/allot-dev/allot/internal/membership"
)

// fast is a memberlist configuration that detects a crash in about a
// second on loopback.
func fast(seeds ...string) membership.Config {
	return membership.Config{Seeds: seeds, Floor: 2, ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond, SuspicionMult: 2}
}

// TestRegionFallbackFollowsMembership runs 3 nodes with real gossip (in
// process), crashes one, and checks that the survivors' shares grow from
// limit/3 to limit/2 within the documented detection time, and that the
// region's total stays within the bound of docs/algorithms.md ("Local
// fallback: the region's total"):
//
//	admitted <= b + r·T + (k/N)·b   (k = 1 crashed of N = 3)
//
// The order of spending is the worst case for that bound: the crashed
// node spends its whole share, the survivors wait for the rescale and
// then spend theirs.
func TestRegionFallbackFollowsMembership(t *testing.T) {
	a, err := membership.Join(fast())
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Crash() })
	b, err := membership.Join(fast(a.Addr()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Crash() })
	c, err := membership.Join(fast(a.Addr()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Crash() })
	nodes := []*membership.Members{a, b, c}
	for _, m := range nodes {
		require.Eventually(t, func() bool { return m.N() == 3 }, 10*time.Second, 5*time.Millisecond)
	}

	const limit = 300
	spec := algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: limit, Period: time.Hour}
	stores := []*fallback.Store{fallback.New(a, nil), fallback.New(b, nil), fallback.New(c, nil)}
	item := algorithm.Item{Key: "rl:{tenant=t}:p:l", Spec: spec, Cost: 1}
	start := time.Now()
	spend := func(s *fallback.Store) int {
		n := 0
		for {
			res, err := s.Take(context.Background(), []algorithm.Group{{item}})
			require.NoError(t, err)
			if !res[0].Allowed {
				return n
			}
			n++
		}
	}
	for i, s := range stores {
		assert.Equal(t, int64(limit/3), s.Share(limit), "node %d", i)
	}
	total := spend(stores[2])
	assert.Equal(t, limit/3, total)

	require.NoError(t, c.Crash())
	crashed := time.Now()
	bound := fast().FailureDetectionTime(3)
	for i, s := range stores[:2] {
		// The documented bound is memberlist's failure detection time;
		// the deadline past it is for a hang, not a speed (a loaded
		// machine delays the probes' timers): the time is logged.
		require.Eventually(t, func() bool { return s.Share(limit) == limit/2 }, bound+5*time.Second, time.Millisecond, "node %d", i)
	}
	t.Logf("shares grew to limit/2 %v after the crash (documented bound %v)", time.Since(crashed), bound)

	for _, s := range stores[:2] {
		got := spend(s)
		assert.Equal(t, limit/2, got, "a survivor's unspent share is limit/2")
		total += got
	}
	elapsed := time.Since(start)
	rate := float64(limit) / time.Hour.Seconds()
	slack := float64(limit) / 3 // k/N · b
	most := float64(limit) + rate*elapsed.Seconds() + slack
	t.Logf("region admitted %d in %v; ideal bucket %0.1f, bound %0.1f", total, elapsed, float64(limit)+rate*elapsed.Seconds(), most)
	assert.LessOrEqual(t, float64(total), most)
}
