package region_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lua"
	"github.com/allot-dev/allot/region"
)

func tb(limit int64, period time.Duration, burst int64) algorithm.Spec {
	return algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: limit, Period: period, Burst: burst}
}

func open(t *testing.T, addrs ...string) *region.Store {
	t.Helper()
	s, err := region.Open(context.Background(), addrs, region.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func single(t *testing.T) *region.Store {
	t.Helper()
	return open(t, redistest.Server(t).Addr)
}

// redisNow is Redis' clock in microseconds, the clock the scripts use.
func redisNow(t *testing.T, c redis.Cmdable) int64 {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	require.NoError(t, err)
	return tm.UnixMicro()
}

// bucket reads a bucket's stored state.
func bucket(t *testing.T, c redis.Cmdable, key string) algorithm.BucketState {
	t.Helper()
	v, err := c.HMGet(context.Background(), key, "tokens", "ts").Result()
	require.NoError(t, err)
	if v[0] == nil {
		return algorithm.BucketState{}
	}
	tokens, err := strconv.ParseFloat(v[0].(string), 64)
	require.NoError(t, err)
	ts, err := strconv.ParseInt(v[1].(string), 10, 64)
	require.NoError(t, err)
	return algorithm.BucketState{Tokens: tokens, TS: ts, Valid: true}
}

func take1(t *testing.T, s *region.Store, g algorithm.Group) algorithm.Result {
	t.Helper()
	res, err := s.Take(context.Background(), []algorithm.Group{g})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Len(t, res[0].Items, len(g))
	return res[0]
}

func TestOpenSingleIsNotCluster(t *testing.T) {
	s := single(t)
	assert.False(t, s.Cluster())
	_, ok := s.Client().(*redis.Client)
	assert.True(t, ok)
}

// openBeside opens a store with opts on a redis-server of its own, and a
// plain client of the same server to look at what Open did.
func openBeside(t *testing.T, opts region.Options) (*region.Store, *redis.Client) {
	t.Helper()
	srv := redistest.Server(t)
	st, err := region.Open(context.Background(), []string{srv.Addr}, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	return st, direct
}

// Open readies a shard for a busy start: as many connections as
// pipelines may be in flight, and the store's scripts loaded, so that the
// first pipelines neither dial nor fall back from NOSCRIPT to EVAL inside
// the time their stall judgement counts.
func TestOpenWarmsTheShard(t *testing.T) {
	ctx := context.Background()
	st, direct := openBeside(t, region.Options{Pipelines: 3})

	var hashes []string
	for _, sc := range []*redis.Script{lua.CheckTB, lua.Check, lua.Refund, lua.Lease, lua.Return} {
		hashes = append(hashes, sc.Hash())
	}
	exists, err := direct.ScriptExists(ctx, hashes...).Result()
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true, true, true, true}, exists, "check_tb, check, refund, lease, return loaded")

	list, err := direct.ClientList(ctx).Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, strings.Count(list, "\n")-1, 3, "one connection per pipeline, besides this one:\n%s", list)

	take1(t, st, algorithm.Group{{Key: "rl:{warm}:x", Spec: tb(100, time.Second, 0), Cost: 1}})
	info, err := direct.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	assert.NotContains(t, info, "cmdstat_eval:", "the first check needed no EVAL")
}

// A pool of one connection, held by the warm-up, still loads the scripts.
func TestOpenWarmsAPoolOfOne(t *testing.T) {
	ctx := context.Background()
	_, direct := openBeside(t, region.Options{PoolSize: 1})
	exists, err := direct.ScriptExists(ctx, lua.CheckTB.Hash(), lua.Return.Hash()).Result()
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true}, exists)
}

// TestOpenNoWarmUp: with Options.NoWarmUp (a coordinator's store)
// Open leaves the script cache as it was and holds no extra connections.
func TestOpenNoWarmUp(t *testing.T) {
	ctx := context.Background()
	_, direct := openBeside(t, region.Options{Pipelines: 3, NoWarmUp: true})

	exists, err := direct.ScriptExists(ctx, lua.CheckTB.Hash(), lua.Check.Hash()).Result()
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false}, exists, "no script loaded")
	list, err := direct.ClientList(ctx).Result()
	require.NoError(t, err)
	assert.Less(t, strings.Count(list, "\n")-1, 3, "fewer connections than pipelines, besides this one:\n%s", list)
}

