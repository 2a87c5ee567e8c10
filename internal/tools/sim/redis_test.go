package sim

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/testenv/luatest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lua"
)

// pttl is PTTL key at now (µs since the start).
func (e *redisEm) pttl(ks keyspace, key string, now int64) int64 {
	e.ks, e.nowUs = ks, timeBase+now
	e.nowMs = e.nowUs / 1000
	return e.command([]string{"PTTL", key}, make([]num, 2)).(int64)
}

// client reads a real Redis's reply as the emulator gives it: errors as
// replyError, everything else as go-redis reads it.
func realReply(v any, err error) any {
	var re redis.Error
	switch {
	case errors.Is(err, redis.Nil):
		return nil
	case errors.As(err, &re):
		return replyError(re.Error())
	case err != nil:
		return err
	}
	if vs, ok := v.([]any); ok {
		out := make([]any, len(vs))
		for i, x := range vs {
			out[i] = realReply(x, nil)
			if e, ok := x.(redis.Error); ok {
				out[i] = replyError(e.Error())
			}
		}
		return out
	}
	return v
}

// emuReply is the emulator's reply as go-redis would read it: a status
// is a plain string.
func emuReply(v any) any {
	switch x := v.(type) {
	case replyStatus:
		return string(x)
	case []any:
		out := make([]any, len(x))
		for i, el := range x {
			out[i] = emuReply(el)
		}
		return out
	}
	return v
}

// redis70 reports whether the server formats numbers passed to commands
// with %.17g (7.0; 7.2 on prints the shortest round-trip form).
func redis70(t *testing.T, c *redis.Client) bool {
	info, err := c.Info(context.Background(), "server").Result()
	require.NoError(t, err)
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			t.Logf("redis %s", v)
			return strings.HasPrefix(v, "7.0.") || strings.HasPrefix(v, "6.")
		}
	}
	return false
}

