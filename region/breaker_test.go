package region_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lua"
	"github.com/allot-dev/allot/region"
)

// timeout is the exact path's deadline in these tests, the default; margin
// is what a loaded CI machine under -race may add to it (scheduling, GC).
// The precise figures are in docs/performance.md, "Resilience".
const (
	timeout = region.DefaultTimeout
	margin  = 250 * time.Millisecond
)

// shortBreaker opens after 10 failures in a row (the default) and probes
// at most 300 ms apart.
var shortBreaker = region.BreakerOptions{MaxOpen: 300 * time.Millisecond}

// degraded reports whether some shard's breaker is not closed.
func degraded(s *region.Store) bool {
	for _, h := range s.Shards() {
		if h.State != region.BreakerClosed {
			return true
		}
	}
	return false
}

func openWith(t *testing.T, opts region.Options, addrs ...string) *region.Store {
	t.Helper()
	opts.Timeout = timeout
	if os.Getenv("ALLOT_TEST_LOG") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	s, err := region.Open(context.Background(), addrs, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// daily never refills within a test, so remaining counts takes exactly.
var daily = tb(100, 24*time.Hour, 0)

func take(s *region.Store, key string) (algorithm.Result, time.Duration, error) {
	start := time.Now()
	res, err := s.Take(context.Background(), []algorithm.Group{{{Key: key, Spec: daily, Cost: 1}}})
	if err != nil {
		return algorithm.Result{}, time.Since(start), err
	}
	return res[0], time.Since(start), nil
}

// takeOK takes until a call succeeds (a fresh connection after a fault
// may need a few tries on a loaded machine) and returns its remaining.
func takeOK(t *testing.T, s *region.Store, key string) int64 {
	t.Helper()
	rem, _ := takeCounted(t, s, key)
	return rem
}

// takeCounted is takeOK that also says how many failed calls were sent
// first: a call that timed out may still have run in Redis (its reply was
// lost), so each may have counted once.
func takeCounted(t *testing.T, s *region.Store, key string) (rem int64, sentFailed int64) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		res, _, err := take(s, key)
		if err != nil && !errors.Is(err, region.ErrUnavailable) {
			sentFailed++
		}
		if assert.NoError(c, err) {
			rem = res.Items[0].Remaining
		}
	}, 10*time.Second, 20*time.Millisecond)
	return rem, sentFailed
}

// TestNoCallWaitsBeyondItsDeadline: whatever the fault, a call returns
// (with an error) within the timeout, with breakers off so that every
// call really goes to the faulty Redis.
func TestNoCallWaitsBeyondItsDeadline(t *testing.T) {
	redistest.Require(t)
	faults := map[string]func(*redistest.Instance, *faultproxy.Proxy) (undo func()){
		"killed":     func(in *redistest.Instance, _ *faultproxy.Proxy) func() { in.Kill(); return in.Restart },
		"paused":     func(in *redistest.Instance, _ *faultproxy.Proxy) func() { in.Pause(); return in.Continue },
		"black hole": func(_ *redistest.Instance, p *faultproxy.Proxy) func() { p.BlackHole(true); return p.Heal },
		"cut":        func(_ *redistest.Instance, p *faultproxy.Proxy) func() { p.Cut(); return p.Heal },
		"100ms latency": func(_ *redistest.Instance, p *faultproxy.Proxy) func() {
			p.SetLatency(100 * time.Millisecond)
			return p.Heal
		},
		"500ms latency": func(_ *redistest.Instance, p *faultproxy.Proxy) func() {
			p.SetLatency(500 * time.Millisecond)
			return p.Heal
		},
	}
	for name, fault := range faults {
		t.Run(name, func(t *testing.T) {
			in := redistest.Server(t)
			p := faultproxy.New(t, in.Addr)
			s := openWith(t, region.Options{Breaker: region.BreakerOptions{Disabled: true}}, p.Addr)
			takeOK(t, s, "rl:{warm}:x")
			undo := fault(in, p)
			var worst time.Duration
			for range 30 {
				_, took, err := take(s, "rl:{a}:x")
				require.Error(t, err)
				worst = max(worst, took)
				assert.Less(t, took, timeout+margin)
			}
			t.Logf("%s: slowest of 30 failing calls %v (timeout %v)", name, worst, timeout)
			undo()
			takeOK(t, s, "rl:{a}:x")
		})
	}
}

