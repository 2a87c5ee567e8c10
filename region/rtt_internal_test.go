package region

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestRTTTail(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var tl rttTail
	assert.Zero(t, tl.rank(t0, 1), "nothing seen")
	for i := range 1000 {
		tl.observe(t0.Add(time.Duration(i)*time.Millisecond), 300*time.Microsecond)
	}
	now := t0.Add(time.Second)
	assert.Equal(t, 300*time.Microsecond, tl.rank(now, 5))

	// One pause of this process delays both pipelines in flight: two slow
	// samples set the slowest, not the fifth slowest.
	tl.observe(now, 20*time.Millisecond)
	tl.observe(now, 19*time.Millisecond)
	assert.Equal(t, 20*time.Millisecond, tl.rank(now, 1))
	assert.Equal(t, 300*time.Microsecond, tl.rank(now, 5), "one hiccup does not set the threshold")

	// A loaded machine: slow round trips by the dozen set it.
	for i := range 50 {
		tl.observe(now, time.Duration(5+i%3)*time.Millisecond)
	}
	assert.Equal(t, 7*time.Millisecond, tl.rank(now, 5))

	// Halved for every half-life since each was seen.
	assert.Equal(t, 3500*time.Microsecond, tl.rank(now.Add(rttHalfLife), 5))
	assert.Equal(t, 875*time.Microsecond, tl.rank(now.Add(3*rttHalfLife), 5))
	// A fresh fast sample replaces the smallest decayed one.
	later := now.Add(10 * rttHalfLife)
	tl.observe(later, time.Millisecond)
	assert.Equal(t, time.Millisecond, tl.rank(later, 1))
	assert.Less(t, tl.rank(later, 2), time.Millisecond)

	assert.Equal(t, tl.rank(later, rttKeep), tl.rank(later, 100), "rank capped")
}

// A check that woke late defers by its lateness, within [1 ms, th].
func TestLateDeferral(t *testing.T) {
	th := 4 * time.Millisecond
	assert.Equal(t, time.Millisecond, lateDeferral(100*time.Microsecond, th))
	assert.Equal(t, 3*time.Millisecond, lateDeferral(3*time.Millisecond, th))
	assert.Equal(t, th, lateDeferral(20*time.Millisecond, th), "capped at the threshold")
	assert.Equal(t, time.Millisecond, lateDeferral(20*time.Millisecond, 0))
}
