package region_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
)

func spec(a algorithm.Algorithm, limit int64, period time.Duration, burst int64) algorithm.Spec {
	return algorithm.Spec{Algorithm: a, Limit: limit, Period: period, Burst: burst}
}

const usPerS = int64(time.Second / time.Microsecond)

// loadState reads a key as check.lua stores it for algorithm a.
func loadState(t *testing.T, c redis.Cmdable, key string, a algorithm.Algorithm) algorithm.State {
	t.Helper()
	ctx := context.Background()
	ints := func(fields ...string) ([]int64, bool) {
		v, err := c.HMGet(ctx, key, fields...).Result()
		require.NoError(t, err)
		out := make([]int64, len(v))
		for i, x := range v {
			if x == nil {
				return nil, false
			}
			n, err := strconv.ParseInt(x.(string), 10, 64)
			require.NoError(t, err, "%s %s = %v", key, fields[i], x)
			out[i] = n
		}
		return out, true
	}
	switch a {
	case algorithm.TokenBucket:
		return algorithm.State{Algorithm: a, Bucket: bucket(t, c, key)}
	case algorithm.GCRA:
		v, ok := ints("tat")
		if !ok {
			return algorithm.State{Algorithm: a}
		}
		return algorithm.State{Algorithm: a, GCRA: algorithm.GCRAState{TAT: v[0], Valid: true}}
	case algorithm.SlidingWindowLog:
		zs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
		require.NoError(t, err)
		var ts []int64
		for i, z := range zs {
			ts = append(ts, int64(z.Score))
			if i > 0 {
				require.Greater(t, z.Member.(string), zs[i-1].Member.(string), "members are ordered like scores")
			}
		}
		return algorithm.State{Algorithm: a, Log: algorithm.LogState{TS: ts}}
	case algorithm.SlidingWindowCounter:
		v, ok := ints("swc_win", "swc_curr", "swc_prev")
		if !ok {
			return algorithm.State{Algorithm: a}
		}
		return algorithm.State{Algorithm: a, Counter: algorithm.CounterState{Win: v[0], Curr: v[1], Prev: v[2], Valid: true}}
	case algorithm.FixedWindow:
		v, ok := ints("fw_win", "fw_n")
		if !ok {
			return algorithm.State{Algorithm: a}
		}
		return algorithm.State{Algorithm: a, Window: algorithm.WindowState{Win: v[0], Count: v[1], Valid: true}}
	}
	t.Fatalf("no loader for %v", a)
	return algorithm.State{}
}

// storeState writes st as check.lua would have.
func storeState(t *testing.T, c redis.Cmdable, key string, st algorithm.State) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, c.Del(ctx, key).Err())
	var err error
	switch st.Algorithm {
	case algorithm.TokenBucket:
		err = c.HSet(ctx, key, "tokens", st.Bucket.Tokens, "ts", st.Bucket.TS).Err()
	case algorithm.GCRA:
		err = c.HSet(ctx, key, "tat", st.GCRA.TAT).Err()
	case algorithm.SlidingWindowLog:
		zs := make([]redis.Z, len(st.Log.TS))
		for i, ts := range st.Log.TS {
			zs[i] = redis.Z{Score: float64(ts), Member: fmt.Sprintf("%015d", i)}
		}
		err = c.ZAdd(ctx, key, zs...).Err()
	case algorithm.SlidingWindowCounter:
		err = c.HSet(ctx, key, "swc_win", st.Counter.Win, "swc_curr", st.Counter.Curr, "swc_prev", st.Counter.Prev).Err()
	case algorithm.FixedWindow:
		err = c.HSet(ctx, key, "fw_win", st.Window.Win, "fw_n", st.Window.Count).Err()
	}
	require.NoError(t, err)
}

// model is package algorithm's answer for a group: the twin of check.lua.
func model(g algorithm.Group, states []algorithm.State, now int64) (algorithm.Result, []algorithm.State, []algorithm.Decision) {
	res := algorithm.Result{Allowed: true, Items: make([]algorithm.ItemResult, len(g))}
	ds := make([]algorithm.Decision, len(g))
	for i, it := range g {
		ds[i] = algorithm.Decide(it.Spec, states[i], now, it.Cost)
		res.Allowed = res.Allowed && ds[i].OK
	}
	next := append([]algorithm.State(nil), states...)
	for i := range g {
		res.Items[i] = ds[i].Result(res.Allowed)
		if res.Allowed {
			next[i] = ds[i].Next
		}
	}
	return res, next, ds
}

