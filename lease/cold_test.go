package lease

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With ColdExact (and ColdHits 2) a key not seen within half its lease
// TTL is sent to the exact path (nothing taken, no lease call); a key
// checked again within that time leases as usual; a global-scope limit
// alike (its exact checks report their demand through decide).
func TestColdKeysGoExact(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	m, err := New(Options{Source: src, Clock: clk, SweepEvery: -1, ColdExact: true, Defaults: Config{ColdHits: 2}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	cfg := Config{TargetPeriod: time.Second, TTL: 2 * time.Second}
	lim := newLimit(t, m, spec(100, time.Second, 100), cfg, false)
	ctx := context.Background()
	take := func(l *Limit, subj string) Result {
		r, err := m.Take(ctx, l, []byte(subj), 1)
		require.NoError(t, err)
		return r
	}

	r := take(lim, "k")
	assert.True(t, r.Exact, "first sight: exact")
	assert.False(t, r.Allowed)
	assert.Zero(t, m.Stats().Calls, "no lease call for a cold key")

	clk.Advance(500 * time.Millisecond) // within TTL/2 of the last sight
	r = take(lim, "k")
	assert.False(t, r.Exact, "seen again soon: leased")
	assert.True(t, r.Allowed)
	waitIdle(t, m)
	assert.Positive(t, m.Stats().Calls)

	// Quiet for longer than half the TTL after its last lease: cold again.
	clk.Advance(3 * time.Second)
	r = take(lim, "k")
	assert.True(t, r.Exact, "quiet past TTL/2 since the last lease: exact")
	assert.Equal(t, int64(2), m.Stats().Exact)

	// Slower than one check per TTL/2, it stays exact.
	clk.Advance(1500 * time.Millisecond)
	assert.True(t, take(lim, "k").Exact)

	glob := newLimit(t, m, spec(100, time.Second, 100), cfg, true)
	assert.True(t, take(glob, "g").Exact, "a cold global key: exact")
	clk.Advance(500 * time.Millisecond)
	r = take(glob, "g")
	assert.False(t, r.Exact, "a global key seen again soon: leased")
	assert.True(t, r.Allowed)

	// A cold key's entry is evicted like an idle one.
	waitIdle(t, m)
	clk.Advance(time.Minute)
	m.Sweep()
	assert.Zero(t, m.Stats().Keys)
}

// A paced key whose pace outlasts half its TTL (target period = TTL) is
// still hot when the pace ends: it leases, it is not sent to the exact
// path. The bucket is contended (a lone node's pace is a quarter period).
func TestPacedKeyIsNotCold(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	src.rival = 2
	m, err := New(Options{Source: src, Clock: clk, SweepEvery: -1, ColdExact: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	lim := newLimit(t, m, spec(200, time.Second, 200), Config{TargetPeriod: time.Second, TTL: time.Second}, false)
	ctx := context.Background()
	subj := []byte("hot")
	var r Result
	for range 5000 {
		r, err = m.Take(ctx, lim, subj, 1)
		require.NoError(t, err)
		if !r.Allowed && !r.Exact && r.RetryAfter > lim.cfg.TTL/2 {
			break // paced for longer than TTL/2
		}
		waitIdle(t, m)
	}
	require.Greater(t, r.RetryAfter, lim.cfg.TTL/2, "the key got paced")
	exact := m.Stats().Exact
	clk.Advance(r.RetryAfter)
	r, err = m.Take(ctx, lim, subj, 1)
	require.NoError(t, err)
	assert.False(t, r.Exact, "a key at the end of its pace leases")
	assert.Equal(t, exact, m.Stats().Exact)
}

// At ColdHits 4 (4 Takes in a window of half the TTL) a key checked 2.5
// times a second never leases, however long it runs; one checked 4 times
// a second leases at its fourth Take, and stays leased.
func TestColdKeyNeedsHitsToLease(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	m, err := New(Options{Source: src, Clock: clk, SweepEvery: -1, ColdExact: true, Defaults: Config{ColdHits: 4}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	lim := newLimit(t, m, spec(100, time.Second, 100), Config{TargetPeriod: time.Second, TTL: 2 * time.Second}, false)
	ctx := context.Background()
	take := func(subj string) Result {
		r, err := m.Take(ctx, lim, []byte(subj), 1)
		require.NoError(t, err)
		waitIdle(t, m)
		return r
	}
	for i := range 20 {
		assert.True(t, take("slow").Exact, "take %d at 2.5/s", i)
		clk.Advance(400 * time.Millisecond)
	}
	assert.Zero(t, m.Stats().Calls, "no lease call for the slow key")
	for i := range 3 {
		assert.True(t, take("fast").Exact, "take %d at 4/s", i)
		clk.Advance(250 * time.Millisecond)
	}
	for i := range 20 {
		r := take("fast")
		assert.False(t, r.Exact, "take %d at 4/s after three", 3+i)
		assert.True(t, r.Allowed)
		clk.Advance(250 * time.Millisecond)
	}
	assert.Positive(t, m.Stats().Calls)
	_, err = New(Options{Source: src, Defaults: Config{ColdHits: 256}})
	assert.ErrorContains(t, err, "cold hits 256 out of range")
}

// At the default (DefaultColdHits, 16 Takes in half a 2 s TTL) a key at
// 10 checks a second, like thousands of warm tenants that leasing cannot
// help, is always decided exactly; one at 20 a second leases at its 16th.
func TestDefaultColdHitsLeaveWarmKeysExact(t *testing.T) {
	clk := NewManualClock()
	src := newFake(clk)
	m, err := New(Options{Source: src, Clock: clk, SweepEvery: -1, ColdExact: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	lim := newLimit(t, m, spec(1000, time.Second, 1000), Config{TargetPeriod: time.Second, TTL: 2 * time.Second}, false)
	ctx := context.Background()
	take := func(subj string) Result {
		r, err := m.Take(ctx, lim, []byte(subj), 1)
		require.NoError(t, err)
		waitIdle(t, m)
		return r
	}
	for i := range 100 {
		assert.True(t, take("warm").Exact, "take %d at 10/s", i)
		clk.Advance(100 * time.Millisecond)
	}
	assert.Zero(t, m.Stats().Calls, "no lease call for a key at 10/s")
	for i := range DefaultColdHits - 1 {
		assert.True(t, take("hot").Exact, "take %d at 20/s", i)
		clk.Advance(50 * time.Millisecond)
	}
	assert.False(t, take("hot").Exact, "the 16th take at 20/s leases")
	assert.Positive(t, m.Stats().Calls)
}

// ColdHits is a limit's knob (a policy's or the file's lease: block):
// under one manager, a limit at 2 leases at its second Take while one at
// the manager's default of 16 stays exact.
func TestColdHitsPerLimit(t *testing.T) {
	clk := NewManualClock()
	m, err := New(Options{Source: newFake(clk), Clock: clk, SweepEvery: -1, ColdExact: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	eager := newLimit(t, m, spec(100, time.Second, 100), Config{ColdHits: 2}, false)
	deflt := newLimit(t, m, spec(100, time.Second, 100), Config{}, false)
	assert.Equal(t, 2, eager.Config().ColdHits)
	assert.Equal(t, DefaultColdHits, deflt.Config().ColdHits)
	take := func(lim *Limit, subj string) Result {
		r, err := m.Take(context.Background(), lim, []byte(subj), 1)
		require.NoError(t, err)
		waitIdle(t, m)
		return r
	}
	assert.True(t, take(eager, "a").Exact, "first take")
	assert.False(t, take(eager, "a").Exact, "second take: warm at 2")
	for i := range 5 {
		assert.True(t, take(deflt, "b").Exact, "take %d under the default", i)
	}

	for _, bad := range []int{-1, MaxColdHits + 1} {
		c := Defaults()
		c.ColdHits = bad
		assert.ErrorContains(t, c.Validate(), "cold hits", bad)
	}
}
