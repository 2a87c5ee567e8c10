package region

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Unix(1_700_000_000, 0)

func newBreaker(o BreakerOptions) *breaker { return &breaker{opts: o} }

func testBreaker() *breaker {
	return newBreaker(BreakerOptions{Failures: 10, ProbeAfter: 50 * time.Millisecond, MaxOpen: 5 * time.Second}.withDefaults())
}

// The outcomes as the shard records them.
func (b *breaker) success()                   { b.record(t0, false, false) }
func (b *breaker) failure(now time.Time) bool { return b.record(now, true, false) }
func (b *breaker) stall(now time.Time) bool   { return b.record(now, true, true) }
func (b *breaker) allow() bool                { return b.state == BreakerClosed }
func (b *breaker) nextProbe() time.Time       { return b.probeAt }

// A stall is one event, and it opens the breaker at once, however many
// calls it held: the breaker counts round trips, not calls.
func TestBreakerStallOpensAtOnce(t *testing.T) {
	b := testBreaker()
	b.success()
	require.True(t, b.stall(t0))
	assert.Equal(t, BreakerOpen, b.state)
	assert.False(t, b.allow())
	assert.Equal(t, uint64(1), b.openings)
	assert.False(t, b.stall(t0), "already open: a second stall is not a second opening")
	assert.Equal(t, uint64(1), b.openings)
}

// Failures open it only in a row: one success restarts the count; a
// negative Failures leaves opening to stalls.
func TestBreakerOpensOnFailuresInARow(t *testing.T) {
	b := testBreaker()
	for i := range 9 {
		require.False(t, b.failure(t0), "failure %d", i+1)
	}
	b.success()
	for range 9 {
		require.False(t, b.failure(t0), "a success restarted the run")
	}
	assert.Equal(t, 9, b.failed)
	require.True(t, b.failure(t0), "10 in a row")

	b = newBreaker(BreakerOptions{Failures: -1}.withDefaults())
	for range 1000 {
		require.False(t, b.failure(t0))
	}
	require.True(t, b.stall(t0))
}

// Probes back off: ProbeAfter, then doubling up to MaxOpen; a success
// closes. A breaker that reopens within MaxOpen of closing continues the
// backoff; one that stayed closed longer starts again from ProbeAfter.
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
	// Closed for MaxOpen: back to ProbeAfter.
	later := at.Add(5 * time.Second)
	b.stall(later)
	assert.Equal(t, 50*time.Millisecond, b.nextProbe().Sub(later))
	assert.Equal(t, uint64(3), b.openings)
}

// Outcomes of calls sent before the breaker opened do not move it.
func TestBreakerIgnoresLateOutcomesWhileOpen(t *testing.T) {
	b := testBreaker()
	b.stall(t0)
	b.success()
	assert.Equal(t, BreakerOpen, b.state)
	assert.False(t, b.failure(t0.Add(2*time.Millisecond)))
	assert.Equal(t, uint64(1), b.openings)
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