// TestParityMixedFrozen runs one subject with all five algorithms through
// check.lua and through algorithm.Decide, from stored states chosen so
// that the microseconds between the model's clock and the script's cannot
// matter:
//
//   - token bucket: ts in the future, so no refill on either side;
//   - gcra: TAT hours ahead with T = 1h, so every new TAT is TAT + c·T
//     and ⌊remaining⌋ cannot move by a few ms;
//   - log: one entry in the future, so every new entry is stamped with it,
//     and the rest well inside a 2h window;
//   - counter and fixed window: a stored window after now's, which stays
//     current at its start (e = 0).
//
// So allowed, remaining and every stored state must be identical, the
// counter's waits too; the other waits may differ by the time a call took.
// Mixed costs make the group deny by different algorithms in turn: every
// denial must leave every key as it was.
func TestParityMixedFrozen(t *testing.T) {
	s := single(t)
	c := s.Client()
	now := redisNow(t, c)
	day := int64(24 * time.Hour / time.Microsecond)
	future := now + day
	hour := time.Hour.Microseconds()
	items := []algorithm.Item{
		{Key: "rl:{mix}:tb", Spec: tb(7, 3*time.Second, 10)},
		{Key: "rl:{mix}:gcra", Spec: spec(algorithm.GCRA, 24, 24*time.Hour, 6)}, // T = 1h
		{Key: "rl:{mix}:log", Spec: spec(algorithm.SlidingWindowLog, 9, 2*time.Hour, 0)},
		{Key: "rl:{mix}:swc", Spec: spec(algorithm.SlidingWindowCounter, 50, time.Hour, 0)},
		{Key: "rl:{mix}:fw", Spec: spec(algorithm.FixedWindow, 12, 24*time.Hour, 0)},
	}
	states := []algorithm.State{
		{Algorithm: algorithm.TokenBucket, Bucket: algorithm.BucketState{Tokens: 7.3, TS: future, Valid: true}},
		{Algorithm: algorithm.GCRA, GCRA: algorithm.GCRAState{TAT: now + 2*hour + hour/2, Valid: true}},
		{Algorithm: algorithm.SlidingWindowLog, Log: algorithm.LogState{TS: []int64{now - 3*hour, now - hour, now - hour/2, future}}},
		{Algorithm: algorithm.SlidingWindowCounter, Counter: algorithm.CounterState{Win: now/hour + 2, Curr: 11, Prev: 17, Valid: true}},
		{Algorithm: algorithm.FixedWindow, Window: algorithm.WindowState{Win: now/day + 1, Count: 4, Valid: true}},
	}
	for i, it := range items {
		storeState(t, c, it.Key, states[i])
	}
	// The log's entry 3h old is outside the window: the first commit
	// trims it, the model's Next leaves it out.
	var slack int64
	for step, costs := range [][5]int64{
		{1, 1, 1, 1, 1}, {0, 2, 0, 5, 2}, {3, 1, 2, 0, 0}, {1, 1, 1, 1, 1}, {0, 0, 3, 0, 0},
		{11, 0, 0, 0, 0}, {0, 7, 0, 0, 0}, {0, 0, 10, 0, 0}, {0, 0, 0, 51, 0}, {0, 0, 0, 0, 13},
		{0, 0, 0, 30, 1}, {1, 0, 1, 0, 6}, {0, 1, 0, 0, 1}, {0, 0, 0, 0, 0}, {2, 1, 1, 1, 1},
	} {
		g := make(algorithm.Group, len(items))
		for i := range items {
			g[i] = items[i]
			g[i].Cost = costs[i]
		}
		before := redisNow(t, c)
		got := take1(t, s, g)
		after := redisNow(t, c)
		slack = max(slack, after-before)
		want, next, _ := model(g, states, before)

		msg := fmt.Sprintf("step %d costs %v", step, costs)
		require.Equal(t, want.Allowed, got.Allowed, msg)
		tol := float64(time.Duration(slack+2) * time.Microsecond)
		for i, it := range g {
			w, gt := want.Items[i], got.Items[i]
			m := msg + " " + it.Spec.Algorithm.String()
			require.Equal(t, w.Remaining, gt.Remaining, m)
			switch {
			case it.Spec.Algorithm == algorithm.SlidingWindowCounter:
				assert.Equal(t, w, gt, m) // e = 0: nothing depends on the clock
			case w.RetryAfter == algorithm.Never:
				assert.Equal(t, w.RetryAfter, gt.RetryAfter, m)
				assert.InDelta(t, w.ResetAfter, gt.ResetAfter, tol, m)
			default:
				assert.InDelta(t, w.RetryAfter, gt.RetryAfter, tol, m)
				assert.InDelta(t, w.ResetAfter, gt.ResetAfter, tol, m)
			}
			require.Equal(t, next[i], loadState(t, c, it.Key, it.Spec.Algorithm), m+" stored state")
		}
		states = next
	}
}

