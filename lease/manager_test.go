package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/ratelog"
)

func spec(limit int64, period time.Duration, burst int64) algorithm.Spec {
	return algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: limit, Period: period, Burst: burst}
}

func keyFn(suffix string) func(string) string {
	return func(subject string) string { return "rl:{" + subject + "}" + suffix }
}

func newManager(t testing.TB, src Source, c Clock) *Manager {
	t.Helper()
	m, err := New(Options{Source: src, Clock: c, SweepEvery: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

func newLimit(t testing.TB, m *Manager, s algorithm.Spec, cfg Config, global bool) *Limit {
	t.Helper()
	l, err := m.NewLimit(keyFn(":p:l"), s, cfg, global)
	require.NoError(t, err)
	return l
}

// waitIdle waits until no refill is queued or running.
func waitIdle(t testing.TB, m *Manager) {
	t.Helper()
	require.Eventually(t, func() bool {
		for i := range m.stripes {
			sh := &m.stripes[i]
			sh.mu.Lock()
			busy := sh.scheduled
			sh.mu.Unlock()
			if busy {
				return false
			}
		}
		return true
	}, 5*time.Second, 100*time.Microsecond)
}

func TestGrantSize(t *testing.T) {
	c := Defaults()
	for _, tc := range []struct {
		name           string
		rate           float64
		capacity, need int64
		want           int64
	}{
		{"cold key asks for its need", 0, 100, 1, 1},
		{"cold key, big cost", 0, 100, 7, 7},
		{"rate x period", 20, 100, 1, 20},
		{"capped at max share", 1000, 100, 1, 50},
		{"need beats the cap", 1000, 100, 80, 80},
		{"fractional rate rounds up", 0.3, 100, 0, 1},
		{"tiny bucket still grants one", 50, 1, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, GrantSize(tc.rate, c, tc.capacity, tc.need))
		})
	}
}

func TestEstimateRate(t *testing.T) {
	min := 100 * time.Millisecond
	assert.Equal(t, 100.0, EstimateRate(0, 100, time.Second, min), "a rise is followed at once")
	assert.Equal(t, 55.0, EstimateRate(100, 10, time.Second, min), "a fall halves the distance")
	assert.Equal(t, 10.0, EstimateRate(0, 1, time.Microsecond, min), "elapsed has a floor")
	assert.Equal(t, 0.0, EstimateRate(0, -5, time.Second, min))
}

func TestConfigValidate(t *testing.T) {
	assert.NoError(t, Defaults().Validate())
	bad := []Config{
		{TargetPeriod: time.Millisecond, TTL: time.Second, LowWatermark: 0.1, MaxShare: 0.5},
		{TargetPeriod: time.Second, TTL: 500 * time.Millisecond, LowWatermark: 0.1, MaxShare: 0.5},
		{TargetPeriod: time.Second, TTL: time.Second, LowWatermark: 1, MaxShare: 0.5},
		{TargetPeriod: time.Second, TTL: time.Second, LowWatermark: 0.1, MaxShare: 1.5},
	}
	for _, c := range bad {
		assert.Error(t, c.Validate(), "%+v", c)
	}
	assert.Equal(t, Defaults(), Config{}.Or(Defaults()))
}

func TestGenerations(t *testing.T) {
	var e held
	now := int64(1000)
	assert.Equal(t, int64(10), e.install(now, now+100, 10))
	tk, rest, ok := e.take(now, 4)
	require.True(t, ok)
	assert.Equal(t, int64(6), rest)
	// A refill moves the 6 left into the old generation with the old expiry.
	assert.Equal(t, int64(16), e.install(now+50, now+150, 10))
	assert.Equal(t, now+100, e.oldExp.Load())
	assert.Equal(t, now+150, e.curExp.Load())
	// Old tokens go first.
	tk2, _, ok := e.take(now+60, 7)
	require.True(t, ok)
	o, c := unpack(e.gens.Load())
	assert.Equal(t, [2]int64{0, 9}, [2]int64{o, c})
	assert.Equal(t, now+100, tk2.exp, "a take touching old expires with old")
	// After the old expiry only cur is live.
	_, rest, ok = e.take(now+100, 10)
	assert.False(t, ok)
	assert.Equal(t, int64(9), rest)
	// A give-back of tokens expiring at now+100 cannot go into cur (which
	// lives longer): dropped.
	assert.False(t, e.give(now+100, tk2))
	// One expiring with cur can.
	assert.True(t, e.give(now+100, ticket{n: 4, exp: now + 150}))
	_, rest, _ = e.take(now+100, 0)
	assert.Equal(t, int64(13), rest)
	_ = tk
	// At cur's expiry nothing is live.
	_, rest, ok = e.take(now+150, 1)
	assert.False(t, ok)
	assert.Zero(t, rest)
}

func TestTakeLeasesAndDecidesLocally(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	m := newManager(t, src, clk)
	lim := newLimit(t, m, spec(100, time.Second, 100), Config{}, false)
	ctx := context.Background()
	subj := []byte("tenant=a")

	r, err := m.Take(ctx, lim, subj, 1)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.Equal(t, int64(100), r.Limit)
	waitIdle(t, m)
	// Drive the key at 50/s for a few seconds: grants grow to rate x period.
	admitted := 0
	for range 200 {
		clk.Advance(20 * time.Millisecond)
		r, err := m.Take(ctx, lim, subj, 1)
		require.NoError(t, err)
		if r.Allowed {
			admitted++
		}
		waitIdle(t, m)
	}
	assert.Equal(t, 200, admitted)
	calls := src.calls
	assert.Less(t, calls, 40, "leases, not one call per decision")
	assert.LessOrEqual(t, r.Remaining, int64(100))
}

func TestDenyCacheSparesRedis(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	m := newManager(t, src, clk)
	lim := newLimit(t, m, spec(10, time.Second, 10), Config{}, false)
	ctx := context.Background()
	subj := []byte("tenant=flood")
	admitted := 0
	for range 1000 {
		r, err := m.Take(ctx, lim, subj, 1)
		require.NoError(t, err)
		if r.Allowed {
			admitted++
		} else {
			assert.Positive(t, r.RetryAfter)
		}
	}
	assert.Equal(t, 10, admitted, "the burst, then denials")
	assert.Less(t, src.calls, 15, "the flood is denied locally")
	// After the retry time the key is served again.
	clk.Advance(time.Second)
	r, err := m.Take(ctx, lim, subj, 1)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
}

func TestCostAboveCapacityNeverPasses(t *testing.T) {
	clk := NewManualClock()
	m := newManager(t, newFake(clk), clk)
	lim := newLimit(t, m, spec(10, time.Second, 10), Config{}, false)
	r, err := m.Take(context.Background(), lim, []byte("x"), 11)
	require.NoError(t, err)
	assert.False(t, r.Allowed)
	assert.Equal(t, algorithm.Never, r.RetryAfter)
}

func TestLeaseExpiryVoidsTokens(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	m := newManager(t, src, clk)
	lim := newLimit(t, m, spec(1000, time.Second, 1000), Config{TTL: 2 * time.Second}, false)
	ctx := context.Background()
	subj := []byte("k")
	_, err := m.Take(ctx, lim, subj, 1)
	require.NoError(t, err)
	waitIdle(t, m)
	e := m.stripes[0].table.Load() // find the entry the slow way
	_ = e
	h := lim.mix ^ hashOf(m, subj)
	ent := m.stripes[h>>(64-stripeBits)].table.Load().find(h, lim, subj)
	require.NotNil(t, ent)
	hd := ent.held.Load()
	require.NotNil(t, hd)
	_, before, _ := hd.take(clk.Now(), 0)
	require.Positive(t, before)
	clk.Advance(2 * time.Second)
	_, after, _ := hd.take(clk.Now(), 0)
	assert.Zero(t, after, "tokens are void at the lease TTL")
}

func TestWaitersShareOneRefillAndErrorsSurface(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	src.gate = make(chan struct{})
	m := newManager(t, src, clk)
	lim := newLimit(t, m, spec(1000, time.Second, 1000), Config{}, false)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := m.Take(ctx, lim, []byte("same"), 1)
			assert.NoError(t, err)
			assert.True(t, r.Allowed)
		}()
	}
	// Release refills until every waiter is served.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	rounds := 0
