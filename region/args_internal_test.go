package region

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
)

// A spec's script arguments are boxed once and shared by every check of
// it; past maxSpecArgs distinct specs they are boxed per call, with the
// same values, and the cache stops growing.
func TestSpecArgsBoxedOnceAndBounded(t *testing.T) {
	var sa specArgs
	sp := algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 1000, Period: time.Second, Burst: 500}
	a, err := sa.of(sp)
	require.NoError(t, err)
	b, err := sa.of(sp)
	require.NoError(t, err)
	assert.Equal(t, []any{sp.Algorithm.Code(), int64(1000), int64(1000), int64(500)}, a)
	assert.Same(t, &a[0], &b[0], "one boxed copy per spec")
	for i := range maxSpecArgs + 10 {
		sp.Limit = int64(2000 + i)
		got, err := sa.of(sp)
		require.NoError(t, err)
		assert.Equal(t, sp.Limit, got[1])
	}
	assert.Equal(t, int32(maxSpecArgs), sa.n.Load())
	n := 0
	sa.m.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, maxSpecArgs, n)
}

// Only a valid spec is kept: an invalid one is refused on every call
// (Validate's error), never boxed, and takes no room in the table, so a
// kept spec can skip Validate.
func TestSpecArgsKeepOnlyValidSpecs(t *testing.T) {
	var sa specArgs
	bad := algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 10, Period: 1500 * time.Microsecond}
	for range 3 {
		a, err := sa.of(bad)
		assert.ErrorContains(t, err, "whole number of milliseconds")
		assert.Nil(t, a)
	}
	assert.Equal(t, int32(0), sa.n.Load())
	_, kept := sa.m.Load(bad)
	assert.False(t, kept)

	// Through the store's layout too: the key is named.
	err := sa.checkGroup(algorithm.Group{{Key: "k", Spec: bad, Cost: 1}})
	assert.ErrorContains(t, err, `key "k"`)
}

// decodeCheck reads the reply in place and refuses anything but integers
// where check.lua puts them, instead of zeros.
func TestDecodeCheckRefusesNonIntegers(t *testing.T) {
	var r algorithm.Result
	items := make([]algorithm.ItemResult, 1)
	require.NoError(t, decodeCheck([]any{int64(1), int64(9), int64(0), int64(-1)}, &r, items))
	assert.True(t, r.Allowed)
	assert.Equal(t, algorithm.ItemResult{Remaining: 9, RetryAfter: 0, ResetAfter: algorithm.Never}, r.Items[0])

	bad := []any{int64(1), "9", int64(0), int64(0)}
	assert.ErrorContains(t, decodeCheck(bad, &r, items), "want an integer")
	assert.ErrorContains(t, decodeCheck(bad, &r, make([]algorithm.ItemResult, 2)), "4 values for 2 keys")
	assert.ErrorContains(t, decodeCheck("OK", &r, items), "not an array")
}
