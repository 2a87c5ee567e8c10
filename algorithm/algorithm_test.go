package algorithm_test

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
)

const sec = int64(time.Second / time.Microsecond)

// t0 is a window boundary for every period used here (a whole day).
const t0 = 1_700_006_400 * sec

func spec(a algorithm.Algorithm, limit int64, period time.Duration, burst int64) algorithm.Spec {
	return algorithm.Spec{Algorithm: a, Limit: limit, Period: period, Burst: burst}
}

// key is one key of an in-memory store: Decide, and keep Next if taken.
type key struct {
	s  algorithm.Spec
	st algorithm.State
}

func (k *key) take(now, cost int64) (bool, algorithm.ItemResult) {
	d := algorithm.Decide(k.s, k.st, now, cost)
	if d.OK {
		k.st = d.Next
	}
	return d.OK, d.Result(d.OK)
}

func (k *key) refund(now, cost int64) {
	if next, _, ok := algorithm.Refund(k.s, k.st, now, cost); ok {
		k.st = next
	}
}

func TestParseNamesAndLeasable(t *testing.T) {
	// name -> {leasable, windowed}
	cases := map[string][2]bool{
		"token_bucket":           {true, false},
		"gcra":                   {false, false}, // a bucket, but lease.lua keeps token-bucket state only
		"sliding_window_log":     {false, true},
		"sliding_window_counter": {false, true},
		"fixed_window":           {false, true},
	}
	for name, want := range cases {
		a, err := algorithm.Parse(name)
		require.NoError(t, err, name)
		assert.Equal(t, name, a.String())
		assert.NotEmpty(t, a.Code())
		assert.Equal(t, want[0], a.Leasable(), name)
		assert.Equal(t, want[1], a.Windowed(), name)
	}
	_, err := algorithm.Parse("leaky_bucket")
	assert.ErrorContains(t, err, "unknown algorithm")
}

func TestValidate(t *testing.T) {
	ok := []algorithm.Spec{
		spec(algorithm.TokenBucket, 5, time.Second, 10),
		spec(algorithm.GCRA, 1_000_000, time.Second, 5),
		spec(algorithm.SlidingWindowLog, algorithm.MaxLogLimit, time.Minute, 0),
		spec(algorithm.SlidingWindowCounter, 1<<40, time.Minute, 1<<40),
		spec(algorithm.FixedWindow, 1000, 24*time.Hour, 0),
	}
	for _, s := range ok {
		assert.NoError(t, s.Validate(), "%+v", s)
	}
	for want, s := range map[string]algorithm.Spec{
		"limit 10001 is above 10000":       spec(algorithm.SlidingWindowLog, 10_001, time.Minute, 0),
		"has no burst":                     spec(algorithm.FixedWindow, 10, time.Minute, 20),
		"faster than that":                 spec(algorithm.GCRA, 1_000_001, time.Second, 0),
		"too long":                         spec(algorithm.GCRA, 1, 366*24*time.Hour, 1<<40),
		"whole number of milliseconds":     spec(algorithm.TokenBucket, 1, 1500*time.Microsecond, 0),
		"unknown algorithm":                {Limit: 1, Period: time.Second},
		"limit 0 must be positive":         spec(algorithm.GCRA, 0, time.Second, 0),
		"burst -1 must not be negative":    spec(algorithm.TokenBucket, 1, time.Second, -1),
		"sliding_window_counter counts at": spec(algorithm.SlidingWindowCounter, 10, time.Minute, 11),
	} {
		err := s.Validate()
		require.Error(t, err, want)
		assert.Contains(t, err.Error(), want)
	}
}