// TestConcurrentExactness hammers one bucket from many goroutines and
// checks the admitted count against the refill the stored state proves.
//
// The warm-up takes the whole burst, so the bucket is empty at its write
// time f (the stored ts). After the hammer, the stored state is (tokens_end,
// l) where l is the time of the last admitted take. Every token admitted
// was either in the initial burst or refilled during [f, l], and refill
// is only lost to the cap when the bucket reaches burst, which needs a
// 0.5 s gap without any take while 64 goroutines are hammering. So:
//
//	admitted + tokens_end == burst + rate*(l-f)   (up to float rounding)
//
// and, with TIME read before the first and after the last call,
// admitted <= burst + rate*(t1-t0).
func TestConcurrentExactness(t *testing.T) {
	srv := redistest.Server(t)
	s := open(t, srv.Addr)
	c := s.Client()
	const key = "rl:{tenant=conc}:free:per_second"
	spec := tb(100, time.Second, 50)
	rate := spec.Rate()

	t0 := redisNow(t, c)
	warm := take1(t, s, algorithm.Group{{Key: key, Spec: spec, Cost: 50}})
	require.True(t, warm.Allowed)
	first := bucket(t, c, key)
	require.Zero(t, first.Tokens)

	var admitted, denied atomic.Int64
	deadline := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			g := []algorithm.Group{{{Key: key, Spec: spec, Cost: 1}}}
			for time.Now().Before(deadline) {
				res, err := s.Take(context.Background(), g)
				if !assert.NoError(t, err) {
					return
				}
				if res[0].Allowed {
					admitted.Add(1)
				} else {
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	last := bucket(t, c, key)
	t1 := redisNow(t, c)

	n := float64(50 + admitted.Load())
	inner := float64(last.TS-first.TS) / 1e6
	outer := float64(t1-t0) / 1e6
	t.Logf("admitted %d (+50 burst), denied %d, inner %.6fs, outer %.6fs, tokens_end %.6f",
		admitted.Load(), denied.Load(), inner, outer, last.Tokens)

	require.Positive(t, denied.Load(), "the bucket was never contended")
	require.Greater(t, inner, 0.5, "the hammer did not run long enough to mean anything")
	assert.InDelta(t, 50+rate*inner, n+last.Tokens, 1e-6, "admitted + left != burst + refill")
	assert.LessOrEqual(t, n, 50+rate*outer+1e-6, "admitted more than burst + refill over the whole run")
	assert.GreaterOrEqual(t, n, 50+rate*inner-last.Tokens-1e-6)
}

func TestAllOrNothing(t *testing.T) {
	s := single(t)
	c := s.Client()
	ps := algorithm.Item{Key: "rl:{tenant=acme}:free:per_second", Spec: tb(100, time.Second, 0), Cost: 1}
	pd := algorithm.Item{Key: "rl:{tenant=acme}:free:per_day", Spec: tb(3, 24*time.Hour, 0), Cost: 1}
	g := algorithm.Group{ps, pd}

	for i := range 3 {
		r := take1(t, s, g)
		require.True(t, r.Allowed, "take %d", i)
		assert.EqualValues(t, 2-i, r.Items[1].Remaining)
	}
	before := bucket(t, c, ps.Key)
	beforeDay := bucket(t, c, pd.Key)

	r := take1(t, s, g)
	require.False(t, r.Allowed)
	assert.Zero(t, r.Items[0].RetryAfter, "per_second alone would admit")
	assert.EqualValues(t, 0, r.Items[1].Remaining)
	// One token of a 3/day bucket refills in 8h; allow for the time since.
	assert.InDelta(t, 8*time.Hour, r.Items[1].RetryAfter, float64(time.Minute))
	assert.GreaterOrEqual(t, r.Items[0].Remaining, int64(math.Floor(before.Tokens)), "denied result reports current tokens")

	assert.Equal(t, before, bucket(t, c, ps.Key), "a denied group must not touch per_second")
	assert.Equal(t, beforeDay, bucket(t, c, pd.Key), "a denied group must not touch per_day")
}

func TestCostWeighting(t *testing.T) {
	s := single(t)
	it := algorithm.Item{Key: "rl:{k}:w", Spec: tb(1, time.Hour, 100), Cost: 10}

	r := take1(t, s, algorithm.Group{it})
	require.True(t, r.Allowed)
	assert.EqualValues(t, 90, r.Items[0].Remaining)
	assert.Zero(t, r.Items[0].RetryAfter)
	// 10 tokens at 1/h take 10h to come back (minus microseconds elapsed).
	assert.InDelta(t, 10*time.Hour, r.Items[0].ResetAfter, float64(time.Second))

	r = take1(t, s, algorithm.Group{it})
	require.True(t, r.Allowed)
	assert.EqualValues(t, 80, r.Items[0].Remaining)

	it.Cost = 101
	r = take1(t, s, algorithm.Group{it})
	require.False(t, r.Allowed)
	assert.Equal(t, algorithm.Never, r.Items[0].RetryAfter)
	assert.EqualValues(t, 80, r.Items[0].Remaining)

	it.Cost = 100
	r = take1(t, s, algorithm.Group{it})
	require.False(t, r.Allowed)
	assert.InDelta(t, 20*time.Hour, r.Items[0].RetryAfter, float64(time.Second))

	// A brand-new bucket asked for more than it can ever hold: Never, and
	// nothing is written.
	r = take1(t, s, algorithm.Group{{Key: "rl:{k}:new", Spec: tb(5, time.Second, 0), Cost: 6}})
	require.False(t, r.Allowed)
	assert.Equal(t, algorithm.Never, r.Items[0].RetryAfter)
	assert.EqualValues(t, 5, r.Items[0].Remaining)
	n, err := s.Client().Exists(context.Background(), "rl:{k}:new").Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestTTL(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	for _, tc := range []struct {
		spec algorithm.Spec
		want time.Duration
	}{
		{tb(100, time.Second, 50), 1500 * time.Millisecond}, // 0.5s to refill + 1s
		{tb(1, time.Hour, 5), 5*time.Hour + time.Second},
		{tb(3, 1100*time.Millisecond, 0), 2100 * time.Millisecond},
	} {
		require.Equal(t, tc.want, tc.spec.TTL(), "algorithm.Spec.TTL disagrees with the test")
		key := fmt.Sprintf("rl:{ttl}:%d/%v", tc.spec.Limit, tc.spec.Period)
		start := time.Now()
		take1(t, s, algorithm.Group{{Key: key, Spec: tc.spec, Cost: 1}})
		pttl, err := s.Client().PTTL(ctx, key).Result()
		require.NoError(t, err)
		// PEXPIRE ran after start and PTTL answered before now.
		assert.LessOrEqual(t, pttl, tc.want, key)
		assert.Greater(t, pttl, tc.want-time.Since(start)-time.Millisecond, key)
	}
}

func TestNoScriptRecovery(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	g := algorithm.Group{{Key: "rl:{ns}:a", Spec: tb(1, time.Hour, 10), Cost: 1}}

	assert.EqualValues(t, 9, take1(t, s, g).Items[0].Remaining)
	require.NoError(t, s.Client().ScriptFlush(ctx).Err())
	assert.EqualValues(t, 8, take1(t, s, g).Items[0].Remaining)
	assert.EqualValues(t, 7, take1(t, s, g).Items[0].Remaining, "EVAL reloaded the cache, EVALSHA works again")

	require.NoError(t, s.Client().ScriptFlush(ctx).Err())
	require.NoError(t, s.Refund(ctx, []algorithm.Group{g}))
	assert.InDelta(t, 8, bucket(t, s.Client(), g[0].Key).Tokens, 0.01)
}

func TestRefund(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	it := algorithm.Item{Key: "rl:{rf}:a", Spec: tb(1, time.Hour, 100), Cost: 10}
	g := []algorithm.Group{{it}}

	take1(t, s, g[0])
	take1(t, s, g[0])
	require.InDelta(t, 80, bucket(t, s.Client(), it.Key).Tokens, 0.01)
	require.NoError(t, s.Refund(ctx, g))
	assert.InDelta(t, 90, bucket(t, s.Client(), it.Key).Tokens, 0.01)
	require.NoError(t, s.Refund(ctx, g))
	require.NoError(t, s.Refund(ctx, g))
	assert.Equal(t, 100.0, bucket(t, s.Client(), it.Key).Tokens, "refund is capped at burst")
	pttl, err := s.Client().PTTL(ctx, it.Key).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, 100*time.Hour, "refund refreshes the TTL")

	missing := []algorithm.Group{{{Key: "rl:{rf}:missing", Spec: it.Spec, Cost: 5}}}
	require.NoError(t, s.Refund(ctx, missing))
	n, err := s.Client().Exists(ctx, "rl:{rf}:missing").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a missing bucket is full; refund must not create it")
}

// TestParitySlowRate runs one sequence through Redis and through
// algorithm.BucketState. At 1 token per hour the microseconds between the
// model's clock (TIME before each call) and the script's cannot move a
// token, so allowed and remaining must match exactly; the waits may differ
// by at most the time a call took.
func TestParitySlowRate(t *testing.T) {
	s := single(t)
	c := s.Client()
	spec := tb(1, time.Hour, 7)
	const key = "rl:{parity}:slow"
	var model algorithm.BucketState
	var slack int64 // µs: the widest [before, after] window seen
	for i, cost := range []int64{1, 2, 8, 3, 2, 1, 0, 1, 7, 1} {
		before := redisNow(t, c)
		got := take1(t, s, algorithm.Group{{Key: key, Spec: spec, Cost: cost}})
		slack = max(slack, redisNow(t, c)-before)

		st := model.Refill(spec, before)
		ok, want := st.Check(spec, cost)
		if ok {
			st.Tokens -= float64(cost)
			model = st
		}
		msg := fmt.Sprintf("step %d cost %d", i, cost)
		require.Equal(t, ok, got.Allowed, msg)
		require.Equal(t, want.Remaining, got.Items[0].Remaining, msg)
		tol := float64((slack + 2) * int64(time.Microsecond))
		if want.RetryAfter == algorithm.Never {
			assert.Equal(t, algorithm.Never, got.Items[0].RetryAfter, msg)
		} else {
			assert.InDelta(t, want.RetryAfter, got.Items[0].RetryAfter, tol, msg)
		}
		assert.InDelta(t, want.ResetAfter, got.Items[0].ResetAfter, tol, msg)
	}
}

// TestParityFrozenClock makes both sides compute from the same clock: a
// stored ts in the future means no refill on either side (a clock stepping
// back must not mint tokens), so every field, and the stored float, must be
// bit-identical, fractional tokens and odd periods included.
func TestParityFrozenClock(t *testing.T) {
	s := single(t)
	c := s.Client()
	ctx := context.Background()
	future := redisNow(t, c) + int64(24*time.Hour/time.Microsecond)
	items := []algorithm.Item{
		{Key: "rl:{frozen}:a", Spec: tb(7, 3*time.Second, 10)},
		{Key: "rl:{frozen}:b", Spec: tb(5, 2300*time.Millisecond, 0)},
	}
	model := []algorithm.BucketState{
		{Tokens: 7.3, TS: future, Valid: true},
		{Tokens: 4.75, TS: future, Valid: true},
	}
	for i, it := range items {
		require.NoError(t, c.HSet(ctx, it.Key, "tokens", model[i].Tokens, "ts", model[i].TS).Err())
	}

	for step, costs := range [][2]int64{{1, 1}, {2, 0}, {3, 3}, {1, 1}, {1, 1}, {0, 1}, {11, 0}, {2, 1}, {1, 6}, {0, 0}} {
		g := make(algorithm.Group, len(items))
		for i := range items {
			g[i] = items[i]
			g[i].Cost = costs[i]
		}
		got := take1(t, s, g)

		now := redisNow(t, c) // any time before future gives the same answer
		want := algorithm.Result{Allowed: true, Items: make([]algorithm.ItemResult, len(g))}
		next := make([]algorithm.BucketState, len(g))
		for i, it := range g {
			next[i] = model[i].Refill(it.Spec, now)
			ok, r := next[i].Check(it.Spec, it.Cost)
			want.Allowed = want.Allowed && ok
			want.Items[i] = r
		}
		if want.Allowed {
			for i, it := range g {
				next[i].Tokens -= float64(it.Cost)
			}
			model = next
		} else {
			// Check assumes its own item is taken when it passes; in a
			// denied group nothing is, so report the untouched bucket.
			for i, it := range g {
				_, untouched := next[i].Check(it.Spec, 0)
				want.Items[i].Remaining = untouched.Remaining
				want.Items[i].ResetAfter = untouched.ResetAfter
			}
		}
		msg := fmt.Sprintf("step %d costs %v", step, costs)
		require.Equal(t, want, got, msg)
		for i, it := range g {
			require.Equal(t, model[i], bucket(t, c, it.Key), msg+" stored state of "+it.Key)
		}
	}
}

func TestEmptyAndInvalidGroups(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	res, err := s.Take(ctx, []algorithm.Group{{}, {{Key: "rl:{v}:a", Spec: tb(1, time.Second, 0), Cost: 1}}})
	require.NoError(t, err)
	assert.Equal(t, algorithm.Result{Allowed: true}, res[0])
	assert.True(t, res[1].Allowed)

	ok := tb(1, time.Second, 0)
	for name, g := range map[string]algorithm.Group{
		"duplicate key":    {{Key: "rl:{v}:a", Spec: ok, Cost: 1}, {Key: "rl:{v}:a", Spec: ok, Cost: 1}},
		"two hash tags":    {{Key: "rl:{v}:a", Spec: ok, Cost: 1}, {Key: "rl:{w}:a", Spec: ok, Cost: 1}},
		"sub-ms period":    {{Key: "rl:{v}:a", Spec: tb(1, 1500*time.Microsecond, 0), Cost: 1}},
		"zero limit":       {{Key: "rl:{v}:a", Spec: tb(0, time.Second, 0), Cost: 1}},
		"negative cost":    {{Key: "rl:{v}:a", Spec: ok, Cost: -1}},
		"no algorithm set": {{Key: "rl:{v}:a", Spec: algorithm.Spec{Limit: 1, Period: time.Second}, Cost: 1}},
	} {
		_, err := s.Take(ctx, []algorithm.Group{g})
		assert.Error(t, err, name)
		assert.Error(t, s.Refund(ctx, []algorithm.Group{g}), name)
	}
}

func TestTakeErrorIsWrapped(t *testing.T) {
	srv := redistest.Server(t)
	s := open(t, srv.Addr)
	srv.Kill()
	_, err := s.Take(context.Background(), []algorithm.Group{{{Key: "rl:{x}:a", Spec: tb(1, time.Second, 0), Cost: 1}}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "region: take")
}

func TestCluster(t *testing.T) {
	addrs := redistest.Cluster(t, 3)
	ctx := context.Background()

	for name, s := range map[string]*region.Store{"one seed": open(t, addrs[0]), "all seeds": open(t, addrs...)} {
		t.Run(name, func(t *testing.T) {
			require.True(t, s.Cluster())
			cc, ok := s.Client().(*redis.ClusterClient)
			require.True(t, ok)

			// Pick subjects until every master owns one.
			owner := map[string]string{}
			var groups []algorithm.Group
			for i := 0; len(owner) < len(addrs); i++ {
				require.Less(t, i, 1000)
				tag := fmt.Sprintf("tenant=%s-%d", name, i)
				node, err := cc.MasterForKey(ctx, "{"+tag+"}")
				require.NoError(t, err)
				if _, seen := owner[node.Options().Addr]; seen {
					continue
				}
				owner[node.Options().Addr] = tag
				groups = append(groups, algorithm.Group{
					{Key: "rl:{" + tag + "}:per_second", Spec: tb(100, time.Second, 0), Cost: 1},
					{Key: "rl:{" + tag + "}:per_hour", Spec: tb(2, time.Hour, 0), Cost: 1},
				})
			}

			check := func(allowed bool, perHour int64) {
				t.Helper()
				res, err := s.Take(ctx, groups)
				require.NoError(t, err)
				require.Len(t, res, len(groups))
				for i, r := range res {
					assert.Equal(t, allowed, r.Allowed, "group %d", i)
					assert.Equal(t, perHour, r.Items[1].Remaining, "group %d", i)
				}
			}
			check(true, 1)
			require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
				return c.ScriptFlush(ctx).Err()
			}))
			check(true, 0)
			check(false, 0)
			require.NoError(t, s.Refund(ctx, groups))
			check(true, 0)
		})
	}
}

