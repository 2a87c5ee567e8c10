package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

func lease1(t *testing.T, s *region.Store, g lease.Group) lease.Reply {
	t.Helper()
	res, err := s.Lease(context.Background(), []lease.Group{g})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.NoError(t, res[0].Err)
	require.Len(t, res[0].Items, len(g))
	return res[0]
}

func TestLeaseGrantsAndCounts(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	spec := tb(100, time.Hour, 0) // slow refill: numbers stay whole
	key := "rl:{tenant=a}:p:l"

	r := lease1(t, s, lease.Group{{Key: key, Spec: spec, Need: 1, Want: 30}})
	assert.True(t, r.Granted)
	assert.Equal(t, int64(30), r.Items[0].Granted)
	assert.Equal(t, int64(70), r.Items[0].Left)
	assert.Equal(t, int64(100), r.Items[0].Burst)
	assert.InDelta(t, 100.0/3600, r.Items[0].Rate, 1e-9)

	// Want more than is left: a background refill (need 0) takes what is there.
	r = lease1(t, s, lease.Group{{Key: key, Spec: spec, Need: 0, Want: 500}})
	assert.Equal(t, int64(70), r.Items[0].Granted)
	assert.Equal(t, int64(0), r.Items[0].Left)

	// An empty bucket denies a need and says when it could give it.
	r = lease1(t, s, lease.Group{{Key: key, Spec: spec, Need: 2, Want: 10}})
	assert.False(t, r.Granted)
	assert.Equal(t, int64(0), r.Items[0].Granted)
	assert.InDelta(t, float64(72*time.Second), float64(r.Items[0].RetryAfter), float64(time.Second))

	h, err := s.Client().HMGet(ctx, key, "granted", "wanted").Result()
	require.NoError(t, err)
	assert.Equal(t, "100", h[0])
	assert.Equal(t, "540", h[1], "wanted counts denied asks too")

	// Need above the burst can never be granted.
	r = lease1(t, s, lease.Group{{Key: "rl:{tenant=b}:p:l", Spec: spec, Need: 101, Want: 101}})
	assert.False(t, r.Granted)
	assert.Less(t, r.Items[0].RetryAfter, time.Duration(0))
}

func TestLeaseAllOrNothing(t *testing.T) {
	s := single(t)
	small, big := tb(2, time.Hour, 0), tb(100, time.Hour, 0)
	g := lease.Group{
		{Key: "rl:{u}:p:big", Spec: big, Need: 1, Want: 50},
		{Key: "rl:{u}:p:small", Spec: small, Need: 3, Want: 3},
	}
	r := lease1(t, s, g)
	assert.False(t, r.Granted)
	assert.Zero(t, r.Items[0].Granted)
	assert.Zero(t, r.Items[0].RetryAfter, "big alone could give its need")
	assert.Less(t, r.Items[1].RetryAfter, time.Duration(0))
	n, err := s.Client().Exists(context.Background(), "rl:{u}:p:big", "rl:{u}:p:small").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a denial writes no bucket")
}

func TestLeaseCoordinatorShareOverrides(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	key := "rl:{g}:p:l"
	require.NoError(t, s.Client().HSet(ctx, key, "tokens", 5, "ts", redisNow(t, s.Client()), "rate", "0.5", "burst", 7).Err())
	r := lease1(t, s, lease.Group{{Key: key, Spec: tb(1000, time.Second, 0), Need: 1, Want: 100}})
	assert.True(t, r.Granted)
	assert.Equal(t, int64(5), r.Items[0].Granted, "the share's tokens, not the policy's burst")
	assert.Equal(t, int64(7), r.Items[0].Burst)
	assert.InDelta(t, 0.5, r.Items[0].Rate, 1e-12)
}