// TestBreakerOpensFailsFastProbesAndCloses: a black-holed shard stalls
// the call in flight; the stall opens the breaker at once (one event, not
// one per call), later calls are refused without being sent, background
// probes fail while the fault lasts, and the first probe after healing
// closes the breaker without any request having waited for it.
func TestBreakerOpensFailsFastProbesAndCloses(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	p := faultproxy.New(t, in.Addr)
	s := openWith(t, region.Options{Breaker: shortBreaker}, p.Addr)
	var lost int64 // timed-out calls that may have run
	for range 5 {
		_, n := takeCounted(t, s, "rl:{a}:x")
		lost += n
	}
	require.Equal(t, region.BreakerClosed, s.Shards()[0].State)
	assert.False(t, degraded(s))

	p.BlackHole(true)
	_, took, err := take(s, "rl:{a}:x")
	require.ErrorIs(t, err, region.ErrStalled, "the black-holed call is given up as stalled")
	require.NotErrorIs(t, err, region.ErrUnavailable, "it was sent, and may have run")
	assert.Less(t, took, timeout+margin)
	h := s.Shards()
	require.Len(t, h, 1)
	assert.Equal(t, region.BreakerOpen, h[0].State, "one stall opens the breaker")
	assert.Equal(t, uint64(1), h[0].Openings)
	assert.True(t, degraded(s))
	lost++

	// Open: refused at once, nothing sent.
	for range 20 {
		_, took, err := take(s, "rl:{a}:x")
		require.ErrorIs(t, err, region.ErrUnavailable)
		assert.Less(t, took, margin)
	}
	// Background probes fail while the fault lasts; no request waits.
	require.Eventually(t, func() bool { return s.Shards()[0].ProbeFailures >= 2 }, 10*time.Second, 5*time.Millisecond)
	assert.NotEqual(t, region.BreakerClosed, s.Shards()[0].State)

	// Healed: a probe closes the breaker by itself, and counting goes on
	// from Redis's state (black-holed calls never reached Redis).
	p.Heal()
	require.Eventually(t, func() bool { return s.Shards()[0].State == region.BreakerClosed }, 10*time.Second, 5*time.Millisecond)
	assert.False(t, degraded(s))
	assert.Equal(t, uint64(1), s.Shards()[0].Openings, "closed by a probe, never re-opened")
	rem, n := takeCounted(t, s, "rl:{a}:x")
	lost += n
	assert.LessOrEqual(t, rem, int64(100-6), "5 warm-up takes and this one")
	assert.GreaterOrEqual(t, rem, 100-6-lost, "nothing black-holed counted")
}

func TestFailuresInARowOpen(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	p := faultproxy.New(t, in.Addr)
	s := openWith(t, region.Options{Breaker: shortBreaker}, p.Addr)
	for range 100 {
		takeOK(t, s, "rl:{a}:x")
	}
	p.Cut()
	for i := range region.DefaultBreakerFailures {
		_, _, err := take(s, "rl:{a}:x")
		require.Error(t, err)
		require.NotErrorIs(t, err, region.ErrUnavailable, "failure %d was sent", i+1)
	}
	_, _, err := take(s, "rl:{a}:x")
	require.ErrorIs(t, err, region.ErrUnavailable, "open after 10 failures in a row")
}

// After a freeze (SIGSTOP) the node resumes without a restart. Calls that
// timed out during the freeze may still run when Redis resumes (they sit
// in its socket buffer): they count, which errs on the side of counting
// too much, never too little.
func TestRecoversAfterFreeze(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	s := openWith(t, region.Options{Breaker: shortBreaker}, in.Addr)
	var lost int64 // warm-up calls that timed out on a loaded machine may have run
	for range 3 {
		_, n := takeCounted(t, s, "rl:{a}:x")
		lost += n
	}
	in.Pause()
	sent := 0
	for range 20 {
		_, took, err := take(s, "rl:{a}:x")
		require.Error(t, err)
		assert.Less(t, took, timeout+margin)
		if !errors.Is(err, region.ErrUnavailable) {
			sent++
		}
	}
	require.Equal(t, region.BreakerOpen, s.Shards()[0].State)
	in.Continue()
	rem, n := takeCounted(t, s, "rl:{a}:x")
	assert.LessOrEqual(t, rem, int64(100-4))
	assert.GreaterOrEqual(t, rem, int64(100-4-sent)-n-lost, "at most the %d calls sent during the freeze (and %d after, %d before) also counted", sent, n, lost)
	assert.Equal(t, region.BreakerClosed, s.Shards()[0].State)
}

