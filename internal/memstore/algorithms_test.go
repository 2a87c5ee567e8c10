package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/fakeclock"
)

func at(a algorithm.Algorithm, limit int64, period time.Duration) algorithm.Spec {
	return algorithm.Spec{Algorithm: a, Limit: limit, Period: period}
}

// midnight is a window boundary for every period below (a whole UTC day).
var midnight = time.Unix(1_700_006_400, 0)

// A request checked against a token-bucket per_second and a fixed-window
// per_day in one group: once the day is spent, a denial takes nothing
// from the second either.
func TestMixedAlgorithmsAllOrNothing(t *testing.T) {
	clk := fakeclock.New(midnight.Add(time.Hour))
	s := New(clk.Now)
	g := algorithm.Group{
		{Key: "rl:{t}:p:sec", Spec: spec, Cost: 1}, // token bucket 100/s, burst 50
		{Key: "rl:{t}:p:day", Spec: at(algorithm.FixedWindow, 2, 24*time.Hour), Cost: 1},
		{Key: "rl:{t}:p:otp", Spec: at(algorithm.SlidingWindowLog, 5, time.Minute), Cost: 1},
	}
	require.True(t, take(t, s, g).Allowed)
	require.True(t, take(t, s, g).Allowed)
	res := take(t, s, g)
	require.False(t, res.Allowed)
	assert.EqualValues(t, 48, res.Items[0].Remaining, "no tokens taken by the denial")
	assert.EqualValues(t, 3, res.Items[2].Remaining, "no log entry added by the denial")
	assert.Equal(t, 23*time.Hour, res.Items[1].RetryAfter, "until the UTC day ends")

	clk.Advance(23 * time.Hour) // a new day; the bucket refilled
	res = take(t, s, g)
	require.True(t, res.Allowed)
	assert.EqualValues(t, 1, res.Items[1].Remaining)
	assert.EqualValues(t, 4, res.Items[2].Remaining, "the log's entries are 23h old")
}

func TestFixedWindowBoundary(t *testing.T) {
	clk := fakeclock.New(midnight.Add(-time.Millisecond))
	s := New(clk.Now)
	g := algorithm.Group{{Key: "rl:{q}:day", Spec: at(algorithm.FixedWindow, 10, 24*time.Hour), Cost: 10}}
	require.True(t, take(t, s, g).Allowed, "the whole quota 1ms before midnight")
	clk.Advance(2 * time.Millisecond)
	require.True(t, take(t, s, g).Allowed, "and again 1ms after: 2× the limit within 2ms")
	g[0].Cost = 1
	res := take(t, s, g)
	require.False(t, res.Allowed)
	assert.Equal(t, 24*time.Hour-time.Millisecond, res.Items[0].RetryAfter)
}

// The seed's worked example through the store: 80 in the previous
// minute, 30 in this one, 15s into it: 90 counted, 10 left.
func TestSlidingCounterThroughStore(t *testing.T) {
	clk := fakeclock.New(midnight.Add(10 * time.Second))
	s := New(clk.Now)
	g := algorithm.Group{{Key: "rl:{c}:min", Spec: at(algorithm.SlidingWindowCounter, 100, time.Minute), Cost: 80}}
	require.True(t, take(t, s, g).Allowed)
	clk.Advance(time.Minute + 5*time.Second) // to 1m15s
	g[0].Cost = 30
	require.True(t, take(t, s, g).Allowed, "60 + 30 <= 100")
	g[0].Cost = 0
	assert.EqualValues(t, 10, take(t, s, g).Items[0].Remaining)
	g[0].Cost = 11
	assert.False(t, take(t, s, g).Allowed)
	g[0].Cost = 10
	assert.True(t, take(t, s, g).Allowed)
}

func TestGCRAThroughStore(t *testing.T) {
	clk := fakeclock.New(midnight)
	s := New(clk.Now)
	g := algorithm.Group{{Key: "rl:{g}:s", Spec: algorithm.Spec{Algorithm: algorithm.GCRA, Limit: 5, Period: time.Second, Burst: 2}, Cost: 1}}
	assert.True(t, take(t, s, g).Allowed)
	assert.True(t, take(t, s, g).Allowed)
	res := take(t, s, g)
	require.False(t, res.Allowed)
	assert.Equal(t, 200*time.Millisecond, res.Items[0].RetryAfter, "T = 1s/5")
	require.NoError(t, s.Refund(context.Background(), []algorithm.Group{g}))
	assert.True(t, take(t, s, g).Allowed, "refund moved TAT back by T")
}

func TestSlidingLogRefundAndEviction(t *testing.T) {
	clk := fakeclock.New(midnight)
	s := New(clk.Now)
	g := algorithm.Group{{Key: "rl:{l}:otp", Spec: at(algorithm.SlidingWindowLog, 3, time.Minute), Cost: 3}}
	require.True(t, take(t, s, g).Allowed)
	g[0].Cost = 1
	require.False(t, take(t, s, g).Allowed)
	require.NoError(t, s.Refund(context.Background(), []algorithm.Group{g}))
	assert.True(t, take(t, s, g).Allowed, "the refunded entry is gone")

	// Idle past its TTL (newest entry + window + 1s), the key is swept.
	clk.Advance(time.Minute + time.Second + time.Millisecond)
	other := algorithm.Group{{Key: "rl:{l}:other", Spec: g[0].Spec, Cost: 0}}
	for range sweepEvery {
		take(t, s, other)
	}
	assert.Equal(t, 1, s.Len(), "the idle log was evicted, the busy key kept")
}

func TestInvalidGroupsAreErrors(t *testing.T) {
	s := New(nil)
	for name, g := range map[string]algorithm.Group{
		"log above 10000":  {{Key: "rl:{v}:a", Spec: at(algorithm.SlidingWindowLog, 10_001, time.Minute), Cost: 1}},
		"negative cost":    {{Key: "rl:{v}:a", Spec: spec, Cost: -1}},
		"duplicate key":    {{Key: "rl:{v}:a", Spec: spec, Cost: 1}, {Key: "rl:{v}:a", Spec: spec, Cost: 1}},
		"no algorithm set": {{Key: "rl:{v}:a", Spec: algorithm.Spec{Limit: 1, Period: time.Second}, Cost: 1}},
	} {
		_, err := s.Take(context.Background(), []algorithm.Group{g})
		assert.ErrorContains(t, err, "memstore: take", name)
		assert.Error(t, s.Refund(context.Background(), []algorithm.Group{g}), name)
	}
	assert.Zero(t, s.Len())
}