// A request's token-bucket groups bound for one server go out as one
// shared check_tb.lua call; after SCRIPT FLUSH that call is sent again
// as one EVAL, and each group still gets its own answer: the denied group
// is denied (and written nothing), the others are taken once.
func TestSharedCheckAfterScriptFlush(t *testing.T) {
	s := single(t)
	ctx := context.Background()
	var groups []algorithm.Group
	for i := range 5 {
		groups = append(groups, algorithm.Group{{Key: fmt.Sprintf("rl:{shared%d}:a", i), Spec: tb(1, time.Hour, 3), Cost: 1}})
	}
	groups[2][0].Cost = 4 // more than the bucket holds: denied
	require.NoError(t, s.Client().ScriptFlush(ctx).Err())
	require.NoError(t, s.Client().ConfigResetStat(ctx).Err())
	res, err := s.Take(ctx, groups)
	require.NoError(t, err)
	require.Len(t, res, len(groups))
	for i, r := range res {
		if i == 2 {
			assert.False(t, r.Allowed, "group %d", i)
			assert.EqualValues(t, 3, r.Items[0].Remaining, "group %d", i)
			n, err := s.Client().Exists(ctx, groups[i][0].Key).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "the denied group wrote nothing")
			continue
		}
		assert.True(t, r.Allowed, "group %d", i)
		assert.EqualValues(t, 2, r.Items[0].Remaining, "group %d", i)
	}
	assert.EqualValues(t, 1, redistest.Calls(t, s.Client(), "evalsha"), "one shared EVALSHA (NOSCRIPT)")
	assert.EqualValues(t, 1, redistest.Calls(t, s.Client(), "eval"), "one shared EVAL")
}