// The emulated commands and conversions against a real Redis, on scripts
// that do not read the clock: what HSET stores of Lua numbers (%.17g),
// Lua 5.1's tostring (%.14g), string.format and tonumber, the reply
// conversions (truncation, true/false, arrays up to the first nil, error
// and status replies), PEXPIRE, PTTL, DEL and redis.pcall's error.
func TestEmulatedCommandsMatchRedis(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	defer c.Close()
	exact := redis70(t, c)
	ctx := context.Background()
	em, err := newRedisEm(Sources())
	require.NoError(t, err)
	ks := testStore(t, 3, false, 0)
	keys := []string{keyFn(subject(1)), keyFn(subject(2)), "allot:test:{sim}"}
	for i, text := range []string{
		// What a hash keeps of numbers, and Lua 5.1's formatting.
		`local out = {}
		for _, v in ipairs({1/3, 100/3, 1e15, 2^53, 2^53 + 2, 1e17, 1e21, 0.1, 7, -0.5, 123456.789, 1e-7, 5e-324, 1800000000123456}) do
		  redis.call('HSET', KEYS[1], 'tokens', v)
		  out[#out + 1] = redis.call('HGET', KEYS[1], 'tokens')
		  out[#out + 1] = tostring(v)
		  out[#out + 1] = string.format('%.0f|%06d|%.17g|%s|%5.1f', v, v, v, v, v)
		  out[#out + 1] = tostring(tonumber(redis.call('HGET', KEYS[1], 'tokens')) == v)
		end
		for _, s in ipairs({'1e+15', ' 12 ', '0x10', '12abc', '', '1e400', '-0', '.5', '5.'}) do
		  out[#out + 1] = tostring(tonumber(s))
		end
		return out`,
		// Reply conversions.
		`return {1, 2.7, -2.7, true, false, 'x', 2^53, -1e300 / 1e290, {1, {2}}, 3, nil, 4}`,
		`return 3.99`,
		`return -3.99`,
		`return false`,
		`return true`,
		`return {1, 2, nil, 4}`,
		`return redis.status_reply('FINE')`,
		`return redis.error_reply('ERR allot: nope')`,
		`return {1, redis.error_reply('ERR inner'), 3}`,
		// Keys, fields and TTLs.
		`redis.call('DEL', KEYS[1], KEYS[2])
		local out = {redis.call('HSET', KEYS[1], 'tokens', 1.5, 'ts', '1800000000000000'),
		  redis.call('HSET', KEYS[1], 'tokens', 2, 'rate', 3),
		  redis.call('PTTL', KEYS[1]), redis.call('PTTL', KEYS[2]),
		  redis.call('PEXPIRE', KEYS[2], 100), redis.call('PEXPIRE', KEYS[1], '250000')}
		local p = redis.call('PTTL', KEYS[1])
		out[#out + 1] = tostring(p >= 249999 and p <= 250000)
		local h = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'rate', 'burst', 'granted')
		out[#out + 1] = tostring(h[1]) .. ' ' .. tostring(h[2]) .. ' ' .. tostring(h[3]) .. ' ' .. tostring(h[4]) .. ' ' .. tostring(h[5])
		out[#out + 1] = redis.pcall('PEXPIRE', KEYS[1], 'soon').err
		out[#out + 1] = tostring(redis.call('HGET', KEYS[2], 'tokens'))
		out[#out + 1] = redis.call('DEL', KEYS[1], KEYS[2])
		out[#out + 1] = redis.call('PTTL', KEYS[1])
		return out`,
		// String keys (the coordinators' lock): GET, SET's options.
		`redis.call('DEL', KEYS[1], KEYS[3])
		local out = {tostring(redis.call('GET', KEYS[3])),
		  redis.call('SET', KEYS[3], 'a', 'NX', 'PX', 5000),
		  tostring(redis.call('SET', KEYS[3], 'b', 'NX', 'PX', '5000')),
		  redis.call('GET', KEYS[3])}
		local p = redis.call('PTTL', KEYS[3])
		out[#out + 1] = tostring(p > 4900 and p <= 5000)
		out[#out + 1] = redis.call('PEXPIRE', KEYS[3], 100000)
		p = redis.call('PTTL', KEYS[3])
		out[#out + 1] = tostring(p > 99000 and p <= 100000)
		redis.call('HSET', KEYS[1], 'tokens', 1)
		out[#out + 1] = redis.pcall('GET', KEYS[1]).err
		out[#out + 1] = redis.call('SET', KEYS[3], 'c', 'XX')
		out[#out + 1] = redis.call('GET', KEYS[3])
		out[#out + 1] = redis.call('PTTL', KEYS[3])
		out[#out + 1] = redis.pcall('SET', KEYS[3], 'd', 'PX', 0).err
		out[#out + 1] = redis.pcall('SET', KEYS[3], 'd', 'NX', 'XX').err
		out[#out + 1] = redis.call('DEL', KEYS[3], KEYS[1])
		out[#out + 1] = redis.call('PTTL', KEYS[3])
		out[#out + 1] = tostring(redis.call('SET', KEYS[3], 'e', 'XX'))
		out[#out + 1] = redis.call('PEXPIRE', KEYS[3], 100)
		return out`,
	} {
		want := realReply(c.Eval(ctx, text, keys).Result())
		p, err := compile("test", text)
		require.NoError(t, err)
		got := emuReply(em.run(ks, p, 0, keys, nil))
		if !exact && i == 0 {
			t.Log("Redis past 7.0 formats command arguments differently: HSET of floats not compared")
			continue
		}
		assert.Equal(t, want, got, "script %d:\n%s", i, text)
	}
}