loop:
	for {
		select {
		case src.gate <- struct{}{}:
			rounds++
		case <-done:
			break loop
		}
	}
	assert.LessOrEqual(t, rounds, 4, "concurrent misses coalesce")

	close(src.gate) // every later refill passes
	src.mu.Lock()
	src.fail = errors.New("redis down")
	src.mu.Unlock()
	_, err := m.Take(ctx, lim, []byte("other"), 1)
	assert.ErrorContains(t, err, "redis down")
}

func TestGiveBack(t *testing.T) {
	clk := NewManualClock()
	m := newManager(t, newFake(clk), clk)
	lim := newLimit(t, m, spec(10, time.Hour, 10), Config{MaxShare: 1}, false)
	ctx := context.Background()
	r1, err := m.Take(ctx, lim, []byte("a"), 5)
	require.NoError(t, err)
	waitIdle(t, m)
	r2, err := m.Take(ctx, lim, []byte("a"), 5)
	require.NoError(t, err)
	require.True(t, r2.Allowed)
	m.GiveBack(&r2)
	m.GiveBack(&r2) // twice is once
	r3, err := m.Take(ctx, lim, []byte("a"), 5)
	require.NoError(t, err)
	assert.True(t, r3.Allowed)
	_ = r1
}

func TestDrainDemandAndEviction(t *testing.T) {
	clk := NewManualClock()
	m := newManager(t, newFake(clk), clk)
	glob := newLimit(t, m, spec(5, time.Hour, 5), Config{}, true)
	ctx := context.Background()
	for range 8 {
		_, err := m.Take(ctx, glob, []byte("g"), 1)
		require.NoError(t, err)
	}
	got := map[string][2]int64{}
	m.DrainDemand(func(k string, a, d int64) { got[k] = [2]int64{a, d} })
	assert.Equal(t, map[string][2]int64{"rl:{g}:p:l": {5, 3}}, got)
	got = map[string][2]int64{}
	m.DrainDemand(func(k string, a, d int64) { got[k] = [2]int64{a, d} })
	assert.Empty(t, got)

	waitIdle(t, m)
	assert.Equal(t, 1, m.Stats().Keys)
	clk.Advance(2 * time.Hour)
	m.Sweep()
	assert.Equal(t, 0, m.Stats().Keys)
	// An evicted key comes back on its next request.
	r, err := m.Take(ctx, glob, []byte("g"), 1)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
}