// TestParityLive runs the window algorithms in their current window (no
// frozen clock): the stored state does not depend on the microsecond, so
// it must match exactly; remaining must lie between the model's answers
// at the times before and after the call.
func TestParityLive(t *testing.T) {
	s := single(t)
	c := s.Client()
	items := []algorithm.Item{
		{Key: "rl:{live}:log", Spec: spec(algorithm.SlidingWindowLog, 7, time.Hour, 0)},
		{Key: "rl:{live}:fw", Spec: spec(algorithm.FixedWindow, 9, 24*time.Hour, 0)},
		{Key: "rl:{live}:gcra", Spec: spec(algorithm.GCRA, 3, time.Hour, 5)},
	}
	states := make([]algorithm.State, len(items))
	for step, cost := range []int64{1, 2, 3, 1, 2, 0, 4, 1} {
		g := make(algorithm.Group, len(items))
		for i := range items {
			g[i] = items[i]
			g[i].Cost = cost
		}
		before := redisNow(t, c)
		got := take1(t, s, g)
		after := redisNow(t, c)
		lo, _, _ := model(g, states, before)
		hi, next, _ := model(g, states, after)
		msg := fmt.Sprintf("step %d cost %d", step, cost)
		require.Equal(t, lo.Allowed, got.Allowed, msg)
		require.Equal(t, hi.Allowed, got.Allowed, msg)
		for i, it := range g {
			m := msg + " " + it.Spec.Algorithm.String()
			assert.GreaterOrEqual(t, got.Items[i].Remaining, lo.Items[i].Remaining, m)
			assert.LessOrEqual(t, got.Items[i].Remaining, hi.Items[i].Remaining, m)
			st := loadState(t, c, it.Key, it.Spec.Algorithm)
			switch it.Spec.Algorithm {
			case algorithm.FixedWindow:
				require.Equal(t, next[i], st, m)
			case algorithm.SlidingWindowLog:
				require.Len(t, st.Log.TS, len(next[i].Log.TS), m)
				for j, ts := range st.Log.TS {
					require.InDelta(t, next[i].Log.TS[j], ts, float64(after-before), m)
				}
			case algorithm.GCRA:
				require.InDelta(t, next[i].GCRA.TAT, st.GCRA.TAT, float64(after-before), m)
			}
			next[i] = st // continue from what Redis holds
		}
		states = next
	}
}

// A subject limited per second by a token bucket and per day by a fixed
// window, plus a log and GCRA: when the day denies, nothing is written
// anywhere, whichever algorithm each key uses.
func TestMixedAllOrNothing(t *testing.T) {
	s := single(t)
	c := s.Client()
	ctx := context.Background()
	g := algorithm.Group{
		{Key: "rl:{aon}:per_second", Spec: tb(100, time.Second, 0), Cost: 1},
		{Key: "rl:{aon}:login", Spec: spec(algorithm.SlidingWindowLog, 10, time.Minute, 0), Cost: 1},
		{Key: "rl:{aon}:gcra", Spec: spec(algorithm.GCRA, 10, time.Second, 20), Cost: 1},
		{Key: "rl:{aon}:swc", Spec: spec(algorithm.SlidingWindowCounter, 100, time.Minute, 0), Cost: 1},
		{Key: "rl:{aon}:per_day", Spec: spec(algorithm.FixedWindow, 3, 24*time.Hour, 0), Cost: 1},
	}
	for i := range 3 {
		r := take1(t, s, g)
		require.True(t, r.Allowed, "take %d", i)
		assert.EqualValues(t, 2-i, r.Items[4].Remaining)
	}
	snapshot := func() map[string]string {
		out := map[string]string{}
		for _, it := range g {
			dump, err := c.Dump(ctx, it.Key).Result()
			require.NoError(t, err)
			pttl, err := c.PTTL(ctx, it.Key).Result()
			require.NoError(t, err)
			out[it.Key] = dump
			out[it.Key+" has ttl"] = strconv.FormatBool(pttl > 0)
		}
		return out
	}
	before := snapshot()
	r := take1(t, s, g)
	require.False(t, r.Allowed)
	for i := range 4 {
		assert.Zero(t, r.Items[i].RetryAfter, "%s alone would admit", g[i].Key)
	}
	assert.EqualValues(t, 7, r.Items[1].Remaining, "the log reports its untouched count")
	assert.EqualValues(t, 0, r.Items[4].Remaining)
	assert.Positive(t, r.Items[4].RetryAfter)
	assert.LessOrEqual(t, r.Items[4].RetryAfter, 24*time.Hour, "until the UTC day ends")
	assert.Equal(t, before, snapshot(), "a denied group must write nothing")
}