// GCRA spaces requests T = period/limit apart and lets Burst through at
// once.
func TestGCRASpacingAndBurst(t *testing.T) {
	k := &key{s: spec(algorithm.GCRA, 10, time.Second, 3)} // T = 100ms, τ = 300ms
	for i := range 3 {
		ok, r := k.take(t0, 1)
		require.True(t, ok, "burst take %d", i)
		assert.EqualValues(t, 2-i, r.Remaining)
		assert.Equal(t, time.Duration(i+1)*100*time.Millisecond, r.ResetAfter)
	}
	ok, r := k.take(t0, 1)
	require.False(t, ok)
	assert.Equal(t, 100*time.Millisecond, r.RetryAfter)
	assert.Equal(t, 300*time.Millisecond, r.ResetAfter)

	ok, _ = k.take(t0+100*ms-1, 1)
	assert.False(t, ok, "1µs early")
	ok, _ = k.take(t0+100*ms, 1)
	assert.True(t, ok, "exactly T later")

	// Steady state: one per T, never two.
	for i := int64(2); i < 50; i++ {
		ok, _ = k.take(t0+i*100*ms, 1)
		require.True(t, ok, "take at %d·T", i)
		ok, _ = k.take(t0+i*100*ms+50*ms, 1)
		require.False(t, ok, "take at %d.5·T", i)
	}
	ok, r = k.take(t0, 4)
	assert.False(t, ok)
	assert.Equal(t, algorithm.Never, r.RetryAfter, "cost above burst")

	// T rounds up to whole µs (3/s → 333334µs), and a full burst at one
	// instant still passes: the maths is integer, no float drift.
	k = &key{s: spec(algorithm.GCRA, 3, time.Second, 3)}
	for i := range 3 {
		ok, _ := k.take(t0, 1)
		require.True(t, ok, "take %d", i)
	}
	ok, r = k.take(t0, 1)
	require.False(t, ok)
	assert.Equal(t, 333334*time.Microsecond, r.RetryAfter)
}

const ms = int64(time.Millisecond / time.Microsecond)

// The token bucket and GCRA make the same decisions when T is whole
// microseconds: GCRA is the bucket kept as one timestamp. Remaining may
// differ by one: the bucket's float tokens drift (1.9999999999999973
// where 2 are due), GCRA's integer TAT does not.
func TestGCRAMatchesTokenBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tb := &key{s: spec(algorithm.TokenBucket, 4, time.Second, 6)}
	g := &key{s: spec(algorithm.GCRA, 4, time.Second, 6)}
	now := t0
	for i := range 2000 {
		now += rng.Int64N(400) * ms
		cost := rng.Int64N(4)
		okT, rT := tb.take(now, cost)
		okG, rG := g.take(now, cost)
		require.Equal(t, okT, okG, "step %d", i)
		require.InDelta(t, rG.Remaining, rT.Remaining, 1, "step %d", i)
		require.GreaterOrEqual(t, rG.Remaining, rT.Remaining, "step %d", i)
		require.InDelta(t, rT.RetryAfter, rG.RetryAfter, float64(time.Microsecond), "step %d", i)
	}
}

// The log admits exactly: never more than Limit in any window of length
// Period, and every denial is one that admitting would have broken.
func TestSlidingLogExact(t *testing.T) {
	const limit, w = 5, 10 * sec
	k := &key{s: spec(algorithm.SlidingWindowLog, limit, 10*time.Second, 0)}
	rng := rand.New(rand.NewPCG(3, 4))
	var admitted []int64 // one timestamp per token
	inWindow := func(now int64) int64 {
		n := int64(0)
		for _, ts := range admitted {
			if ts > now-w {
				n++
			}
		}
		return n
	}
	now := t0
	for i := range 3000 {
		now += rng.Int64N(3 * sec)
		cost := 1 + rng.Int64N(2)
		n := inWindow(now)
		ok, r := k.take(now, cost)
		require.Equal(t, n+cost <= limit, ok, "step %d: %d in window, cost %d", i, n, cost)
		if ok {
			for range cost {
				admitted = append(admitted, now)
			}
			require.EqualValues(t, limit-n-cost, r.Remaining)
		} else {
			require.EqualValues(t, limit-n, r.Remaining)
			// At retry it fits, 1µs before it does not.
			at := now + r.RetryAfter.Microseconds()
			assert.LessOrEqual(t, inWindow(at)+cost, int64(limit), "step %d: retry too early", i)
			assert.Greater(t, inWindow(at-1)+cost, int64(limit), "step %d: retry too late", i)
		}
	}
	// Any window (a, a+w] holds at most limit: check at every admission.
	for _, a := range admitted {
		n := 0
		for _, ts := range admitted {
			if ts > a-w && ts <= a {
				n++
			}
		}
		require.LessOrEqual(t, n, limit)
	}
}

