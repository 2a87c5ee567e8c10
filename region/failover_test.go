package region_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
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

// TestRecoversAfterFailoverToReplica: the master of a key's shard dies
// (SIGKILL) and its replica is promoted (CLUSTER FAILOVER TAKEOVER). The
// same Store, without a restart, fails fast meanwhile, then finds the new
// master, runs the script there although its script cache is empty
// (NOSCRIPT, then EVAL), and counts on from the replicated bucket; the
// new shard's breaker is closed and the store stops reporting degraded.
func TestRecoversAfterFailoverToReplica(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	const (
		key = "rl:{failover}:x"
		// callTimeout is a node's budget with room for -race on a loaded
		// 2-core machine. margin is the slack on top of it: what a call
		// must never do is wait for the dead server (TCP gives up after
		// minutes), and a starved machine can deschedule a goroutine
		// for a good part of a second.
		callTimeout = 50 * time.Millisecond
		margin      = 2 * time.Second
		// recoverWithin bounds the wait for the first success after the
		// promotion.
		recoverWithin = 20 * time.Second
	)
	hourly := tb(100, time.Hour, 0) // refills one token per 36 s
	rate := float64(hourly.Limit) / float64(hourly.Period.Microseconds())

	addrs, master := clusterWithKey(t, key)
	replica := redistest.Replica(t, master)
	t.Logf("key %s on master %s, replica %s", key, master.Addr, replica.Addr)

	s, err := region.Open(ctx, addrs, region.Options{
		Timeout: callTimeout,
		Breaker: shortBreaker,
		Logger:  slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	g := []algorithm.Group{{{Key: key, Spec: hourly, Cost: 1}}}
	take := func() (algorithm.Result, time.Duration, error) {
		start := time.Now()
		res, err := s.Take(ctx, g)
		if err != nil {
			return algorithm.Result{}, time.Since(start), err
		}
		return res[0], time.Since(start), nil
	}

	// 30 takes on the master (a call that timed out on a loaded machine
	// may have run too), then wait until the replica has them all.
	var lostBefore int
	for taken := 0; taken < 30; {
		_, _, err := take()
		if err != nil {
			require.Less(t, lostBefore, 10, "takes keep failing on a healthy cluster: %v", err)
			lostBefore++
			continue
		}
		taken++
	}
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, MaxRetries: -1})
	before := bucket(t, mc, key)
	require.NoError(t, mc.Close())
	require.True(t, before.Valid)
	require.GreaterOrEqual(t, before.Tokens, float64(70-lostBefore))
	require.Less(t, before.Tokens, 71.0, "30 takes, less than a token refilled")
	redistest.WaitInSync(t, master, replica)

	rc := redis.NewClient(&redis.Options{Addr: replica.Addr, MaxRetries: -1})
	defer rc.Close()
	scriptCached := func() bool {
		t.Helper()
		// A token bucket's group runs check_tb.lua (region/script.go).
		ex, err := rc.ScriptExists(ctx, lua.CheckTB.Hash()).Result()
		require.NoError(t, err)
		return ex[0]
	}
	require.False(t, scriptCached(), "scripts replicate by effects: the replica never ran check.lua")

	// The master dies. Calls fail fast: first sent (refused dials), then
	// refused by the shard's open breaker without being sent, while its
	// background probes fail. The promotion comes after at least one
	// failed probe, as in a real failover (which takes the cluster's node
	// timeout, seconds).
	master.Kill()
	killed := time.Now()
	var sentDown, refusedDown int
	var probesDown uint64
	var worstDown time.Duration
	for refusedDown < 20 || probesDown < 1 {
		for _, h := range s.Shards() {
			if h.Shard == master.Addr {
				probesDown = h.ProbeFailures
			}
		}
		require.Less(t, time.Since(killed), 10*time.Second,
			"the dead master's breaker did not open and probe (%d sent, %d refused)", sentDown, refusedDown)
		_, took, err := take()
		require.Error(t, err, "the only server of the key's slot is dead")
		worstDown = max(worstDown, took)
		assert.Less(t, took, callTimeout+margin)
		if errors.Is(err, region.ErrUnavailable) {
			refusedDown++
		} else {
			sentDown++
		}
		time.Sleep(5 * time.Millisecond) // pacing, like a trickle of requests
	}
	var deadShard region.ShardHealth
	for _, h := range s.Shards() {
		if h.Shard == master.Addr {
			deadShard = h
		}
	}
	assert.NotEqual(t, region.BreakerClosed, deadShard.State, "the dead master's breaker opened")
	assert.True(t, degraded(s))
	t.Logf("master down: %d calls sent and failed, then %d refused by the open breaker and %d failed probe(s); slowest %v (timeout %v)",
		sentDown, refusedDown, probesDown, worstDown, callTimeout)

	// Promotion: the replica owns the slot, with the replicated bucket and
	// an empty script cache.
	takeover := time.Now()
	replica.Takeover()
	promoted := time.Now()
	after := bucket(t, rc, key)
	assert.Equal(t, before, after, "the promoted replica holds the bucket as the master left it")
	require.False(t, scriptCached(), "the promoted replica has no scripts yet: EVALSHA will answer NOSCRIPT")

	// The same Store recovers: it fails fast until its slot map names the
	// new master, then the script runs there.
	var sentUp, refusedUp int64 // sentUp: failed calls that were sent, and may have run if on the new master
	var worstUp time.Duration
	var res algorithm.Result
	for {
		require.Less(t, time.Since(promoted), recoverWithin,
			"no successful take %v after the promotion (%d calls sent and failed, %d refused); shards %+v",
			recoverWithin, sentUp, refusedUp, s.Shards())
		r, took, err := take()
		worstUp = max(worstUp, took)
		assert.Less(t, took, callTimeout+margin)
		if err == nil {
			res = r
			break
		}
		if errors.Is(err, region.ErrUnavailable) {
			refusedUp++
		} else {
			sentUp++
		}
		time.Sleep(5 * time.Millisecond) // pacing, like a trickle of requests
	}
	recovered := time.Since(promoted)
	require.True(t, res.Allowed)
	// The dead master's breaker is still open, but its address masters no
	// slot any more: it is not reported, so the store is not degraded.
	assert.False(t, degraded(s), "degraded after recovery: %+v", s.Shards())
	assert.True(t, scriptCached(), "EVAL after NOSCRIPT loaded check.lua on the promoted replica")

	// Counting continues from the replicated state: the bucket on the new
	// master is the replicated one, refilled, less whole takes: this one,
	// and any sent call that failed but ran there (its reply lost).
	refill := func(from, to algorithm.BucketState) float64 { return rate * float64(to.TS-from.TS) }
	after1 := bucket(t, rc, key)
	rem := res.Items[0].Remaining
	counted := before.Tokens + refill(before, after1) - after1.Tokens
	assert.InDelta(t, math.Round(counted), counted, 1e-6, "the bucket went on from the replicated state by whole takes")
	assert.GreaterOrEqual(t, math.Round(counted), 1.0, "the successful take counted")
	assert.LessOrEqual(t, math.Round(counted), float64(1+sentUp), "only calls that were sent may have counted")
	assert.Equal(t, int64(math.Floor(after1.Tokens)), rem)
	assert.GreaterOrEqual(t, rem, int64(math.Floor(before.Tokens))-1-sentUp, "no take was lost by the failover")

	r2, _, err := take()
	require.NoError(t, err)
	after2 := bucket(t, rc, key)
	assert.InDelta(t, after1.Tokens+refill(after1, after2)-1, after2.Tokens, 1e-6, "the next take counts once (EVALSHA hits the reloaded cache)")
	assert.Equal(t, int64(math.Floor(after2.Tokens)), r2.Items[0].Remaining)
	t.Logf("promoted %v after the kill (TAKEOVER took %v); first success %v after the promotion (%d calls sent and failed, %d refused; slowest %v)",
		promoted.Sub(killed), promoted.Sub(takeover), recovered, sentUp, refusedUp, worstUp)
	t.Logf("tokens %.4f on the master before the kill, %.4f on the promoted replica; %.0f take(s) counted since; remaining %d, then %d",
		before.Tokens, after.Tokens, math.Round(counted), rem, r2.Items[0].Remaining)

	// The shard serving the key now is the promoted replica, and its
	// breaker is closed.
	var newShard *region.ShardHealth
	for _, h := range s.Shards() {
		if h.Shard == replica.Addr {
			newShard = &h
		}
	}
	require.NotNil(t, newShard, "a breaker for the new master %s: %+v", replica.Addr, s.Shards())
	assert.Equal(t, region.BreakerClosed, newShard.State)

	t.Logf("shards reported after recovery: %+v", s.Shards())
}

// clusterWithKey starts a 3-master cluster and returns its addresses and
// the master serving key.
func clusterWithKey(t *testing.T, key string) ([]string, *redistest.Instance) {
	t.Helper()
	nodes := redistest.ClusterNodes(t, 3)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	probe := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer probe.Close()
	m, err := probe.MasterForKey(context.Background(), key)
	require.NoError(t, err)
	for _, n := range nodes {
		if n.Addr == m.Options().Addr {
			return addrs, n
		}
	}
	t.Fatalf("no node is the master %s of %s", m.Options().Addr, key)
	return nil, nil
}
