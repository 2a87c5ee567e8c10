package region_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/luatest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/lua"
	"github.com/allot-dev/allot/region"
)

// snapshot is everything a script could change on a key.
type snapshot struct {
	Type   string
	Fields map[string]string
	Zset   []redis.Z
	PTTL   time.Duration
}

func snap(t *testing.T, c redis.Cmdable, key string) snapshot {
	t.Helper()
	ctx := context.Background()
	var s snapshot
	var err error
	s.Type, err = c.Type(ctx, key).Result()
	require.NoError(t, err)
	switch s.Type {
	case "hash":
		s.Fields, err = c.HGetAll(ctx, key).Result()
	case "zset":
		s.Zset, err = c.ZRangeWithScores(ctx, key, 0, -1).Result()
	}
	require.NoError(t, err)
	s.PTTL, err = c.PTTL(ctx, key).Result()
	require.NoError(t, err)
	return s
}

// Issue 13 point 7: numbers validation would reject, sent to the scripts
// directly. Each call must fail before its first write: the key is left
// exactly as it was (no tokens debited, the same TTL, no key created),
// and the error says why. Before the fix the first case debited a token
// and then failed in PEXPIRE ("value is not an integer or out of range"),
// leaving a key that never expires.
func TestScriptsFailBeforeWriting(t *testing.T) {
	s := single(t)
	c := s.Client()
	ctx := context.Background()
	const year366 = 8784 * 3600 * 1000 // ms
	now := redisNow(t, c)

	// A fresh key and one that exists (with a TTL, which a failed call
	// must neither drop nor extend); every key of a call shares the tag.
	setup := func(key string) {
		require.NoError(t, c.Del(ctx, key+":new", key+":old", key+":ok").Err())
		require.NoError(t, c.HSet(ctx, key+":old", "tokens", "5", "ts", fmt.Sprint(now), "tat", fmt.Sprint(now),
			"swc_win", "0", "swc_curr", "1", "swc_prev", "0", "fw_win", "0", "fw_n", "1", "granted", "3", "wanted", "4").Err())
		require.NoError(t, c.PExpire(ctx, key+":old", time.Hour).Err())
	}
	for _, tc := range []struct {
		name   string
		script *redis.Script
		args   func(which string) []any // ARGV for one key
		// ok is ARGV for a valid key listed first: its write must not
		// happen either.
		ok   []any
		want string
	}{
		{"check tb (the issue's numbers)", lua.Check, func(string) []any { return []any{"tb", 1, year366, 3162316, 1} }, []any{"tb", 10, 1000, 0, 1}, "TTL"},
		{"check_tb", lua.CheckTB, func(string) []any { return []any{"tb", 1, year366, 3162316, 1} }, []any{"tb", 10, 1000, 0, 1}, "TTL"},
		{"check gcra", lua.Check, func(string) []any { return []any{"gcra", 1, 1_000_000_000_000, 1_000_000, 1} }, []any{"fw", 10, 1000, 0, 1}, "TTL"},
		{"check swl", lua.Check, func(string) []any { return []any{"swl", 1, 1e15, 0, 1} }, []any{"tb", 10, 1000, 0, 1}, "TTL"},
		{"check swc", lua.Check, func(string) []any { return []any{"swc", 1, 9e15, 0, 1} }, []any{"tb", 10, 1000, 0, 1}, "TTL"},
		{"check fw", lua.Check, func(string) []any { return []any{"fw", 1, 9e15, 0, 1} }, []any{"tb", 10, 1000, 0, 1}, "TTL"},
		{"check above 2^53", lua.Check, func(string) []any { return []any{"fw", 1, "100000000000000000000", 0, 1} }, []any{"tb", 10, 1000, 0, 1}, "whole numbers"},
		{"refund tb", lua.Refund, func(string) []any { return []any{"tb", 1, year366, 3162316, 1} }, []any{"tb", 10, 1000, 0, 1}, "TTL"},
		{"refund gcra", lua.Refund, func(string) []any { return []any{"gcra", 1, 1_000_000_000_000, 1_000_000, 1} }, []any{"fw", 10, 1000, 0, 1}, "TTL"},
		{"lease", lua.Lease, func(string) []any { return []any{1, year366, 3162316, 0, 1} }, []any{10, 1000, 0, 0, 1}, "TTL"},
		{"return", lua.Return, func(string) []any { return []any{1, year366, 3162316, 1, 0} }, []any{10, 1000, 0, 1, 0}, "TTL"},
	} {
		whichs := []string{"new", "old"}
		if tc.script == lua.Refund || tc.script == lua.Return {
			whichs = whichs[1:] // nothing to credit on a missing key: no TTL to compute
		}
		for _, which := range whichs {
			msg := tc.name + " on the " + which + " key"
			tag := "rl:{bad}"
			setup(tag)
			// The ok key exists so that refund and return would write it.
			require.NoError(t, c.HSet(ctx, tag+":ok", "tokens", "1", "ts", fmt.Sprint(now), "fw_win", "0", "fw_n", "1").Err())
			keys := []string{tag + ":ok", tag + ":" + which}
			before := []snapshot{snap(t, c, keys[0]), snap(t, c, keys[1])}
			args := append(append([]any{}, tc.ok...), tc.args(which)...)
			var err error
			if tc.script == lua.CheckTB {
				// One group of the two keys: the group's own error.
				k, a := luatest.CheckTBGroups([][]string{keys}, [][]any{args})
				var v any
				v, err = tc.script.Run(ctx, c, k, a...).Result()
				require.NoError(t, err, msg)
				vals, verr := lua.CheckTBReplies(v, 1)
				require.NoError(t, verr, msg)
				err, _ = vals[0].(error)
			} else {
				err = tc.script.Run(ctx, c, keys, args...).Err()
			}
			require.Error(t, err, msg)
			assert.Contains(t, err.Error(), "allot:", msg)
			assert.Contains(t, err.Error(), tc.want, msg)
			for i, k := range keys {
				after := snap(t, c, k)
				assert.Equal(t, before[i].Type, after.Type, msg+": "+k)
				assert.Equal(t, before[i].Fields, after.Fields, msg+": "+k)
				assert.Equal(t, before[i].Zset, after.Zset, msg+": "+k)
				// The TTL only ran down (by the test's own time).
				assert.LessOrEqual(t, after.PTTL, before[i].PTTL, msg+": "+k)
				assert.Greater(t, after.PTTL, before[i].PTTL-time.Second, msg+": "+k)
			}
		}
	}
}