// The fixed window's 2x at the boundary, on Redis: a previous window's
// full count does not carry into the current one, so the limit is
// admitted again straight after the boundary.
func TestFixedWindowBoundaryRedis(t *testing.T) {
	s := single(t)
	c := s.Client()
	w := time.Hour
	it := algorithm.Item{Key: "rl:{fwb}:q", Spec: spec(algorithm.FixedWindow, 5, w, 0), Cost: 1}
	idx := redisNow(t, c) / w.Microseconds()
	storeState(t, c, it.Key, algorithm.State{Algorithm: algorithm.FixedWindow,
		Window: algorithm.WindowState{Win: idx - 1, Count: 5, Valid: true}})
	for i := range 5 {
		r := take1(t, s, algorithm.Group{it})
		require.True(t, r.Allowed, "take %d after a full previous window", i)
		assert.EqualValues(t, 4-i, r.Items[0].Remaining)
	}
	before := redisNow(t, c)
	r := take1(t, s, algorithm.Group{it})
	after := redisNow(t, c)
	require.False(t, r.Allowed)
	// Denied until the window ends, at (idx+1)·w.
	end := time.Duration((idx+1)*w.Microseconds()-before) * time.Microsecond
	assertCountsDown(t, end, r.Items[0].RetryAfter, after-before)
	assert.Equal(t, r.Items[0].RetryAfter, r.Items[0].ResetAfter)
}

// assertCountsDown checks a duration Redis computed against want, the
// value at a reference instant, when Redis ran at most elapsedUS
// microseconds (of its own clock) after that instant: got is in
// [want − elapsed, want]. A loaded machine widens the window, never
// breaks it.
func assertCountsDown(t *testing.T, want, got time.Duration, elapsedUS int64) {
	t.Helper()
	elapsed := time.Duration(elapsedUS+1) * time.Microsecond // +1: rounding
	assert.LessOrEqual(t, got, want+time.Microsecond)
	assert.GreaterOrEqual(t, got, want-elapsed)
}

// The log on Redis: an entry exactly w old has left the window, and a
// denial's retry is when the oldest needed entry leaves.
func TestSlidingLogWindowRedis(t *testing.T) {
	s := single(t)
	c := s.Client()
	w := time.Minute
	it := algorithm.Item{Key: "rl:{swl}:otp", Spec: spec(algorithm.SlidingWindowLog, 3, w, 0), Cost: 1}
	now := redisNow(t, c)
	storeState(t, c, it.Key, algorithm.State{Algorithm: algorithm.SlidingWindowLog, Log: algorithm.LogState{TS: []int64{
		now - w.Microseconds(), // has left: ts <= now − w
		now - w.Microseconds() + 20*usPerS,
		now - 10*usPerS, now - 5*usPerS,
	}}})
	r := take1(t, s, algorithm.Group{it})
	elapsed := redisNow(t, c) - now
	require.False(t, r.Allowed, "three live entries, limit 3")
	assert.EqualValues(t, 0, r.Items[0].Remaining)
	// The oldest live entry (now − w + 20s) leaves 20s after now.
	assertCountsDown(t, 20*time.Second, r.Items[0].RetryAfter, elapsed)
	assertCountsDown(t, w-5*time.Second, r.Items[0].ResetAfter, elapsed)
	assert.Len(t, loadState(t, c, it.Key, algorithm.SlidingWindowLog).Log.TS, 4, "a denial trims nothing")

	require.NoError(t, c.Del(context.Background(), it.Key).Err())
	for i := range 3 {
		require.True(t, take1(t, s, algorithm.Group{it}).Allowed, i)
	}
	require.False(t, take1(t, s, algorithm.Group{it}).Allowed)
	n, err := c.ZCard(context.Background(), it.Key).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 3, n, "one member per admitted token, unique even within one microsecond")
}

