package algorithm_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
)

// Each bound of bounds.go, exactly at its edge and one step past; the
// same edges run end to end on Redis in region's TestSpecBoundsOnRedis.
func TestValidateBoundsAtTheEdge(t *testing.T) {
	for _, tc := range []struct {
		max, past algorithm.Spec
		want      string
	}{
		// Issue 13: limit 1 per 8784h with burst 3162316 validated and then
		// failed in the scripts. ⌊2^51 / 8784h in µs⌋ = 71.
		{spec(algorithm.TokenBucket, 1, 8784*time.Hour, 71), spec(algorithm.TokenBucket, 1, 8784*time.Hour, 72), "at most burst 71 for this limit and period"},
		{spec(algorithm.TokenBucket, 1000, (1<<31)*time.Millisecond, 1<<20), spec(algorithm.TokenBucket, 1000, (1<<31)*time.Millisecond, 1<<20+1), "2^51 µs"},
		{spec(algorithm.TokenBucket, 1<<52, time.Millisecond, 0), spec(algorithm.TokenBucket, 1<<52+1, time.Millisecond, 0), "at most 2^52"},
		{spec(algorithm.TokenBucket, 1<<52, time.Millisecond, 1<<52), spec(algorithm.TokenBucket, 1<<52, time.Millisecond, 1<<52+1), "at most 2^52"},
		{spec(algorithm.GCRA, 125, 131072*time.Millisecond, 1<<31), spec(algorithm.GCRA, 125, 131072*time.Millisecond, 1<<31+1), "at most burst 2147483648"},
		{spec(algorithm.SlidingWindowCounter, 5, 1125899906842*time.Millisecond, 0), spec(algorithm.SlidingWindowCounter, 5, 1125899906843*time.Millisecond, 0), "keeps two windows"},
		{spec(algorithm.FixedWindow, 5, 2251799813685*time.Millisecond, 0), spec(algorithm.FixedWindow, 5, 2251799813686*time.Millisecond, 0), "period 625499h56m53.686s is too long"},
		{spec(algorithm.SlidingWindowLog, 5, 2251799813685*time.Millisecond, 0), spec(algorithm.SlidingWindowLog, 5, 2251799813686*time.Millisecond, 0), "2^51 µs"},
	} {
		require.NoError(t, tc.max.Validate(), "%+v", tc.max)
		err := tc.past.Validate()
		require.Error(t, err, "%+v", tc.past)
		assert.Contains(t, err.Error(), tc.want)
		assert.LessOrEqual(t, tc.max.TTL(), algorithm.MaxHorizon+time.Second+time.Millisecond, "%+v", tc.max)
	}
	err := spec(algorithm.TokenBucket, 1, 8784*time.Hour, 3162316).Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "3.17e+06 years")
}

// FuzzValidate: whatever Validate accepts, the Go maths (the scripts'
// twin) computes without overflow: a TTL within the bound, and waits that
// are durations or Never, from a fresh key and after a take. The Redis
// side of the same property is region's FuzzSpecOnRedis.
func FuzzValidate(f *testing.F) {
	f.Add(uint8(algorithm.TokenBucket), int64(1), int64(8784*3600*1000), int64(71), int64(1))
	f.Add(uint8(algorithm.TokenBucket), int64(1), int64(8784*3600*1000), int64(3162316), int64(1))
	f.Add(uint8(algorithm.GCRA), int64(125), int64(131072), int64(1<<31), int64(1<<31))
	f.Add(uint8(algorithm.SlidingWindowCounter), int64(1<<40), int64(1125899906842), int64(0), int64(3))
	f.Add(uint8(algorithm.FixedWindow), int64(1<<52), int64(2251799813685), int64(0), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, algo uint8, limit, periodMS, burst, cost int64) {
		if periodMS <= 0 || periodMS > math.MaxInt64/int64(time.Millisecond) || cost < 0 {
			return
		}
		s := spec(algorithm.Algorithm(algo), limit, time.Duration(periodMS)*time.Millisecond, burst)
		if s.Validate() != nil {
			return
		}
		ttl := s.TTL()
		require.Greater(t, ttl, time.Duration(0), "%+v", s)
		require.LessOrEqual(t, ttl, algorithm.MaxHorizon+time.Second+time.Millisecond, "%+v", s)
		now := int64(1<<52) - int64(algorithm.MaxHorizon/time.Microsecond) // the year 2040, say: any now below 2^52 will do
		st := algorithm.State{}
		for range 2 {
			d := algorithm.Decide(s, st, now, cost)
			for _, r := range []algorithm.ItemResult{d.Taken, d.Kept} {
				require.True(t, r.RetryAfter >= 0 || r.RetryAfter == algorithm.Never, "%+v: retry %v", s, r.RetryAfter)
				require.GreaterOrEqual(t, r.ResetAfter, time.Duration(0), "%+v", s)
				require.LessOrEqual(t, r.ResetAfter, algorithm.MaxHorizon+time.Millisecond, "%+v", s)
			}
			require.GreaterOrEqual(t, d.TTL, time.Duration(0), "%+v", s)
			require.LessOrEqual(t, d.TTL, ttl, "%+v", s)
			if d.OK {
				st = d.Next
			}
		}
	})
}