// edgeSpecs are the largest specs algorithm.Spec.Validate accepts on each
// bound (algorithm/bounds.go), with the spec one step past each.
var edgeSpecs = []struct {
	name      string
	max, past algorithm.Spec
}{
	// The limit and period: burst 3162316 needs 3.2 million years.
	{"token bucket, 1 per 366 days", tb(1, 8784*time.Hour, 71), tb(1, 8784*time.Hour, 72)},
	// burst·period/limit = 2^20 · 2^31 ms / 1000 = 2^51 µs exactly.
	{"token bucket, exactly 2^51 µs", tb(1000, (1<<31)*time.Millisecond, 1<<20), tb(1000, (1<<31)*time.Millisecond, 1<<20+1)},
	{"token bucket, 2^52 tokens", tb(1<<52, time.Millisecond, 0), tb(1<<52+1, time.Millisecond, 0)},
	// T = ⌈131072000/125⌉ = 2^20 µs, τ = 2^31·T = 2^51 µs.
	{"gcra, τ = 2^51 µs", spec(algorithm.GCRA, 125, 131072*time.Millisecond, 1<<31), spec(algorithm.GCRA, 125, 131072*time.Millisecond, 1<<31+1)},
	{"sliding window counter, 2 periods = 2^51 µs", spec(algorithm.SlidingWindowCounter, 1<<40, 1125899906842*time.Millisecond, 0),
		spec(algorithm.SlidingWindowCounter, 1<<40, 1125899906843*time.Millisecond, 0)},
	{"fixed window, period = 2^51 µs", spec(algorithm.FixedWindow, 1<<52, 2251799813685*time.Millisecond, 0),
		spec(algorithm.FixedWindow, 1<<52, 2251799813686*time.Millisecond, 0)},
	{"sliding window log, period = 2^51 µs", spec(algorithm.SlidingWindowLog, algorithm.MaxLogLimit, 2251799813685*time.Millisecond, 0),
		spec(algorithm.SlidingWindowLog, algorithm.MaxLogLimit, 2251799813686*time.Millisecond, 0)},
}