// The seed's worked example on Redis: Prev = 80, Curr = 30, limit 100. The
// script reads its own clock, so the weight of Prev is bounded by the
// elapsed time measured before and after the call.
func TestSlidingCounterEstimateRedis(t *testing.T) {
	s := single(t)
	c := s.Client()
	w := time.Minute.Microseconds()
	it := algorithm.Item{Key: "rl:{swc}:api", Spec: spec(algorithm.SlidingWindowCounter, 100, time.Minute, 0)}
	before := redisNow(t, c)
	st := algorithm.State{Algorithm: algorithm.SlidingWindowCounter,
		Counter: algorithm.CounterState{Win: before / w, Curr: 30, Prev: 80, Valid: true}}
	storeState(t, c, it.Key, st)
	r := take1(t, s, algorithm.Group{it})
	after := redisNow(t, c)
	if after/w != before/w {
		t.Skip("the minute turned during the call; the estimate is tested in package algorithm")
	}
	eb, ea := float64(before%w)/float64(w), float64(after%w)/float64(w)
	lo := int64(100 - 30 - 80*(1-eb)) // earlier: Prev weighs more
	hi := int64(100 - 30 - 80*(1-ea))
	// Early in the minute the estimate passes the limit: remaining is 0.
	lo, hi = max(lo, 0), max(hi, 0)
	assert.GreaterOrEqual(t, r.Items[0].Remaining, lo-1)
	assert.LessOrEqual(t, r.Items[0].Remaining, hi)
	assert.Equal(t, st, loadState(t, c, it.Key, algorithm.SlidingWindowCounter), "cost 0 writes the same counts")
}

func TestRefundPerAlgorithm(t *testing.T) {
	s := single(t)
	c := s.Client()
	ctx := context.Background()
	for _, sp := range []algorithm.Spec{
		spec(algorithm.GCRA, 10, time.Hour, 20),
		spec(algorithm.SlidingWindowLog, 20, time.Hour, 0),
		spec(algorithm.SlidingWindowCounter, 20, time.Hour, 0),
		spec(algorithm.FixedWindow, 20, 24*time.Hour, 0),
	} {
		it := algorithm.Item{Key: "rl:{refund}:" + sp.Algorithm.String(), Spec: sp, Cost: 3}
		g := algorithm.Group{it}
		r1 := take1(t, s, g)
		require.True(t, r1.Allowed)
		take1(t, s, g)
		require.NoError(t, s.Refund(ctx, []algorithm.Group{g}))
		before := redisNow(t, c)
		r := take1(t, s, algorithm.Group{{Key: it.Key, Spec: sp, Cost: 0}})
		assert.Equal(t, r1.Items[0].Remaining, r.Items[0].Remaining, "%v: refund gave the second take back", sp.Algorithm)

		// The Go twin agrees with what refund.lua left.
		st := loadState(t, c, it.Key, sp.Algorithm)
		require.NoError(t, s.Refund(ctx, []algorithm.Group{g}))
		after := redisNow(t, c)
		want, _, _ := algorithm.Refund(sp, st, before, it.Cost)
		got := loadState(t, c, it.Key, sp.Algorithm)
		if len(want.Log.TS) == 0 {
			want.Log.TS = nil // Redis deletes an empty sorted set
		}
		if sp.Algorithm == algorithm.GCRA {
			assert.InDelta(t, want.GCRA.TAT, got.GCRA.TAT, float64(after-before), "gcra")
		} else {
			assert.Equal(t, want, got, sp.Algorithm.String())
		}

		missing := algorithm.Group{{Key: it.Key + ":missing", Spec: sp, Cost: 3}}
		require.NoError(t, s.Refund(ctx, []algorithm.Group{missing}))
		n, err := c.Exists(ctx, missing[0].Key).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "%v: refund must not create a key", sp.Algorithm)
	}
}