// The coordinators' lock scripts, as coord.RedisLock sends them, on a
// real Redis and on the emulator: the same replies, values and TTLs
// (a TTL long enough that no call's instant matters).
func TestLockScriptsMatchRedis(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	defer c.Close()
	ctx := context.Background()
	s := testStore(t, 1, false, 0)
	key, ttl := coord.LockKey("sim-test"), time.Minute
	require.NoError(t, c.Del(ctx, key).Err())
	for i, st := range []struct {
		sc script
		id string
	}{
		{scriptLockHold, "a"}, {scriptLockHold, "b"}, {scriptLockHold, "a"}, {scriptLockRelease, "b"},
		{scriptLockRelease, "a"}, {scriptLockRelease, "a"}, {scriptLockHold, "b"}, {scriptLockHold, "a"},
	} {
		real, args := lua.LockHold, coord.LockHoldArgs(st.id, ttl)
		if st.sc == scriptLockRelease {
			real, args = lua.LockRelease, coord.LockReleaseArgs(st.id)
		}
		want := realReply(real.Run(ctx, c, []string{key}, args...).Result())
		got := emuReply(s.eval(st.sc, 0, []string{key}, redisArgs(args)))
		assert.Equal(t, want, got, "step %d: %s by %s", i, scriptNames[st.sc], st.id)
		v, err := c.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		require.NoError(t, err)
		assert.Equal(t, v, emuReply(orEmpty(s.em.get1(s, key))), "step %d: the lock's holder", i)
		real2, err := c.PTTL(ctx, key).Result()
		require.NoError(t, err)
		emu := s.em.pttl(s, key, 0)
		if real2 < 0 {
			assert.Equal(t, real2.Nanoseconds(), emu, "step %d: no TTL", i)
		} else {
			assert.InDelta(t, float64(real2.Milliseconds()), float64(emu), 100, "step %d: PTTL", i)
		}
	}
}

// get1 is GET key at the start of the simulation.
func (e *redisEm) get1(ks keyspace, key string) any {
	e.ks, e.nowUs = ks, timeBase
	e.nowMs = e.nowUs / 1000
	return e.command([]string{"GET", key}, make([]num, 2))
}

func orEmpty(v any) any {
	if v == nil {
		return ""
	}
	return v
}

