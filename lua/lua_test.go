package lua_test

import (
	"context"
	"crypto/sha1"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/luatest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
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
		for _, s := range []*redis.Script{lua.Check, lua.Refund} {
			err := s.Run(ctx, c, keys, args...).Err()
			require.Error(t, err, name)
			assert.Contains(t, err.Error(), "allot:", name)
		}
		// check_tb.lua fails the group alone, or the whole call when
		// the group's ARGV do not match its keys.
		k, a := luatest.CheckTBGroups([][]string{keys}, [][]any{args})
		v, err := lua.CheckTB.Run(ctx, c, k, a...).Result()
		if err == nil {
			vals, verr := lua.CheckTBReplies(v, 1)
			require.NoError(t, verr, name)
			err, _ = vals[0].(error)
		}
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "allot:", name)
	}
	n, err := c.Exists(ctx, keys...).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a rejected call writes nothing")
}

// checkTB runs lua.CheckTB on groups and returns each group's reply
// ([]int64) or error.
func checkTB(t *testing.T, c *redis.Client, keys [][]string, args [][]any) []any {
	t.Helper()
	k, a := luatest.CheckTBGroups(keys, args)
	v, err := lua.CheckTB.Run(context.Background(), c, k, a...).Result()
	require.NoError(t, err)
	vals, err := lua.CheckTBReplies(v, len(keys))
	require.NoError(t, err)
	out := make([]any, len(vals))
	for i, v := range vals {
		if e, ok := v.(error); ok {
			out[i] = e
			continue
		}
		cmd := redis.NewCmd(context.Background())
		cmd.SetVal(v)
		ints, err := cmd.Int64Slice()
		require.NoError(t, err)
		out[i] = ints
	}
	return out
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

// frozenClock is a client of a fresh server and a ts an hour past its
// clock: buckets stamped with it refill nothing between two calls.
func frozenClock(t *testing.T) (*redis.Client, string) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	t.Cleanup(func() { _ = c.Close() })
	tm, err := c.Time(context.Background()).Result()
	require.NoError(t, err)
	return c, fmt.Sprint(tm.Add(time.Hour).UnixMicro())
}

