package lease

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTakeUpToTakesBatchesWithinTheBucket(t *testing.T) {
	clk := NewManualClock()
	m := newManager(t, newFake(clk), clk)
	// 10 tokens an hour: nothing refills during the test.
	lim := newLimit(t, m, spec(10, time.Hour, 10), Config{MaxShare: 1}, false)
	ctx := context.Background()
	subj := []byte("a")

	var got []int64
	for range 8 {
		r, err := m.TakeUpTo(ctx, lim, subj, 4, 0)
		require.NoError(t, err)
		assert.False(t, r.Exact)
		assert.LessOrEqual(t, r.Tokens(), int64(4))
		if !r.Allowed {
			assert.Zero(t, r.Tokens(), "a denial takes nothing")
			assert.Positive(t, r.RetryAfter)
			break
		}
		assert.Positive(t, r.Tokens())
		got = append(got, r.Tokens())
		waitIdle(t, m)
	}
	var sum int64
	for _, n := range got {
		sum += n
	}
	assert.Equal(t, int64(10), sum, "every token of the bucket, and none more: %v", got)
	assert.Equal(t, int64(4), got[0], "a refill's grant is taken whole up to most")
}

func TestGiveBackPartKeepsTheRest(t *testing.T) {
	clk := NewManualClock()
	m := newManager(t, newFake(clk), clk)
	lim := newLimit(t, m, spec(10, time.Hour, 10), Config{MaxShare: 1}, false)
	ctx := context.Background()
	r, err := m.TakeUpTo(ctx, lim, []byte("a"), 10, 0)
	require.NoError(t, err)
	require.Equal(t, int64(10), r.Tokens())
	m.GiveBackPart(&r, 3)
	assert.Equal(t, int64(7), r.Tokens())
	m.GiveBackPart(&r, 100) // no more than it holds
	assert.Zero(t, r.Tokens())
	back, err := m.TakeUpTo(ctx, lim, []byte("a"), 20, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(10), back.Tokens(), "what was given back is on hand again")
}

func TestTakeUpToIsNeverSentToTheExactPath(t *testing.T) {
	clk := NewManualClock()
	m, err := New(Options{Source: newFake(clk), Clock: clk, SweepEvery: -1, ColdExact: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	lim := newLimit(t, m, spec(100, time.Second, 100), Config{}, false)
	r, err := m.Take(context.Background(), lim, []byte("cold"), 1)
	require.NoError(t, err)
	require.True(t, r.Exact, "a cold key's Take goes exact")
	r, err = m.TakeUpTo(context.Background(), lim, []byte("cold"), 5, 0)
	require.NoError(t, err)
	assert.False(t, r.Exact)
	assert.True(t, r.Allowed)
	assert.Equal(t, int64(5), r.Tokens())
}

func TestTakeUpToSurfacesStoreErrors(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	src.fail = assert.AnError
	m := newManager(t, src, clk)
	lim := newLimit(t, m, spec(100, time.Second, 100), Config{}, false)
	_, err := m.TakeUpTo(context.Background(), lim, []byte("a"), 5, 0)
	assert.ErrorIs(t, err, assert.AnError)
	_, err = m.TakeUpTo(context.Background(), lim, []byte("a"), 0, 0)
	assert.Error(t, err)
}

// A want above most leaves the rest on hand for the key's next taker,
// out of the region bucket (where it could overflow the burst).
func TestTakeUpToWantLeavesTheRestOnHand(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	m := newManager(t, src, clk)
	lim := newLimit(t, m, spec(10, time.Hour, 10), Config{MaxShare: 1}, false)
	ctx := context.Background()
	r, err := m.TakeUpTo(ctx, lim, []byte("a"), 4, 10)
	require.NoError(t, err)
	assert.Equal(t, int64(4), r.Tokens())
	calls := src.calls
	r, err = m.TakeUpTo(ctx, lim, []byte("a"), 6, 6)
	require.NoError(t, err)
	assert.Equal(t, int64(6), r.Tokens(), "the other 6 were on hand")
	assert.Equal(t, calls, src.calls, "no second lease call")
}
