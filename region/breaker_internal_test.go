package region

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Unix(1_700_000_000, 0)

func testBreaker() *breaker {
	return newBreaker(BreakerOptions{Window: 10 * time.Second, Bucket: time.Second, FailureRatio: 0.5,
		MinRequests: 20, OpenFor: 5 * time.Second, OpenMin: 50 * time.Millisecond, Consecutive: 10}.withDefaults())
}

// A stall is one event, and it opens the breaker at once, however many
// calls it held: the breaker counts round trips, not calls.
func TestBreakerStallOpensAtOnce(t *testing.T) {
	b := testBreaker()
	for i := range 100 {
		b.success(t0.Add(time.Duration(i) * time.Millisecond))
	}
	require.True(t, b.stall(t0.Add(time.Second)))
	assert.Equal(t, BreakerOpen, b.state)
	assert.False(t, b.allow())
	assert.Equal(t, uint64(1), b.openings)
	assert.False(t, b.stall(t0.Add(time.Second)), "already open: a second stall is not a second opening")
	assert.Equal(t, uint64(1), b.openings)
}

func TestBreakerConsecutiveAndRatio(t *testing.T) {
	b := testBreaker()
	for i := range 100 {
		b.success(t0.Add(time.Duration(i) * time.Millisecond))
	}
	for i := range 9 {
		require.False(t, b.failure(t0.Add(time.Second+time.Duration(i)*time.Millisecond)), "failure %d", i+1)
	}
	b.success(t0.Add(1100 * time.Millisecond))
	for i := range 9 {
		require.False(t, b.failure(t0.Add(1200*time.Millisecond+time.Duration(i)*time.Millisecond)), "a success reset the run")
	}
	require.True(t, b.failure(t0.Add(1300*time.Millisecond)), "10 in a row")

	// Ratio: 20 round trips with 10 failed, not in a row.
	b = testBreaker()
	opened := false
	for i := range 20 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		if i%2 == 0 {
			b.success(now)
		} else {
			opened = b.failure(now)
		}
	}
	assert.True(t, opened, "50 %% of 20")
}

// Old buckets leave the window: failures 11 s ago do not count.
func TestBreakerWindowRolls(t *testing.T) {
	b := testBreaker()
	for i := range 9 {
		b.failure(t0.Add(time.Duration(i) * time.Millisecond))
	}
	b.success(t0.Add(10 * time.Millisecond))
	b.roll(t0.Add(11 * time.Second))
	r, f := b.counts()
	assert.Equal(t, uint32(0), r)
	assert.Equal(t, uint32(0), f)
}

// Probes back off: OpenMin, then doubling up to OpenFor; a success closes.
// A breaker that reopens within a window of closing continues the
// backoff; one that stayed closed a window starts again from OpenMin.
func TestBreakerProbeBackoff(t *testing.T) {
	b := testBreaker()
	now := t0
	b.stall(now)
	assert.False(t, b.probeDue(now.Add(49*time.Millisecond)))
	var waits []time.Duration
	for range 9 {
		at := b.nextProbe()
		waits = append(waits, at.Sub(now))
		now = at
		require.True(t, b.probeDue(now))
		assert.Equal(t, BreakerHalfOpen, b.state)
		assert.False(t, b.allow(), "half-open: requests are still refused (the probe is a PING)")
		b.probed(now, false)
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5000 * ms, 5000 * ms}, waits)
	assert.Equal(t, uint64(9), b.probeFailures)

	now = b.nextProbe()
	require.True(t, b.probeDue(now))
	b.probed(now, true)
	assert.Equal(t, BreakerClosed, b.state)
	assert.True(t, b.allow())

	// Reopened 1 s after closing: the next wait continues from 5 s.
	b.stall(now.Add(time.Second))
	assert.Equal(t, 5*time.Second, b.nextProbe().Sub(now.Add(time.Second)))
	at := b.nextProbe()
	b.probeDue(at)
	b.probed(at, true)
	// Closed for a whole window: back to OpenMin.
	later := at.Add(11 * time.Second)
	b.stall(later)
	assert.Equal(t, 50*time.Millisecond, b.nextProbe().Sub(later))
	assert.Equal(t, uint64(3), b.openings)
}

// Outcomes of calls sent before the breaker opened do not move it.
func TestBreakerIgnoresLateOutcomesWhileOpen(t *testing.T) {
	b := testBreaker()
	b.stall(t0)
	b.success(t0.Add(time.Millisecond))
	assert.Equal(t, BreakerOpen, b.state)
	assert.False(t, b.failure(t0.Add(2*time.Millisecond)))
	assert.Equal(t, uint64(1), b.openings)
}