func TestSlidingLogBoundary(t *testing.T) {
	k := &key{s: spec(algorithm.SlidingWindowLog, 3, 10*time.Second, 0)}
	for _, at := range []int64{0, sec, 2 * sec} {
		ok, _ := k.take(t0+at, 1)
		require.True(t, ok)
	}
	ok, r := k.take(t0+10*sec-1, 1)
	require.False(t, ok)
	assert.Equal(t, time.Microsecond, r.RetryAfter, "the first entry leaves at t0+10s")
	assert.Equal(t, 2*time.Second+time.Microsecond, r.ResetAfter)
	ok, r = k.take(t0+10*sec, 1)
	require.True(t, ok, "(t0+10s − 10s, t0+10s] no longer holds t0")
	assert.EqualValues(t, 0, r.Remaining)
	assert.Equal(t, 10*time.Second, r.ResetAfter)
	ok, r = k.take(t0+10*sec, 2)
	require.False(t, ok)
	assert.Equal(t, 2*time.Second, r.RetryAfter, "two must leave: t0+1s and t0+2s")

	// Refund removes the newest entry: the slot is free again at once.
	k.refund(t0+10*sec, 1)
	ok, _ = k.take(t0+10*sec, 1)
	assert.True(t, ok)
}

// The seed's worked example: w = 60s, e = 15s, n_prev = 80, n_curr = 30
// gives 30 + 80·0.75 = 90, so a limit of 100 allows 10 more.
func TestSlidingCounterWorkedExample(t *testing.T) {
	s := spec(algorithm.SlidingWindowCounter, 100, time.Minute, 0)
	w := 60 * sec
	idx := t0 / w
	st := algorithm.State{Algorithm: algorithm.SlidingWindowCounter,
		Counter: algorithm.CounterState{Win: idx, Curr: 30, Prev: 80, Valid: true}}
	now := idx*w + 15*sec

	d := algorithm.Decide(s, st, now, 10)
	require.True(t, d.OK)
	assert.EqualValues(t, 10, d.Kept.Remaining, "100 − 90")
	assert.EqualValues(t, 0, d.Taken.Remaining)
	assert.Equal(t, 2*time.Minute-15*time.Second, d.Taken.ResetAfter)

	d = algorithm.Decide(s, st, now, 11)
	require.False(t, d.OK)
	// 30 + 80·(60−e')/60 = 89 ⇔ e' = 15.75s: 750ms from now.
	assert.Equal(t, 750*time.Millisecond, d.Kept.RetryAfter)
	assert.True(t, algorithm.Decide(s, st, now+750*ms, 11).OK)
	assert.False(t, algorithm.Decide(s, st, now+750*ms-1, 11).OK)

	// The same state one window earlier: curr 30 rolls over to prev.
	old := st
	old.Counter.Win = idx - 1
	d = algorithm.Decide(s, old, now, 0)
	assert.EqualValues(t, 77, d.Kept.Remaining, "⌊100 − (0 + 30·0.75)⌋ = ⌊77.5⌋")
	old.Counter.Win = idx - 2
	assert.EqualValues(t, 100, algorithm.Decide(s, old, now, 0).Kept.Remaining, "both windows gone")

	// Curr alone over: wait for the next window, where 95·(60−e'')/60 <= 90.
	full := st
	full.Counter.Curr, full.Counter.Prev = 95, 0
	d = algorithm.Decide(s, full, now, 10)
	require.False(t, d.OK)
	wait := 45*time.Second + time.Duration(60*5*time.Second/95)
	assert.InDelta(t, wait, d.Kept.RetryAfter, float64(time.Microsecond))
}