// check_tb.lua is check.lua's token bucket, inlined: from the same stored
// states (a plain bucket, a coordinator's share, a key of another type, a
// missing key), with ts in the future so that the microseconds between
// two calls cannot matter, both give the same replies and leave the same
// hashes and TTLs, call after call, taken or denied.
func TestCheckTBIsCheck(t *testing.T) {
	c, future := frozenClock(t)
	ctx := context.Background()
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
		got := checkTB(t, c, [][]string{b}, [][]any{args})[0]
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

// Many groups in one check_tb.lua call are those groups as calls, one
// after another: from the same stored states (ts in the future, so that
// the instants of the calls cannot matter), one call of six groups and six
// calls of one group (in either layout) give the same replies and leave
// the same hashes. Two
// groups on one key see each other's takes; a denied group writes
// nothing; a group whose TTL is out of range fails alone, writing
// nothing, and the groups after it still run.
func TestCheckTBGroupsAreCalls(t *testing.T) {
	c, future := frozenClock(t)
	ctx := context.Background()
	const year366 = 8784 * 3600 * 1000 // ms: a TTL beyond the scripts' bound
	type group struct {
		keys []string // suffixes
		args []any
	}
	groups := []group{
		{[]string{"a", "b"}, []any{"tb", 10, 1000, 0, 4, "tb", 5, 1000, 0, 1}},
		{[]string{"c"}, []any{"tb", 3, 1000, 0, 2}},
		{[]string{"a", "b"}, []any{"tb", 10, 1000, 0, 4, "tb", 5, 1000, 0, 1}}, // denied: a has 1 token left
		{[]string{"c"}, []any{"tb", 3, 1000, 0, 2}},                            // denied: c has 1 token left
		{[]string{"d", "c"}, []any{"tb", 10, 1000, 0, 1, "tb", 1, year366, 3162316, 1}},
		{[]string{"a"}, []any{"tb", 10, 1000, 0, 1}},
	}
	setup := func(prefix string) {
		for _, k := range []string{"a", "b", "c", "d"} {
			require.NoError(t, c.Del(ctx, prefix+k).Err())
			require.NoError(t, c.HSet(ctx, prefix+k, "tokens", "5", "ts", future).Err())
			require.NoError(t, c.PExpire(ctx, prefix+k, time.Hour).Err())
		}
	}
	keysOf := func(prefix string, g group) []string {
		var ks []string
		for _, k := range g.keys {
			ks = append(ks, prefix+k)
		}
		return ks
	}
	setup("rl:{one}:")
	setup("rl:{many}:")
	var keys [][]string
	var args [][]any
	for _, g := range groups {
		keys, args = append(keys, keysOf("rl:{one}:", g)), append(args, g.args)
	}
	one := checkTB(t, c, keys, args)
	for i, g := range groups {
		// Alternately in the batch layout and in check.lua's own (lone):
		// the same answer either way.
		var got any
		if i%2 == 0 {
			got = checkTB(t, c, [][]string{keysOf("rl:{many}:", g)}, [][]any{g.args})[0]
		} else if v, err := lua.CheckTB.Run(ctx, c, keysOf("rl:{many}:", g), g.args...).Int64Slice(); err != nil {
			got = err
		} else {
			got = v
		}
		if e, ok := got.(error); ok {
			require.Error(t, one[i].(error), "group %d", i)
			assert.Contains(t, e.Error(), "TTL", "group %d", i)
			assert.Equal(t, e.Error(), strings.ReplaceAll(one[i].(error).Error(), "{one}", "{many}"), "group %d", i)
			continue
		}
		assert.Equal(t, got, one[i], "group %d", i)
	}
	assert.Equal(t, []int64{1, 1, 0, 900000, 4, 0, 200000}, one[0], "a and b taken")
	assert.Equal(t, []int64{0, 1, 300000, 900000, 4, 0, 200000}, one[2], "a and b again: the first group left a 1 token")
	assert.Equal(t, []int64{0, 1, 333334, 666667}, one[3], "c denied: the second group left it 1 token")
	for _, k := range []string{"a", "b", "c", "d"} {
		a, err := c.HGetAll(ctx, "rl:{one}:"+k).Result()
		require.NoError(t, err)
		b, err := c.HGetAll(ctx, "rl:{many}:"+k).Result()
		require.NoError(t, err)
		assert.Equal(t, b, a, k)
	}
	d, err := c.HGet(ctx, "rl:{one}:d", "tokens").Result()
	require.NoError(t, err)
	assert.Equal(t, "5", d, "the failed group wrote nothing")
	a, err := c.HGet(ctx, "rl:{one}:a", "tokens").Result()
	require.NoError(t, err)
	assert.Equal(t, "0", a, "the group after the failed one ran")

	// A call whose layout is wrong fails as a whole, writing nothing.
	// (ARGV: groups, specs, 4 values per spec, then per group its key
	// count and a spec index and a cost per key.)
	for name, argv := range map[string][]any{
		"lone, short ARGV":       {"tb", 10, 1000, 0},
		"negative group count":   {-1, 1, "tb", 10, 1000, 0, 1, 1, 1},
		"zero groups":            {0, 0},
		"negative spec count":    {1, -1, 1, 1, 1},
		"more specs than ARGV":   {1, 5, "tb", 10, 1000, 0, 1, 1, 1},
		"a group of no keys":     {1, 1, "tb", 10, 1000, 0, 0},
		"more keys than said":    {1, 1, "tb", 10, 1000, 0, 2, 1, 1, 1, 1},
		"missing ARGV":           {2, 1, "tb", 10, 1000, 0, 1, 1, 1, 1},
		"fractional key count":   {1, 1, "tb", 10, 1000, 0, 1.5, 1, 1, 1, 1},
		"an ARGV more than said": {1, 1, "tb", 10, 1000, 0, 1, 1, 1, 7},
	} {
		keys := []string{"rl:{bad}:x", "rl:{bad}:y"}
		if name == "missing ARGV" || name == "fractional key count" {
			keys = keys[:2]
		} else {
			keys = keys[:1]
		}
		err := lua.CheckTB.Run(ctx, c, keys, argv...).Err()
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "allot:", name)
		n, err := c.Exists(ctx, keys...).Result()
		require.NoError(t, err)
		assert.Zero(t, n, name)
	}
}