// spentForty is a manager whose node spent 40 of a 100-token bucket on
// subject "c" (key rl:{c}:p:l) and holds the rest of its lease unspent.
func spentForty(t *testing.T) (*Manager, *fakeRegion, algorithm.Spec, *Limit) {
	t.Helper()
	clk := NewManualClock()
	src := newFake(clk)
	m, err := New(Options{Source: src, Clock: clk, SweepEvery: -1})
	require.NoError(t, err)
	s := spec(100, time.Hour, 100)
	lim := newLimit(t, m, s, Config{MaxShare: 1}, false)
	_, err = m.Take(context.Background(), lim, []byte("c"), 40)
	require.NoError(t, err)
	waitIdle(t, m) // the watermark refill may lease more, unspent
	return m, src, s, lim
}

func TestCloseReturnsUnspent(t *testing.T) {
	m, src, s, lim := spentForty(t)
	assert.LessOrEqual(t, src.tokens("rl:{c}:p:l", s), 60.0)
	require.NoError(t, m.Close(context.Background()))
	assert.InDelta(t, 60, src.tokens("rl:{c}:p:l", s), 0.01, "all unspent comes back at age 0; the 40 spent do not")
	_, err := m.Take(context.Background(), lim, []byte("c"), 1)
	assert.ErrorIs(t, err, ErrClosed)
}

func hashOf(m *Manager, subj []byte) uint64 {
	var h = mapBytes(m, subj)
	return h
}