// The largest spec on each bound works end to end on Redis: take, refund,
// and for a token bucket lease and return, with the TTL the model says
// and answers the model could give. One step past it is refused by
// validation, with a message that names the bound, before Redis is asked.
func TestSpecBoundsOnRedis(t *testing.T) {
	s := single(t)
	c := s.Client()
	ctx := context.Background()
	for i, tc := range edgeSpecs {
		require.NoError(t, tc.max.Validate(), tc.name)
		key := fmt.Sprintf("rl:{edge}:%d", i)
		before := redisNow(t, c)
		res := take1(t, s, algorithm.Group{{Key: key, Spec: tc.max, Cost: 1}})
		after := redisNow(t, c)
		require.True(t, res.Allowed, tc.name)
		want := algorithm.Decide(tc.max, algorithm.State{}, before, 1)
		it := res.Items[0]
		assert.Equal(t, want.Taken.Remaining, it.Remaining, tc.name)
		assert.GreaterOrEqual(t, it.ResetAfter, time.Duration(0), tc.name)
		assert.InDelta(t, want.Taken.ResetAfter, it.ResetAfter, float64(time.Duration(after-before+2)*time.Microsecond), tc.name)
		pttl, err := c.PTTL(ctx, key).Result()
		require.NoError(t, err)
		assert.LessOrEqual(t, pttl, tc.max.TTL(), tc.name)
		assert.Greater(t, pttl, want.TTL-time.Duration(redisNow(t, c)-before)*time.Microsecond-time.Millisecond, tc.name)
		require.NoError(t, s.Refund(ctx, []algorithm.Group{{{Key: key, Spec: tc.max, Cost: 1}}}), tc.name)

		if tc.max.Algorithm == algorithm.TokenBucket {
			lkey := key + ":lease"
			lr := lease1(t, s, lease.Group{{Key: lkey, Spec: tc.max, Need: 1, Want: 1}})
			assert.True(t, lr.Granted, tc.name)
			assert.Equal(t, tc.max.Capacity(), lr.Items[0].Burst, tc.name)
			_, err := s.Return(ctx, []lease.ReturnItem{{Key: lkey, Spec: tc.max, Unspent: 1, Age: time.Millisecond}})
			require.NoError(t, err, tc.name)
			pttl, err := c.PTTL(ctx, lkey).Result()
			require.NoError(t, err)
			assert.Greater(t, pttl, time.Duration(0), tc.name)
			assert.LessOrEqual(t, pttl, tc.max.TTL(), tc.name)
		}

		err = tc.past.Validate()
		require.Error(t, err, tc.name)
		assert.Contains(t, err.Error(), "2^5", tc.name) // 2^51 µs or 2^52 tokens
		pkey := fmt.Sprintf("rl:{edge}:past%d", i)
		_, err = s.Take(ctx, []algorithm.Group{{{Key: pkey, Spec: tc.past, Cost: 1}}})
		require.Error(t, err, tc.name)
		n, err := c.Exists(ctx, pkey).Result()
		require.NoError(t, err)
		assert.Zero(t, n, tc.name+": refused before Redis")
	}
}