func TestReturnDecaysWithAge(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	spec := tb(10, time.Second, 100)
	key := "rl:{r}:p:l"
	lease1(t, s, lease.Group{{Key: key, Spec: spec, Need: 100, Want: 100}})

	// Returned at once: nearly everything comes back.
	n, err := s.Return(ctx, []lease.ReturnItem{{Key: key, Spec: spec, Unspent: 60, Age: 0}})
	require.NoError(t, err)
	assert.InDelta(t, 60, n, 1)
	st := bucket(t, s.Client(), key)
	assert.InDelta(t, 60, st.Tokens, 1)

	// Returned 5 s after the ask: the bucket refilled 50 meanwhile, so only
	// 40 of 90 unspent come back (credit = unspent - rate*age).
	lease1(t, s, lease.Group{{Key: key, Spec: spec, Need: 0, Want: 100}})
	n, err = s.Return(ctx, []lease.ReturnItem{{Key: key, Spec: spec, Unspent: 90, Age: 5 * time.Second}})
	require.NoError(t, err)
	assert.InDelta(t, 40, n, 1)

	// Old enough: nothing comes back.
	n, err = s.Return(ctx, []lease.ReturnItem{{Key: key, Spec: spec, Unspent: 10, Age: time.Minute}})
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestLeaseNoScriptAndCluster(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"single", func(t *testing.T) []string { return []string{redistest.Server(t).Addr} }},
		{"cluster", func(t *testing.T) []string { return redistest.Cluster(t, 3) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, tc.addrs(t)...)
			ctx := context.Background()
			spec := tb(10, time.Second, 0)
			var groups []lease.Group
			for _, u := range []string{"a", "b", "c", "d", "e", "f"} {
				groups = append(groups, lease.Group{{Key: "rl:{" + u + "}:p:l", Spec: spec, Need: 1, Want: 4}})
			}
			if cc, ok := s.Client().(*redis.ClusterClient); ok {
				require.NoError(t, cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
					return c.ScriptFlush(ctx).Err()
				}))
			} else {
				require.NoError(t, s.Client().ScriptFlush(ctx).Err())
			}
			res, err := s.Lease(ctx, groups)
			require.NoError(t, err)
			for _, r := range res {
				require.NoError(t, r.Err)
				assert.Equal(t, int64(4), r.Items[0].Granted)
			}
		})
	}
}

// A coordinator's share must outlive an idle bucket's own TTL: a grant
// may extend the key's TTL but never shorten one the coordinator set.
func TestLeaseNeverShortensTTL(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	key := "rl:{tenant=ttl}:p:l"
	spec := tb(100, time.Second, 0) // own TTL: 1 s of refill + 1 s grace
	require.NoError(t, s.Client().HSet(ctx, key, "rate", 100, "burst", 100).Err())
	require.NoError(t, s.Client().PExpire(ctx, key, time.Hour).Err())
	lease1(t, s, lease.Group{{Key: key, Spec: spec, Need: 1, Want: 10}})
	ttl, err := s.Client().PTTL(ctx, key).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 59*time.Minute, "the coordinator's longer TTL survives a grant")

	fresh := "rl:{tenant=ttl2}:p:l"
	lease1(t, s, lease.Group{{Key: fresh, Spec: spec, Need: 1, Want: 10}})
	ttl, err = s.Client().PTTL(ctx, fresh).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Duration(0), "a new bucket still gets an idle TTL")
	assert.LessOrEqual(t, ttl, 2*time.Second)
}

// Lease and Return refuse a spec out of algorithm.Spec's bounds (here a
// limit past 2^52, where the scripts' doubles stop counting whole
// tokens) before anything is sent: nothing is written.
func TestLeaseRefusesSpecsOutOfBounds(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	key := "rl:{tenant=huge}:p:l"
	huge := tb(1<<53, time.Second, 0)
	_, err := s.Lease(ctx, []lease.Group{{{Key: key, Spec: huge, Need: 1, Want: 1}}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), key)
	_, err = s.Return(ctx, []lease.ReturnItem{{Key: key, Spec: huge, Unspent: 1}})
	require.Error(t, err)
	n, err := s.Client().Exists(ctx, key).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing written")
}