// After a restart (or a failover to a replica) the script cache is empty:
// EVALSHA answers NOSCRIPT and the store reloads the script by EVAL.
func TestRecoversAfterRestartWithEmptyScriptCache(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	s := openWith(t, region.Options{Breaker: shortBreaker}, in.Addr)
	takeOK(t, s, "rl:{a}:x")
	in.Kill()
	for range 10 {
		_, took, err := take(s, "rl:{a}:x")
		require.Error(t, err)
		assert.Less(t, took, timeout+margin)
	}
	assert.Equal(t, region.BreakerOpen, s.Shards()[0].State)
	in.Restart()
	c := redis.NewClient(&redis.Options{Addr: in.Addr})
	defer c.Close()
	exists, err := c.ScriptExists(context.Background(), lua.Check.Hash(), lua.CheckTB.Hash()).Result()
	require.NoError(t, err)
	require.Equal(t, []bool{false, false}, exists, "a restarted Redis has no scripts")

	// Data is lost with the process (no persistence): a fresh bucket, and
	// each take counts once (plus timed-out calls that may have run).
	rem, n := takeCounted(t, s, "rl:{a}:x")
	assert.LessOrEqual(t, rem, int64(99))
	assert.GreaterOrEqual(t, rem, 99-n)
	rem2, n := takeCounted(t, s, "rl:{a}:x")
	assert.LessOrEqual(t, rem2, rem-1)
	assert.GreaterOrEqual(t, rem2, rem-1-n)
	assert.Equal(t, region.BreakerClosed, s.Shards()[0].State)
}

// In a cluster each master has its own breaker: one frozen shard fails
// fast while the others keep counting.
func TestClusterBreakerIsPerShard(t *testing.T) {
	redistest.Require(t)
	addrs := redistest.Cluster(t, 3)
	probe := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer probe.Close()
	ctx := context.Background()
	// Find keys on two different masters.
	byMaster := map[string]string{}
	for i := 0; len(byMaster) < 3; i++ {
		key := "rl:{k" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "}:x"
		m, err := probe.MasterForKey(ctx, key)
		require.NoError(t, err)
		if _, ok := byMaster[m.Options().Addr]; !ok {
			byMaster[m.Options().Addr] = key
		}
	}
	var bad string
	for a := range byMaster {
		bad = a
		break
	}
	p := faultproxy.New(t, bad)
	var d net.Dialer
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == bad {
			addr = p.Addr
		}
		return d.DialContext(ctx, network, addr)
	}
	s := openWith(t, region.Options{Breaker: shortBreaker, Dialer: dial}, addrs...)
	for _, key := range byMaster {
		takeOK(t, s, key)
	}
	p.BlackHole(true)
	require.Eventually(t, func() bool {
		_, _, err := take(s, byMaster[bad])
		return errors.Is(err, region.ErrUnavailable)
	}, 10*time.Second, time.Millisecond)
	for addr, key := range byMaster {
		if addr == bad {
			continue
		}
		_, _, err := take(s, key)
		assert.NoError(t, err, "shard %s is healthy", addr)
	}
	for _, h := range s.Shards() {
		if h.Shard == bad {
			// Open, or half-open if a probe (due 50 ms after opening) is
			// out while the healthy shards were checked: not closed.
			assert.NotEqual(t, region.BreakerClosed, h.State, h.Shard)
			continue
		}
		assert.Equal(t, region.BreakerClosed, h.State, h.Shard)
	}
	p.Heal()
	takeOK(t, s, byMaster[bad])
	assert.False(t, degraded(s))
}

// A Redis that pauses (SIGSTOP, then SIGCONT) answers the pipeline judged
// stalled once it runs again; that answer closes the breaker, without
// waiting for a probe (here 10 s away, longer than the test waits).
func TestAPausedShardsLateAnswerClosesItsBreaker(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	slowProbe := region.BreakerOptions{ProbeAfter: 10 * time.Second, MaxOpen: 10 * time.Second}
	s := openWith(t, region.Options{Breaker: slowProbe}, in.Addr)
	takeOK(t, s, "rl:{a}:x")
	in.Pause()
	_, _, err := take(s, "rl:{a}:x")
	require.ErrorIs(t, err, region.ErrStalled)
	require.Equal(t, region.BreakerOpen, s.Shards()[0].State)
	_, _, err = take(s, "rl:{a}:x")
	require.ErrorIs(t, err, region.ErrUnavailable, "open: refused without a send")
	in.Continue()
	require.Eventually(t, func() bool { return s.Shards()[0].State == region.BreakerClosed },
		5*time.Second, 5*time.Millisecond, "the stalled pipeline's answer closes the breaker")
	assert.Equal(t, uint64(1), s.Shards()[0].Openings)
	takeOK(t, s, "rl:{a}:x")
}
