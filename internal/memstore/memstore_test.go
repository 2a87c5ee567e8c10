package memstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/fakeclock"
)

var spec = algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Second, Burst: 50}

func take(t *testing.T, s *Store, g algorithm.Group) algorithm.Result {
	t.Helper()
	res, err := s.Take(context.Background(), []algorithm.Group{g})
	require.NoError(t, err)
	return res[0]
}

// With a manual clock the bucket admits exactly burst + rate*elapsed,
// however many goroutines race for it.
func TestExactUnderConcurrency(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	s := New(clk.Now)
	g := algorithm.Group{{Key: "rl:{k}:p:l", Spec: spec, Cost: 1}}
	var admitted atomic.Int64
	round := func() {
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for range 20 {
					if take(t, s, g).Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	round()
	require.Equal(t, int64(50), admitted.Load())
	for range 10 {
		clk.Advance(100 * time.Millisecond) // +10 tokens
		round()
	}
	assert.Equal(t, int64(50+100), admitted.Load())
}

func TestGroupIsAllOrNothing(t *testing.T) {
	s := New(nil)
	day := algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 1, Period: 24 * time.Hour}
	g := algorithm.Group{
		{Key: "rl:{t}:p:sec", Spec: spec, Cost: 1},
		{Key: "rl:{t}:p:day", Spec: day, Cost: 1},
	}
	require.True(t, take(t, s, g).Allowed)
	res := take(t, s, g)
	require.False(t, res.Allowed)
	assert.Equal(t, int64(49), res.Items[0].Remaining, "per-second tokens untouched by the denial")
	assert.Equal(t, time.Duration(0), res.Items[0].RetryAfter)
	assert.Greater(t, res.Items[1].RetryAfter, 23*time.Hour)
}

func TestRefundAndIdleEviction(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	s := New(clk.Now)
	g := algorithm.Group{{Key: "rl:{t}:p:sec", Spec: spec, Cost: 10}}
	require.Equal(t, int64(40), take(t, s, g).Items[0].Remaining)
	require.NoError(t, s.Refund(context.Background(), []algorithm.Group{g}))
	assert.Equal(t, int64(40), take(t, s, g).Items[0].Remaining, "refund gave the 10 back")
	require.Equal(t, 1, s.Len())
	clk.Advance(spec.TTL() + time.Millisecond)
	// A sweep runs every sweepEvery takes on the stripe; other keys with the
	// same hash tag share the stripe.
	other := algorithm.Group{{Key: "rl:{t}:p:other", Spec: spec, Cost: 1}}
	for range sweepEvery {
		take(t, s, other)
	}
	assert.Equal(t, 1, s.Len(), "the idle bucket was evicted, the busy one kept")
}