// FuzzSpecOnRedis: whatever algorithm.Spec.Validate accepts must run on a
// real Redis without error, through every script that takes it, and leave
// a key that expires. The seed corpus (the edges above and ordinary
// specs) runs in a plain go test; go test -fuzz FuzzSpecOnRedis ./region
// explores further.
func FuzzSpecOnRedis(f *testing.F) {
	for _, tc := range edgeSpecs {
		for _, sp := range []algorithm.Spec{tc.max, tc.past} {
			f.Add(uint8(sp.Algorithm), sp.Limit, sp.Period.Milliseconds(), sp.Burst, int64(1))
		}
	}
	f.Add(uint8(algorithm.TokenBucket), int64(1), int64(8784*3600*1000), int64(3162316), int64(1))
	f.Add(uint8(algorithm.GCRA), int64(3), int64(1000), int64(4), int64(4))
	// A TTL of exactly 10^8 ms, which Redis 7.2+ would format as 1e+08
	// had it been passed as a Lua number.
	f.Add(uint8(algorithm.TokenBucket), int64(1), int64(99999000), int64(1), int64(0))
	// Costs (and lease wants) beyond 2^53: denied or granted, never an
	// error (HINCRBY used to get '4.6116860184274e+18' after writing).
	f.Add(uint8(algorithm.TokenBucket), int64(10), int64(1000), int64(0), int64(1<<62))
	f.Add(uint8(algorithm.SlidingWindowLog), int64(10), int64(1000), int64(0), int64(1<<62))
	s, err := region.Open(context.Background(), []string{redistest.Server(f).Addr}, region.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Close() })
	c := s.Client()
	f.Fuzz(func(t *testing.T, algo uint8, limit, periodMS, burst, cost int64) {
		if periodMS <= 0 || periodMS > int64(time.Duration(1<<63-1)/time.Millisecond) {
			return // not a time.Duration of whole ms
		}
		sp := algorithm.Spec{Algorithm: algorithm.Algorithm(algo), Limit: limit, Period: time.Duration(periodMS) * time.Millisecond, Burst: burst}
		if sp.Validate() != nil || cost < 0 {
			return
		}
		ctx := context.Background()
		key := "rl:{fuzz}:k"
		require.NoError(t, c.Del(ctx, key, key+":l").Err())
		g := []algorithm.Group{{{Key: key, Spec: sp, Cost: cost}}}
		res, err := s.Take(ctx, g)
		require.NoError(t, err, "%+v cost %d", sp, cost)
		for _, it := range res[0].Items {
			assert.True(t, it.RetryAfter >= 0 || it.RetryAfter == algorithm.Never, "%+v: retry %v", sp, it.RetryAfter)
			assert.GreaterOrEqual(t, it.ResetAfter, time.Duration(0), "%+v", sp)
			assert.LessOrEqual(t, it.ResetAfter, algorithm.MaxHorizon+time.Millisecond, "%+v", sp) // float rounding
		}
		if res[0].Allowed {
			pttl, err := c.PTTL(ctx, key).Result()
			require.NoError(t, err)
			if pttl != -2 { // a take of 0 from a log adds no entry, so no key
				assert.Greater(t, pttl, time.Duration(0), "%+v: the key expires", sp)
			}
			assert.LessOrEqual(t, pttl, sp.TTL(), "%+v", sp)
			require.NoError(t, s.Refund(ctx, g), "%+v", sp)
		}
		if sp.Algorithm.Leasable() {
			lr, err := s.Lease(ctx, []lease.Group{{{Key: key + ":l", Spec: sp, Need: 0, Want: max(cost, 1)}}})
			require.NoError(t, err)
			require.NoError(t, lr[0].Err, "%+v", sp)
			_, err = s.Return(ctx, []lease.ReturnItem{{Key: key + ":l", Spec: sp, Unspent: 1, Age: time.Millisecond}})
			require.NoError(t, err, "%+v", sp)
		}
	})
}