// The fixed window's known weakness: Limit at the end of one window and
// Limit again at the start of the next, 2·Limit within 2ms.
func TestFixedWindowDoubleAtBoundary(t *testing.T) {
	k := &key{s: spec(algorithm.FixedWindow, 5, time.Minute, 0)}
	end := t0 + time.Minute.Microseconds()
	for i := range 5 {
		ok, r := k.take(end-ms, 1)
		require.True(t, ok, i)
		assert.Equal(t, time.Millisecond, r.ResetAfter)
	}
	ok, r := k.take(end-ms, 1)
	require.False(t, ok)
	assert.Equal(t, time.Millisecond, r.RetryAfter, "the window ends in 1ms")
	for i := range 5 {
		ok, r := k.take(end+ms, 1)
		require.True(t, ok, "second burst %d", i)
		assert.EqualValues(t, 4-i, r.Remaining)
	}
	ok, r = k.take(end+ms, 1)
	require.False(t, ok)
	assert.Equal(t, time.Minute-time.Millisecond, r.RetryAfter)

	// Refund gives back within the window, not after it.
	k.refund(end+2*ms, 2)
	ok, r = k.take(end+2*ms, 2)
	assert.True(t, ok)
	assert.EqualValues(t, 0, r.Remaining)
	k.refund(end+time.Minute.Microseconds(), 5)
	assert.EqualValues(t, 5, k.st.Window.Count, "a past window's refund changes nothing")
}

func TestRefunds(t *testing.T) {
	// GCRA: refund moves TAT back by cost·T.
	g := &key{s: spec(algorithm.GCRA, 10, time.Second, 5)}
	g.take(t0, 3)
	g.refund(t0, 2)
	assert.Equal(t, t0+100*ms, g.st.GCRA.TAT)
	g.refund(t0, 5)
	assert.Equal(t, t0, g.st.GCRA.TAT, "not before now")

	// Counter: from this window first, then the previous one.
	c := &key{s: spec(algorithm.SlidingWindowCounter, 100, time.Minute, 0)}
	c.take(t0, 7)
	c.refund(t0+time.Minute.Microseconds(), 3) // the window turned: 7 is prev
	assert.Equal(t, algorithm.CounterState{Win: t0/(60*sec) + 1, Curr: 0, Prev: 4, Valid: true}, c.st.Counter)

	// Nothing to refund on a missing key.
	_, _, ok := algorithm.Refund(spec(algorithm.FixedWindow, 1, time.Second, 0), algorithm.State{}, t0, 1)
	assert.False(t, ok)
}

// A state of another algorithm (the policy changed) is a fresh key.
func TestAlgorithmChangeStartsFresh(t *testing.T) {
	fw := &key{s: spec(algorithm.FixedWindow, 2, time.Minute, 0)}
	fw.take(t0, 2)
	d := algorithm.Decide(spec(algorithm.GCRA, 2, time.Minute, 0), fw.st, t0, 2)
	assert.True(t, d.OK)
	assert.Equal(t, algorithm.GCRA, d.Next.Algorithm)
}

func TestTTLUpperBounds(t *testing.T) {
	for _, tc := range []struct {
		s    algorithm.Spec
		want time.Duration
	}{
		{spec(algorithm.TokenBucket, 100, time.Second, 50), 1500 * time.Millisecond},
		{spec(algorithm.GCRA, 3, time.Second, 0), 2001 * time.Millisecond}, // 3 × 333334µs
		{spec(algorithm.SlidingWindowLog, 5, time.Minute, 0), time.Minute + time.Second},
		{spec(algorithm.SlidingWindowCounter, 5, time.Minute, 0), 2*time.Minute + time.Second},
		{spec(algorithm.FixedWindow, 5, time.Hour, 0), time.Hour + time.Second},
	} {
		assert.Equal(t, tc.want, tc.s.TTL(), tc.s.Algorithm.String())
		// Every write's TTL is within the bound.
		for _, now := range []int64{t0, t0 + 1, t0 + 37*sec + 5} {
			d := algorithm.Decide(tc.s, algorithm.State{}, now, 1)
			require.True(t, d.OK)
			assert.LessOrEqual(t, d.TTL, tc.s.TTL(), tc.s.Algorithm.String())
			assert.Positive(t, d.TTL)
		}
	}
}