// The batch layout carries each distinct spec once: groups that share a
// spec share its entry, and a bad spec, an index past the table or a
// group whose values are not five per key fails those groups alone,
// writing nothing of them, while the other groups run.
func TestCheckTBSpecTable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	defer c.Close()
	ctx := context.Background()
	good := []any{"tb", int64(10), int64(1000), int64(0)}
	with := func(spec []any, cost int64) []any { return append(append([]any{}, spec...), cost) }
	keys := [][]string{{"rl:{t}:a"}, {"rl:{t}:b", "rl:{t}:c"}, {"rl:{t}:d"}, {"rl:{t}:e"}, {"rl:{t}:f"}}
	args := [][]any{
		with(good, 1),
		append(with(good, 2), with([]any{"xx", int64(10), int64(1000), int64(0)}, 1)...), // an unknown algorithm
		with(good, 3),
		{"tb", int64(10)}, // short
		with([]any{"tb", int64(5), int64(1000), int64(0)}, 1),
	}
	k, a := luatest.CheckTBGroups(keys, args)
	assert.Equal(t, []string{"rl:{t}:a", "rl:{t}:b", "rl:{t}:c", "rl:{t}:d", "rl:{t}:e", "rl:{t}:f"}, k)
	assert.Equal(t, []any{5, 3,
		"tb", int64(10), int64(1000), int64(0),
		"xx", int64(10), int64(1000), int64(0),
		"tb", int64(5), int64(1000), int64(0),
		1, 1, int64(1),
		2, 1, int64(2), 2, int64(1),
		1, 1, int64(3),
		1, 0, 0,
		1, 3, int64(1)}, a, "three specs for six keys")
	got := checkTB(t, c, keys, args)
	assert.Equal(t, []int64{1, 9, 0, 100000}, got[0])
	assert.ErrorContains(t, asError(t, got[1]), "token buckets only, not xx for key rl:{t}:c")
	assert.Equal(t, []int64{1, 7, 0, 300000}, got[2])
	assert.ErrorContains(t, asError(t, got[3]), "no spec 0 for key rl:{t}:e")
	assert.Equal(t, []int64{1, 4, 0, 200000}, got[4])
	n, err := c.Exists(ctx, "rl:{t}:b", "rl:{t}:c", "rl:{t}:e").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the failed groups wrote nothing")

	// An index past the table, or not a whole number, fails its group.
	for _, x := range []any{2, 0, 1.5, "one"} {
		v, err := lua.CheckTB.Run(ctx, c, []string{"rl:{u}:a", "rl:{u}:b"}, 2, 1, "tb", 10, 1000, 0, 1, x, 1, 1, 1, 1).Result()
		require.NoError(t, err, "%v", x)
		vals, err := lua.CheckTBReplies(v, 2)
		require.NoError(t, err, "%v", x)
		assert.ErrorContains(t, asError(t, vals[0]), "no spec", "%v", x)
		assert.IsType(t, []any{}, vals[1], "%v: the other group ran", x)
		n, err := c.Exists(ctx, "rl:{u}:a").Result()
		require.NoError(t, err)
		assert.Zero(t, n, "%v", x)
	}
}

func asError(t *testing.T, v any) error {
	t.Helper()
	err, ok := v.(error)
	require.True(t, ok, "%v is not an error", v)
	return err
}
