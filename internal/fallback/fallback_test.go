package fallback_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/fallback"
	"github.com/allot-dev/allot/internal/testenv/fakeclock"
)

// size is a Sizer tests can change.
type size struct{ n atomic.Int64 }

func (s *size) N() int { return int(s.n.Load()) }

func newStore(n int) (*fallback.Store, *size, *fakeclock.Clock) {
	sz := &size{}
	sz.n.Store(int64(n))
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	return fallback.New(sz, clk.Now), sz, clk
}

// admit takes cost 1 until denied and returns how many were admitted.
func admit(t *testing.T, s *fallback.Store, it algorithm.Item, most int) int {
	t.Helper()
	for i := range most {
		res, err := s.Take(context.Background(), []algorithm.Group{{it}})
		require.NoError(t, err)
		if !res[0].Allowed {
			return i
		}
	}
	return most
}

var bucket = algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 90, Period: time.Minute}

func TestShareIsLimitOverN(t *testing.T) {
	for _, spec := range []algorithm.Spec{
		bucket,
		{Algorithm: algorithm.GCRA, Limit: 90, Period: time.Minute},
		{Algorithm: algorithm.FixedWindow, Limit: 90, Period: time.Minute},
		{Algorithm: algorithm.SlidingWindowLog, Limit: 90, Period: time.Minute},
		{Algorithm: algorithm.SlidingWindowCounter, Limit: 90, Period: time.Minute},
	} {
		t.Run(spec.Algorithm.String(), func(t *testing.T) {
			s, _, _ := newStore(3)
			it := algorithm.Item{Key: "rl:{a}:x", Spec: spec, Cost: 1}
			assert.Equal(t, 30, admit(t, s, it, 100), "a node's share of 90 over 3 nodes")
			assert.Equal(t, int64(30), s.Share(90))
		})
	}
}

func TestRemainingIsInRequests(t *testing.T) {
	s, _, _ := newStore(3)
	res, err := s.Take(context.Background(), []algorithm.Group{{{Key: "rl:{a}:x", Spec: bucket, Cost: 1}}})
	require.NoError(t, err)
	assert.True(t, res[0].Allowed)
	assert.Equal(t, int64(29), res[0].Items[0].Remaining)
}

// A fall of N keeps the fraction of the share each key used: a key that
// spent its whole share of 30 does not get a fresh 45 in the same window,
// and a key that spent a third of it has two thirds of the new share left.
func TestRescaleKeepsTheFractionCounted(t *testing.T) {
	s, sz, _ := newStore(3)
	full := algorithm.Item{Key: "rl:{full}:x", Spec: bucket, Cost: 1}
	third := algorithm.Item{Key: "rl:{third}:x", Spec: bucket, Cost: 1}
	require.Equal(t, 30, admit(t, s, full, 30))
	require.Equal(t, 10, admit(t, s, third, 10))

	sz.n.Store(2) // a node died: shares are 45
	assert.Equal(t, 0, admit(t, s, full, 100), "a spent share stays spent")
	assert.Equal(t, 30, admit(t, s, third, 100), "two thirds of the new share of 45")

	sz.n.Store(3) // back to 3: nothing is minted by a rise either
	fresh := algorithm.Item{Key: "rl:{fresh}:x", Spec: bucket, Cost: 1}
	assert.Equal(t, 0, admit(t, s, third, 100))
	assert.Equal(t, 30, admit(t, s, fresh, 100))
}

func TestRefillRateIsLimitOverN(t *testing.T) {
	s, _, clk := newStore(3)
	it := algorithm.Item{Key: "rl:{a}:x", Spec: bucket, Cost: 1}
	require.Equal(t, 30, admit(t, s, it, 100))
	clk.Advance(20 * time.Second) // 90/min over 3 nodes: 0.5/s, so 10
	assert.Equal(t, 10, admit(t, s, it, 100))
}

func TestRefundGivesBackTheScaledCost(t *testing.T) {
	s, _, _ := newStore(3)
	it := algorithm.Item{Key: "rl:{a}:x", Spec: bucket, Cost: 5}
	g := []algorithm.Group{{it}}
	_, err := s.Take(context.Background(), g)
	require.NoError(t, err)
	require.NoError(t, s.Refund(context.Background(), g))
	res, err := s.Take(context.Background(), []algorithm.Group{{{Key: it.Key, Spec: bucket, Cost: 0}}})
	require.NoError(t, err)
	assert.Equal(t, int64(30), res[0].Items[0].Remaining)
}

// A share below one request is raised to one request, so a low limit on
// many nodes does not deny everything while the store is down.
func TestShareHoldsAtLeastOneRequest(t *testing.T) {
	for _, spec := range []algorithm.Spec{
		{Algorithm: algorithm.TokenBucket, Limit: 5, Period: time.Minute},
		{Algorithm: algorithm.FixedWindow, Limit: 5, Period: time.Minute},
		{Algorithm: algorithm.SlidingWindowLog, Limit: 5, Period: time.Minute},
	} {
		t.Run(spec.Algorithm.String(), func(t *testing.T) {
			s, _, _ := newStore(10)
			it := algorithm.Item{Key: "rl:{a}:x", Spec: spec, Cost: 1}
			assert.Equal(t, 1, admit(t, s, it, 10))
		})
	}
	s, _, _ := newStore(10)
	res, err := s.Take(context.Background(), []algorithm.Group{{{Key: "rl:{b}:x", Spec: bucket, Cost: 91}}})
	require.NoError(t, err)
	assert.False(t, res[0].Allowed)
	assert.Equal(t, algorithm.Never, res[0].Items[0].RetryAfter, "a cost above the limit stays impossible")
}

func TestNeverDividesByLessThanOne(t *testing.T) {
	s, _, _ := newStore(0)
	assert.Equal(t, int64(1), s.N())
	assert.Equal(t, int64(2), fallback.New(fallback.Fixed(2), nil).N())
}
