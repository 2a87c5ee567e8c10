package coord_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/rebalance"
	"github.com/allot-dev/allot/region"
)

// These tests run the coordinator's scripts (share.lua, quota.lua) against
// the exact path's check.lua on a real redis-server: what the coordinator
// writes is what the decisions read.

func openStore(t *testing.T) *region.Store {
	t.Helper()
	redistest.Require(t)
	in := redistest.Server(t)
	st, err := region.Open(context.Background(), []string{in.Addr}, region.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// take runs one exact-path check of cost 1 on key and reports whether it
// was admitted.
func take(t *testing.T, st *region.Store, key string, spec algorithm.Spec) bool {
	t.Helper()
	res, err := st.Take(context.Background(), []algorithm.Group{{{Key: key, Spec: spec, Cost: 1}}})
	require.NoError(t, err)
	return res[0].Allowed
}

func admitted(t *testing.T, st *region.Store, key string, spec algorithm.Spec, n int) int {
	got := 0
	for range n {
		if take(t, st, key, spec) {
			got++
		}
	}
	return got
}

// An exact global token bucket enforces the coordinator's share, not the
// L/n its node passes, and keeps the share's TTL.
func TestExactPathEnforcesCoordinatorShare(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	key := "rl:{tenant=a}:global:rps"
	third := algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Hour, Burst: 100} // L/3 of 300 per hour
	global := coord.Limit{Rate: 300.0 / 3600, Burst: 300}
	w := coord.RedisWriter{Client: st.Client()}
	share := rebalance.Unit / 5 * 4 // 240 of 300
	require.NoError(t, w.WriteShares(ctx, []coord.ShareUpdate{{Key: key, Share: share, Global: global,
		Old: coord.Limit{Rate: global.Rate / 3, Burst: 100}, TTL: time.Hour}}))

	require.Equal(t, 240, admitted(t, st, key, third, 260), "the share's burst, not L/3")
	require.Greater(t, st.Client().PTTL(ctx, key).Val(), 59*time.Minute, "a take must not shorten the share's TTL")

	// A refund is capped at the share's burst, not at L/3.
	refund := func(n int64) {
		t.Helper()
		require.NoError(t, st.Refund(ctx, []algorithm.Group{{{Key: key, Spec: third, Cost: n}}}))
	}
	refund(5)
	require.Equal(t, 5, admitted(t, st, key, third, 10))
	refund(1000)
	require.Equal(t, 240, admitted(t, st, key, third, 260), "refunded up to the share's burst")
}

// quota.lua only raises the remote count, and check.lua counts it against
// the limit in its window only.
func TestQuotaRemoteCountsAgainstTheLimit(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	key := "rl:{tenant=q}:hourly:quota"
	spec := algorithm.Spec{Algorithm: algorithm.FixedWindow, Limit: 100, Period: time.Hour}
	w := coord.RedisWriter{Client: st.Client()}
	now, err := st.Client().Time(ctx).Result()
	require.NoError(t, err)
	win := now.UnixNano() / int64(time.Hour)
	if time.Until(time.Unix(0, (win+1)*int64(time.Hour))) < 10*time.Second {
		t.Skip("too close to the end of the hour for a window-bound test")
	}
	write := func(window int64, used uint64) {
		t.Helper()
		require.NoError(t, w.WriteRemote(ctx, []coord.RemoteCount{{Key: key, Window: window, Used: used, Period: time.Hour}}))
	}
	write(win, 70)
	write(win, 40)   // late and smaller: ignored
	write(win-1, 99) // an older window: ignored
	require.Equal(t, 30, admitted(t, st, key, spec, 50), "100 minus the others' 70")

	counts, err := w.ReadCounts(ctx, []string{key, "rl:{tenant=none}:hourly:quota"})
	require.NoError(t, err)
	require.Equal(t, map[string]coord.QuotaCount{key: {Window: win, Used: 30}}, counts, "this region's own count only")

	write(win, 90) // the others spent more meanwhile
	require.Equal(t, 0, admitted(t, st, key, spec, 5))
	ttl := st.Client().PTTL(ctx, key).Val()
	require.Greater(t, ttl, time.Duration(0))
	require.LessOrEqual(t, ttl, time.Hour+time.Second, "the TTL ends with the window")

	// A remote count of a past window does not count in the current one.
	fresh := "rl:{tenant=p}:hourly:quota"
	require.NoError(t, w.WriteRemote(ctx, []coord.RemoteCount{{Key: fresh, Window: win - 1, Used: 100, Period: time.Hour}}))
	require.Equal(t, 5, admitted(t, st, fresh, spec, 5))

	// After SCRIPT FLUSH the writer re-runs with EVAL.
	require.NoError(t, st.Client().ScriptFlush(ctx).Err())
	write(win, 95)
	require.Equal(t, "95", st.Client().HGet(ctx, key, "fw_remote").Val())
}
