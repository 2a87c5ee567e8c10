package region_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/region"
)

// CallTimeout splits a decision's budget (--redis-timeout) into the Redis
// call's deadline and a margin kept for waking up and deciding without
// Redis.
func TestCallTimeout(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		budget, margin, want time.Duration
	}{
		{5 * ms, 0, 4 * ms},                  // the node's default: 1 ms kept back
		{20 * ms, 0, 19 * ms},                // the default margin is at most 1 ms
		{time.Second, 0, time.Second - ms},   // embedded nodes: 1 s budget
		{2 * ms, 0, 1600 * time.Microsecond}, // tight budgets keep 80 % for Redis
		{5 * time.Microsecond, 0, 4 * time.Microsecond},
		{4, 0, 4},            // too small to split: all of it
		{5 * ms, -1, 5 * ms}, // negative: no margin, as before
		{5 * ms, -time.Hour, 5 * ms},
		{5 * ms, 2 * ms, 3 * ms}, // an explicit margin, used as given
		{5 * ms, 5*ms - 1, 1},
		{2 * ms, 1500 * time.Microsecond, 500 * time.Microsecond}, // even above budget/5
	} {
		got, err := region.CallTimeout(c.budget, c.margin)
		require.NoError(t, err, "budget %v margin %v", c.budget, c.margin)
		assert.Equal(t, c.want, got, "budget %v margin %v", c.budget, c.margin)
		assert.Positive(t, got)
		assert.LessOrEqual(t, got, c.budget, "the call never gets more than the budget")
	}
	for _, c := range []struct{ budget, margin time.Duration }{
		{5 * ms, 5 * ms}, // nothing left for Redis
		{5 * ms, 6 * ms},
		{0, 0},
		{-ms, 0},
		{0, -1},
	} {
		_, err := region.CallTimeout(c.budget, c.margin)
		assert.Error(t, err, "budget %v margin %v", c.budget, c.margin)
	}
}

// The default margin is min(1 ms, budget/5) for every budget: the call
// keeps at least 80 % of the budget and at most 1 ms is held back.
func TestCallTimeoutDefaultMarginBounds(t *testing.T) {
	for budget := time.Duration(1); budget < 50*time.Millisecond; budget = budget*3/2 + 1 {
		got, err := region.CallTimeout(budget, 0)
		require.NoError(t, err)
		kept := budget - got
		assert.LessOrEqual(t, kept, region.DefaultTimeoutMargin, fmt.Sprint(budget))
		assert.LessOrEqual(t, kept, budget/5, fmt.Sprint(budget))
		assert.Equal(t, min(region.DefaultTimeoutMargin, budget/5), kept, fmt.Sprint(budget))
	}
}

func TestStoreTimeout(t *testing.T) {
	redistest.Require(t)
	addr := redistest.Server(t).Addr
	for _, c := range []struct{ set, want time.Duration }{
		{4 * time.Millisecond, 4 * time.Millisecond},
		{0, region.DefaultReadTimeout},
	} {
		s, err := region.Open(context.Background(), []string{addr}, region.Options{Timeout: c.set})
		require.NoError(t, err)
		assert.Equal(t, c.want, s.Timeout())
		require.NoError(t, s.Close())
	}
}