// Every write sets the TTL after which the idle key is fresh again: the
// model's Decision.TTL, bounded by Spec.TTL.
func TestTTLPerAlgorithm(t *testing.T) {
	s := single(t)
	c := s.Client()
	ctx := context.Background()
	for _, sp := range []algorithm.Spec{
		spec(algorithm.GCRA, 3, time.Second, 0),
		spec(algorithm.SlidingWindowLog, 5, 90*time.Second, 0),
		spec(algorithm.SlidingWindowCounter, 5, time.Minute, 0),
		spec(algorithm.FixedWindow, 5, time.Hour, 0),
	} {
		key := "rl:{ttl}:" + sp.Algorithm.String()
		before := redisNow(t, c)
		take1(t, s, algorithm.Group{{Key: key, Spec: sp, Cost: 1}})
		after := redisNow(t, c)
		pttl, err := c.PTTL(ctx, key).Result()
		require.NoError(t, err)
		end := redisNow(t, c)
		hi := algorithm.Decide(sp, algorithm.State{}, before, 1).TTL
		lo := algorithm.Decide(sp, algorithm.State{}, after, 1).TTL - time.Duration(end-before)*time.Microsecond - time.Millisecond
		assert.LessOrEqual(t, pttl, max(hi, lo), sp.Algorithm.String())
		assert.GreaterOrEqual(t, pttl, min(hi, lo), sp.Algorithm.String())
		assert.LessOrEqual(t, pttl, sp.TTL(), sp.Algorithm.String())
	}
}

// A limit whose algorithm changed (a policy reload) finds a key of another
// Redis type: it starts afresh instead of failing with WRONGTYPE.
func TestAlgorithmChangeOnRedis(t *testing.T) {
	s := single(t)
	c := s.Client()
	ctx := context.Background()
	key := "rl:{chg}:login"
	log := algorithm.Item{Key: key, Spec: spec(algorithm.SlidingWindowLog, 2, time.Minute, 0), Cost: 2}
	require.True(t, take1(t, s, algorithm.Group{log}).Allowed)
	bucketItem := algorithm.Item{Key: key, Spec: tb(2, time.Minute, 0), Cost: 1}
	require.NoError(t, s.Refund(ctx, []algorithm.Group{{bucketItem}}), "refund across a type change credits nothing")
	r := take1(t, s, algorithm.Group{bucketItem})
	require.True(t, r.Allowed)
	assert.EqualValues(t, 1, r.Items[0].Remaining, "a fresh bucket")
	typ, err := c.Type(ctx, key).Result()
	require.NoError(t, err)
	assert.Equal(t, "hash", typ)
	r = take1(t, s, algorithm.Group{log})
	require.True(t, r.Allowed, "and back: a fresh log")
}

func TestInvalidSpecsRejected(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	for name, sp := range map[string]algorithm.Spec{
		"log above 10000":   spec(algorithm.SlidingWindowLog, 10_001, time.Minute, 0),
		"burst on a window": spec(algorithm.FixedWindow, 5, time.Minute, 6),
		"gcra below 1µs":    spec(algorithm.GCRA, 2000, time.Millisecond, 0),
	} {
		g := []algorithm.Group{{{Key: "rl:{inv}:a", Spec: sp, Cost: 1}}}
		_, err := s.Take(ctx, g)
		assert.Error(t, err, name)
		assert.Error(t, s.Refund(ctx, g), name)
	}
}

// GCRA's boundary on Redis: a fresh key admits its whole burst in one
// take (tat' − now = τ exactly: the comparison is <=), and not one more.
func TestGCRAFullBurstRedis(t *testing.T) {
	s := single(t)
	sp := spec(algorithm.GCRA, 3, time.Second, 4) // T = 333334µs, τ = 4T
	before := redisNow(t, s.Client())
	r := take1(t, s, algorithm.Group{{Key: "rl:{gb}:a", Spec: sp, Cost: 4}})
	require.True(t, r.Allowed)
	assert.EqualValues(t, 0, r.Items[0].Remaining)
	assert.Equal(t, 4*333334*time.Microsecond, r.Items[0].ResetAfter)
	r = take1(t, s, algorithm.Group{{Key: "rl:{gb}:a", Spec: sp, Cost: 1}})
	elapsed := redisNow(t, s.Client()) - before
	require.False(t, r.Allowed)
	// One emission interval after the first take, less the time between.
	assertCountsDown(t, 333334*time.Microsecond, r.Items[0].RetryAfter, elapsed)
	r = take1(t, s, algorithm.Group{{Key: "rl:{gb}:b", Spec: sp, Cost: 5}})
	require.False(t, r.Allowed)
	assert.Equal(t, algorithm.Never, r.Items[0].RetryAfter)
}