// FuzzDecide: any valid spec, any sequence of times and costs: no panic,
// and the results stay within their definitions.
func FuzzDecide(f *testing.F) {
	f.Add(uint8(1), int64(10), int64(1000), int64(0), []byte{1, 2, 3, 200, 0, 7})
	f.Add(uint8(3), int64(3), int64(60000), int64(0), []byte{0, 0, 0, 0, 9, 9})
	f.Add(uint8(4), int64(100), int64(60000), int64(0), []byte{255, 1, 128, 5})
	f.Add(uint8(5), int64(5), int64(1), int64(0), []byte{1, 1, 1, 1, 1, 1, 1})
	f.Add(uint8(2), int64(1000), int64(1000), int64(7), []byte{3, 3, 3, 0, 0, 0})
	f.Fuzz(func(t *testing.T, a uint8, limit, periodMS, burst int64, steps []byte) {
		s := algorithm.Spec{Algorithm: algorithm.Algorithm(a%6 + 1), Limit: limit, Period: time.Duration(periodMS) * time.Millisecond, Burst: burst}
		if periodMS <= 0 || periodMS > 366*24*3600*1000 || limit > 1<<40 || burst > 1<<40 || s.Validate() != nil {
			t.Skip()
		}
		var st algorithm.State
		now := t0
		for i := 0; i+1 < len(steps); i += 2 {
			now += int64(steps[i]) * int64(steps[i]) * ms
			cost := int64(steps[i+1]) % 16
			if steps[i+1]&0x80 != 0 {
				if next, _, ok := algorithm.Refund(s, st, now, cost); ok {
					st = next
				}
				continue
			}
			d := algorithm.Decide(s, st, now, cost)
			for _, r := range []algorithm.ItemResult{d.Taken, d.Kept} {
				if r.Remaining < 0 || r.Remaining > s.Capacity() {
					t.Fatalf("remaining %d outside [0, %d]", r.Remaining, s.Capacity())
				}
				if r.RetryAfter < 0 && r.RetryAfter != algorithm.Never || r.ResetAfter < 0 {
					t.Fatalf("negative wait %+v", r)
				}
			}
			if d.OK != (d.Kept.RetryAfter == 0) {
				t.Fatalf("ok %v but retry %v", d.OK, d.Kept.RetryAfter)
			}
			if d.OK {
				if d.Taken.Remaining > d.Kept.Remaining {
					t.Fatalf("taking left more: %d > %d", d.Taken.Remaining, d.Kept.Remaining)
				}
				if d.TTL <= 0 || d.TTL > s.TTL() {
					t.Fatalf("ttl %v outside (0, %v]", d.TTL, s.TTL())
				}
				st = d.Next
			}
		}
		if strings.HasPrefix(s.Algorithm.String(), "algorithm(") {
			t.Fatal("unknown algorithm passed Validate")
		}
	})
}

func TestShareNeverAddsUpToMore(t *testing.T) {
	for _, c := range []struct {
		limit, burst int64
		n            int
	}{{300, 0, 3}, {100, 250, 3}, {10, 0, 4}, {2, 5, 3}, {1, 0, 3}, {7, 9, 1}} {
		s := algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: c.limit, Period: time.Second, Burst: c.burst}
		sh := s.Share(c.n)
		assert.Equal(t, s.Period, sh.Period)
		if c.n <= 1 {
			assert.Equal(t, s, sh)
			continue
		}
		assert.GreaterOrEqual(t, sh.Limit, int64(1))
		assert.GreaterOrEqual(t, sh.Capacity(), int64(1))
		if c.limit >= int64(c.n) {
			assert.LessOrEqual(t, sh.Limit*int64(c.n), s.Limit, "%+v", c)
		}
		if s.Capacity() >= int64(c.n) {
			assert.LessOrEqual(t, sh.Capacity()*int64(c.n), s.Capacity(), "%+v", c)
		}
	}
}