// The runtime's scheduling-latency histogram is readable, and a wait for
// a CPU longer than any goroutine has had is not reported.
func TestSchedLagReadsTheRuntime(t *testing.T) {
	l := newSchedLag()
	l.recent(time.Now(), time.Hour, time.Second) // the history so far
	assert.False(t, l.recent(time.Now(), time.Hour, time.Second))
	assert.NotEmpty(t, l.prev, "the runtime reports %s", schedLatencies)
}

func TestParsePSI(t *testing.T) {
	v, ok := parsePSI("some avg10=96.26 avg60=95.16 avg300=87.60 total=1781600371\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	require.True(t, ok)
	assert.InDelta(t, 96.26, v.avg10, 1e-9)
	assert.Equal(t, 1781600371*time.Microsecond, v.total)
	for _, bad := range []string{"full avg10=1.00 total=5\n", "some avg10=1.00\n", "some total=5\n", "some avg10=x total=5\n", "some avg10=1 total=-5\n"} {
		_, ok = parsePSI(bad)
		assert.False(t, ok, "%q", bad)
	}
	p := &cpuPressure{read: func() (psi, bool) { return psi{avg10: 45}, true }}
	assert.True(t, p.contended(t0))
	p.read = func() (psi, bool) { return psi{avg10: 1}, true }
	assert.True(t, p.contended(t0.Add(psiReadEvery/2)), "read at most every psiReadEvery")
	assert.False(t, p.contended(t0.Add(psiReadEvery)))
}

// The PSI file is read at most every psiReadEvery, however often checks
// ask: reads closer than a jiffy make the kernel drop the waiting between
// them (psiReadEvery), for every reader of the machine.
func TestCPUPressureReadsAtMostEveryInterval(t *testing.T) {
	reads := 0
	p := &cpuPressure{read: func() (psi, bool) { reads++; return psi{}, true }}
	for i := range 100 { // a busy shard: a check every millisecond
		now := t0.Add(time.Duration(i) * time.Millisecond)
		p.sample(now)
		p.contended(now)
		_, _ = p.waited(now, 4*time.Millisecond)
	}
	assert.Equal(t, 5, reads, "100 ms of checks")
}

// waited judges the span from the newest sample back to the newest one
// at least psiReadEvery (or half the window) older: contended when tasks
// waited for a CPU a quarter of it or more; no sample recent enough says
// nothing.
func TestCPUPressureWaited(t *testing.T) {
	var total time.Duration
	reads := 0
	p := &cpuPressure{read: func() (psi, bool) { reads++; return psi{total: total}, true }}
	const window = 4 * time.Millisecond
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	waited := func(p *cpuPressure, now time.Time) bool { w, _ := p.waited(now, window); return w }
	assert.False(t, waited(p, at(0)), "one sample: nothing to compare")

	total += 10 * time.Millisecond // waited half of the next 20 ms
	assert.True(t, waited(p, at(20*time.Millisecond)))
	total += time.Second // not read: less than psiReadEvery since the last read
	assert.True(t, waited(p, at(24*time.Millisecond)), "judged on the samples taken")
	assert.Equal(t, 2, reads)

	total -= time.Second
	total += 2 * time.Millisecond // a tenth of the next 20 ms: an ordinary moment
	assert.False(t, waited(p, at(40*time.Millisecond)))

	total += 5 * time.Millisecond // a quarter
	share, span, ok := p.waitedShare(at(60*time.Millisecond), window)
	assert.True(t, ok)
	assert.Equal(t, 20*time.Millisecond, span)
	assert.InDelta(t, 0.25, share, 1e-9)
	assert.True(t, waited(p, at(60*time.Millisecond)))

	// Samples far apart (an idle shard between two calls): the long span
	// says nothing about the last moments.
	total += 9 * time.Second
	assert.False(t, waited(p, at(10*time.Second)))
	total += 15 * time.Millisecond
	assert.True(t, waited(p, at(10*time.Second+20*time.Millisecond)), "then a span of its own")

	// A machine without PSI: never contended.
	none := &cpuPressure{read: func() (psi, bool) { return psi{}, false }}
	none.sample(t0)
	w, known := none.waited(t0.Add(20*time.Millisecond), window)
	assert.False(t, w)
	assert.False(t, known, "nothing known without PSI")
}

// The answer of a pipeline judged stalled closes a breaker that opened
// once (the shard was paused, and is back), but not one in its backoff
// (a shard slow for good would otherwise flap it at its own pace).
func TestBreakerClosesOnTheStalledPipelinesAnswer(t *testing.T) {
	b := testBreaker()
	require.True(t, b.stall(t0))
	require.True(t, b.answered(t0.Add(30*time.Millisecond)), "first opening: the answer closes it")
	assert.Equal(t, BreakerClosed, b.state)
	assert.True(t, b.allow())
	assert.False(t, b.answered(t0.Add(31*time.Millisecond)), "closed already")

	// Reopened 100 ms after closing: in backoff, the answer does not close.
	require.True(t, b.stall(t0.Add(130*time.Millisecond)))
	assert.Equal(t, 100*time.Millisecond, b.nextProbe().Sub(t0.Add(130*time.Millisecond)))
	assert.False(t, b.answered(t0.Add(180*time.Millisecond)))
	assert.Equal(t, BreakerOpen, b.state)
	assert.Equal(t, uint64(2), b.openings)

	// Half-open with a probe out: the answer closes it, and the probe's
	// result, when it comes, moves nothing.
	b = testBreaker()
	b.stall(t0)
	require.True(t, b.probeDue(b.nextProbe()))
	require.True(t, b.answered(t0.Add(60*time.Millisecond)))
	b.probed(t0.Add(61*time.Millisecond), false)
	assert.Equal(t, BreakerClosed, b.state)
	assert.Equal(t, uint64(0), b.probeFailures)
}

func TestParseStat(t *testing.T) {
	v, ok := parseStat("cpu  20432 0 8474 32300 4303 0 302 17 5 0\ncpu0 9892 0 3787 18666 414 0 136 9 0 0\n")
	require.True(t, ok)
	assert.Equal(t, cpuTimes{steal: 17, all: 20432 + 8474 + 32300 + 4303 + 302 + 17}, v, "guest time is inside user: not added")
	v, ok = parseStat("cpu  1 2 3 4 5 6 7 8") // no guest fields (old kernels)
	require.True(t, ok)
	assert.Equal(t, cpuTimes{steal: 8, all: 36}, v)
	for _, bad := range []string{
		"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu  1 2 3 4 5 6 7\n", "cpu  1 2 3 4 5 6 7 x\n",
		"cpu  1 2 3 4 5 6 7 -8\n", "cpu  9223372036854775807 1 0 0 0 0 0 0\n", "intr 1\ncpu  1 2 3 4 5 6 7 8\n",
	} {
		_, ok = parseStat(bad)
		assert.False(t, ok, "%q", bad)
	}
}

// stealShare judges the ring's samples within stealWindow, over at least
// stealMinSpan: stolen time against all of the machine's time.
func TestCPUPressureStealShare(t *testing.T) {
	var v cpuTimes
	p := &cpuPressure{read: func() (psi, bool) { return psi{}, true }, stat: func() (cpuTimes, bool) { return v, true }}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	step := func(d time.Duration, all, steal int64) bool {
		v.all += all
		v.steal += steal
		return p.stealing(at(d))
	}
	assert.False(t, step(0, 0, 0), "one sample: nothing to compare")
	assert.False(t, step(20*time.Millisecond, 4, 4), "all stolen, but a span too short to tell")
	assert.False(t, step(40*time.Millisecond, 4, 0))
	assert.True(t, step(60*time.Millisecond, 4, 0), "4 of 12 ticks over 60 ms")
	share, span, ok := p.stealShare(at(60 * time.Millisecond))
	require.True(t, ok)
	assert.Equal(t, 60*time.Millisecond, span)
	assert.InDelta(t, 4.0/12, share, 1e-9)

	// Quiet for a while: the burst leaves the window.
	d := 60 * time.Millisecond
	for d < 60*time.Millisecond+stealWindow {
		d += 20 * time.Millisecond
		step(d, 4, 0)
	}
	assert.False(t, p.stealing(at(d)), "no steal within the window")
	d += 20 * time.Millisecond
	assert.False(t, step(d, 4, 2), "2 of the ring's 64 ticks (300 ms on 2 CPUs)")
	d += 20 * time.Millisecond
	assert.True(t, step(d, 4, 2), "4 of them")
	share, _, _ = p.stealShare(at(d))
	assert.GreaterOrEqual(t, share, stolenShare)

	// A counter going backwards (a wrapped or reset file) says nothing.
	v.steal = 0
	d += 20 * time.Millisecond
	assert.False(t, step(d, 4, 0))

	// Without /proc/stat: never stealing, and PSI is still read.
	reads := 0
	none := &cpuPressure{read: func() (psi, bool) { reads++; return psi{}, true }}
	assert.False(t, none.stealing(t0))
	assert.False(t, none.stealing(t0.Add(time.Second)))
	assert.Equal(t, 2, reads)
}