// TestEntryStressConservation races takers, give-backs and installs on one
// entry: what was taken for good never exceeds what was granted, and
// nothing is taken after its generation's expiry. Run with -race.
func TestEntryStressConservation(t *testing.T) {
	var e held
	var now atomic64
	now.v.Store(1)
	var granted, kept atomic64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				n := now.v.Load()
				tk, _, ok := e.take(n, int64(1+g%3))
				if !ok {
					continue
				}
				require.Less(t, n, tk.exp, "took from an expired generation")
				if i%3 == 0 && e.give(n, tk) {
					continue
				}
				kept.v.Add(tk.n)
			}
		}()
	}
	for range 2000 {
		n := now.v.Add(10)
		e.install(n, n+100, 50)
		granted.v.Add(50)
	}
	close(stop)
	wg.Wait()
	_, rest, _ := e.take(now.v.Load(), 0)
	assert.LessOrEqual(t, kept.v.Load()+rest, granted.v.Load())
}

type atomic64 struct{ v atomicInt64 }

// slowSource answers every lease call after a delay, as a healthy Redis
// behind a busy node does.
type slowSource struct {
	*fakeRegion
	delay time.Duration
}

func (s slowSource) Lease(ctx context.Context, groups []Group) ([]Reply, error) {
	time.Sleep(s.delay) // the slowness under test, not synchronisation
	return s.fakeRegion.Lease(ctx, groups)
}

// TestSlowRefillIsWaitedFor: a waiting Take is served by the refill it
// joined, however long that round takes within the call timeout. A MaxWait
// of a few ms (the node once passed its 4 ms Redis budget) must not fail
// it with ErrWaitTimeout.
func TestSlowRefillIsWaitedFor(t *testing.T) {
	clk := NewManualClock()
	src := slowSource{newFake(clk), 30 * time.Millisecond}
	m, err := New(Options{Source: src, Clock: clk, SweepEvery: -1, MaxWait: 4 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	lim := newLimit(t, m, spec(1000, time.Second, 1000), Config{}, false)
	for i := range 3 {
		r, err := m.Take(context.Background(), lim, []byte("slow"+strconv.Itoa(i)), 1)
		require.NoError(t, err)
		assert.True(t, r.Allowed)
	}
}

// errUnavailable stands for region.ErrUnavailable, which the manager
// must pass on unchanged like any error of its Source.
var errUnavailable = errors.New("store unavailable (circuit breaker open)")

// A refill that fails because the store is unavailable (a sick shard,
// its breaker open) reaches every waiting Take wrapped, so that callers
// can tell it from a denial with errors.Is, and the warning about it is
// one message, which the rate-limited logger a node gives the manager
// (internal/ratelog) logs once per interval, not once per round.
func TestRefillErrorsKeepTheirCause(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	src.fail = fmt.Errorf("shard a: %w", errUnavailable)
	var logged bytes.Buffer
	log := ratelog.New(slog.New(slog.NewTextHandler(&logged, nil)), ratelog.DefaultEvery, nil)
	m, err := New(Options{Source: src, Clock: clk, SweepEvery: -1, Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	lim := newLimit(t, m, spec(100, time.Second, 100), Config{}, false)
	for i := range 20 {
		_, err := m.Take(context.Background(), lim, []byte("k"+strconv.Itoa(i)), 1)
		require.ErrorIs(t, err, errUnavailable)
	}
	assert.Equal(t, 1, strings.Count(logged.String(), "lease refill failed"), logged.String())
}

// A Take whose caller stops waiting for its refill fails with the
// caller's ctx error, marked as overload: the store did not fail.
func TestAbortedWaitIsOverload(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	src.gate = make(chan struct{})
	m := newManager(t, src, clk)
	lim := newLimit(t, m, spec(100, time.Second, 100), Config{}, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := m.Take(ctx, lim, []byte("k"), 1)
	require.ErrorIs(t, err, context.Canceled)
	var o interface{ Overloaded() bool }
	require.ErrorAs(t, err, &o)
	assert.True(t, o.Overloaded())
	close(src.gate)
}

// An entry is the memory of every tracked key, a held that of every
// leased one (BenchmarkMemoryPerKey): a field that grows either is a
// cost at a million keys.
func TestEntrySizes(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(entry{}), uintptr(48))
	assert.LessOrEqual(t, unsafe.Sizeof(held{}), uintptr(64))
}
