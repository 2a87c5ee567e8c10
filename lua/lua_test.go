package lua_test

import (
	"context"
	"crypto/sha1"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/lua"
)

// The happy paths are tested through package region; here the scripts'
// own argument checks, which region never lets through.
func TestScriptsRejectBadArguments(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	defer c.Close()
	ctx := context.Background()
	keys := []string{"rl:{s}:a"}
	for name, args := range map[string][]any{
		"short ARGV":        {"tb", 10, 1000, 0},
		"unknown algorithm": {"xx", 10, 1000, 0, 1},
		"non-numeric":       {"tb", "ten", 1000, 0, 1},
		"zero period":       {"tb", 10, 0, 0, 1},
		"negative cost":     {"tb", 10, 1000, 0, -1},
	} {
		for _, s := range []*redis.Script{lua.Check, lua.CheckTB, lua.Refund} {
			err := s.Run(ctx, c, keys, args...).Err()
			require.Error(t, err, name)
			assert.Contains(t, err.Error(), "allot:", name)
		}
	}
	n, err := c.Exists(ctx, keys...).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a rejected call writes nothing")
}

func TestCheckReply(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	defer c.Close()
	ctx := context.Background()
	// burst 0 means burst = limit: 10 tokens, 10 per second.
	v, err := lua.Check.Run(ctx, c, []string{"rl:{s}:a", "rl:{s}:b"}, "tb", 10, 1000, 0, 4, "tb", 1, 3600000, 2, 1).Int64Slice()
	require.NoError(t, err)
	require.Len(t, v, 1+3*2)
	assert.Equal(t, []int64{1, 6, 0, 400000, 1, 0, 3600000000}, v)
}

func TestSourceOfEveryScript(t *testing.T) {
	for _, sc := range []*redis.Script{lua.Check, lua.CheckTB, lua.Refund, lua.Lease, lua.Return} {
		src := lua.Source(sc)
		if sum := fmt.Sprintf("%x", sha1.Sum([]byte(src))); src == "" || sum != sc.Hash() {
			t.Errorf("Source of %s: %d bytes hashing to %s", sc.Hash(), len(src), sum)
		}
	}
	if lua.Source(redis.NewScript("return 1")) != "" {
		t.Error("a foreign script has a source")
	}
}

// check_tb.lua is check.lua's token bucket, inlined: from the same stored
// states (a plain bucket, a coordinator's share, a key of another type, a
// missing key), with ts in the future so that the microseconds between
// two calls cannot matter, both give the same replies and leave the same
// hashes and TTLs, call after call, taken or denied.
func TestCheckTBIsCheck(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	defer c.Close()
	ctx := context.Background()
	tm, err := c.Time(ctx).Result()
	require.NoError(t, err)
	future := fmt.Sprint(tm.Add(time.Hour).UnixMicro())
	setup := func(tag string) []string {
		keys := []string{"rl:{" + tag + "}:plain", "rl:{" + tag + "}:share", "rl:{" + tag + "}:stale", "rl:{" + tag + "}:missing"}
		require.NoError(t, c.Del(ctx, keys...).Err())
		require.NoError(t, c.HSet(ctx, keys[0], "tokens", "7.3", "ts", future).Err())
		require.NoError(t, c.HSet(ctx, keys[1], "tokens", "2.5", "ts", future, "rate", "0.5", "burst", "4").Err())
		require.NoError(t, c.PExpire(ctx, keys[1], time.Hour).Err()) // the coordinator's longer TTL
		require.NoError(t, c.ZAdd(ctx, keys[2], redis.Z{Score: 1, Member: "a"}).Err())
		return keys
	}
	a, b := setup("a"), setup("b")
	for step, costs := range [][4]int64{{1, 1, 1, 1}, {2, 0, 3, 0}, {0, 2, 0, 0}, {9, 0, 0, 0}, {1, 1, 1, 1}, {0, 0, 0, 0}, {3, 1, 0, 11}} {
		var args []any
		for i, cost := range costs {
			args = append(args, "tb", []int64{7, 100, 3, 10}[i], []int64{3000, 1000, 2300, 60000}[i], []int64{10, 0, 0, 10}[i], cost)
		}
		want, err := lua.Check.Run(ctx, c, a, args...).Int64Slice()
		require.NoError(t, err)
		got, err := lua.CheckTB.Run(ctx, c, b, args...).Int64Slice()
		require.NoError(t, err)
		msg := fmt.Sprintf("step %d costs %v", step, costs)
		require.Equal(t, want, got, msg)
		for i := range a {
			wh, err := c.HGetAll(ctx, a[i]).Result()
			require.NoError(t, err)
			gh, err := c.HGetAll(ctx, b[i]).Result()
			require.NoError(t, err)
			if i >= 2 && step == 0 { // created by this call, at Redis' now
				assert.NotEmpty(t, gh["ts"], msg)
				delete(wh, "ts")
				delete(gh, "ts")
			}
			assert.Equal(t, wh, gh, msg+" "+a[i])
			wt, err := c.PTTL(ctx, a[i]).Result()
			require.NoError(t, err)
			gt, err := c.PTTL(ctx, b[i]).Result()
			require.NoError(t, err)
			assert.InDelta(t, wt, gt, float64(50*time.Millisecond), msg+" "+a[i])
		}
		// The stale and missing keys are fresh buckets now, stamped with
		// Redis' clock: freeze them too.
		for _, k := range []string{a[2], a[3], b[2], b[3]} {
			if n, err := c.Exists(ctx, k).Result(); err == nil && n == 1 {
				require.NoError(t, c.HSet(ctx, k, "ts", future).Err())
			}
		}
	}
}