// The scripts the simulator runs, on a real Redis and on the emulator at
// the same instant: each step runs on Redis first, the instant its TIME
// read is learnt from the ts it stored, and the emulator runs the same
// call then; replies, hashes and TTLs must agree (the stored numbers
// string for string). A step that stores no ts (a denial) runs on the
// emulator at the instants just before and after it, and must agree
// with one.
func TestScriptsMatchRedis(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	defer c.Close()
	exact := redis70(t, c)
	ctx := context.Background()
	s := testStore(t, 3, false, 0)
	// Expiries count ms from baseMs: real time is before the simulation's.
	s.em.baseMs = redisNow(t, c)/1000 - 1000
	k1, k2 := keyFn(subject(1)), keyFn(subject(2))
	share := func(rate, burst, oldRate, oldBurst float64) []string {
		return []string{ftoa(rate), ftoa(burst), ftoa(oldRate), ftoa(oldBurst), "60000"}
	}
	tbKeys, tbArgs := luatest.CheckTBGroups([][]string{{k1}, {k2}, {k1, k2}}, [][]any{{"tb", 100, 1000, 0, 1}, {"tb", 7, 3000, 20, 3}, {"tb", 100, 1000, 0, 2, "tb", 7, 3000, 20, 1}})
	steps := []struct {
		sc    script
		keys  []string
		argv  []string
		sleep time.Duration
	}{
		{scriptLease, []string{k1}, []string{"100", "1000", "100", "0", "80"}, 0},
		{scriptCheckTB, []string{k1}, []string{"tb", "100", "1000", "100", "1"}, 7 * time.Millisecond},
		{scriptLease, []string{k1, k2}, []string{"100", "1000", "0", "5", "20", "7", "3000", "20", "1", "4"}, 13 * time.Millisecond},
		{scriptLease, []string{k1}, []string{"100", "1000", "100", "500", "500"}, 0},
		{scriptShare, []string{k1}, share(100.0/3, 100.0/3, 100, 100), 3 * time.Millisecond},
		{scriptCheckTB, tbKeys, stringArgs(tbArgs), 11 * time.Millisecond},
		{scriptReturn, []string{k1}, []string{"100", "1000", "100", "10", "5000"}, 2 * time.Millisecond},
		{scriptLease, []string{k1}, []string{"100", "1000", "100", "0", "1000"}, 9 * time.Millisecond},
		{scriptReturn, []string{k2}, []string{"7", "3000", "20", "3", "2500"}, 1 * time.Millisecond},
		{scriptShare, []string{k2}, share(7.0/3*0.6, 12, 7.0/3, 20), 1 * time.Millisecond},
		{scriptCheckTB, []string{k2}, []string{"tb", "7", "3000", "20", "1"}, 5 * time.Millisecond},
	}
	scripts := []*redis.Script{lua.Lease, lua.Return, redis.NewScript(lua.Source(lua.Share)), lua.CheckTB}
	timed := 0
	for i, st := range steps {
		time.Sleep(st.sleep)
		before := redisNow(t, c)
		args := make([]any, len(st.argv))
		for j, a := range st.argv {
			args[j] = a
		}
		want := realReply(scripts[st.sc].Run(ctx, c, st.keys, args...).Result())
		after := redisNow(t, c)
		// The instant of Redis's TIME: the ts the call stored, if it
		// stored one; else before or after it (whichever agrees).
		var got any
		ts, err := c.HGet(ctx, st.keys[0], "ts").Int64()
		require.NoError(t, err, "step %d", i)
		if ts >= before && ts <= after {
			timed++
			got = emuReply(s.eval(st.sc, ts-timeBase, st.keys, st.argv))
		} else {
			saved := slices.Clone(s.h)
			got = emuReply(s.eval(st.sc, before-timeBase, st.keys, st.argv))
			if !reflect.DeepEqual(got, want) {
				copy(s.h, saved)
				got = emuReply(s.eval(st.sc, after-timeBase, st.keys, st.argv))
			}
		}
		assert.Equal(t, want, got, "step %d: %s %v %v", i, scriptNames[st.sc], st.keys, st.argv)
		for _, k := range []string{k1, k2} {
			h, err := c.HGetAll(ctx, k).Result()
			require.NoError(t, err)
			mine := map[string]string{}
			if hh := s.h[keyIndex(k)]; hh.has != 0 {
				for f := range nFields {
					if hh.has&(1<<f) != 0 {
						mine[fieldNames[f]] = numString(hh.v[f])
					}
				}
			}
			if !exact {
				h, mine = parsed(h), parsed(mine)
			}
			assert.Equal(t, h, mine, "step %d: hash %s", i, k)
			real, err := c.Do(ctx, "PTTL", k).Int64()
			require.NoError(t, err)
			emu := s.em.pttl(s, k, after-timeBase)
			// The real one is read a little later than after.
			assert.InDelta(t, float64(emu), float64(real), 50, "step %d: PTTL of %s", i, k)
		}
	}
	// Not vacuous: most steps ran at Redis's very instant.
	assert.GreaterOrEqual(t, timed, len(steps)/2, "steps run at the instant Redis read")
}

// ftoa is a float argument as coord.ShareArgs writes it.
func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', 17, 64) }

func stringArgs(as []any) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = fmt.Sprint(a)
	}
	return out
}

func parsed(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		f, _ := strconv.ParseFloat(v, 64)
		out[k] = strconv.FormatFloat(f, 'g', -1, 64)
	}
	return out
}

// redisNow is the server's TIME in µs.
func redisNow(t *testing.T, c *redis.Client) int64 {
	tm, err := c.Time(context.Background()).Result()
	require.NoError(t, err)
	return tm.UnixMicro()
}
