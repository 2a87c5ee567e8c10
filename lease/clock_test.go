package lease

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An unread CoarseClock stops ticking; a read of a sleeping clock is the
// real time (never a stale value) and starts it ticking again.
func TestCoarseClockSleepsWhenUnread(t *testing.T) {
	c := NewCoarseClock(time.Millisecond)
	t.Cleanup(c.Stop)
	asleep := func() bool { return c.state.Load() == clockAsleep }
	require.Eventually(t, asleep, 5*time.Second, time.Millisecond, "nobody reads it: it sleeps")
	slept := c.now.Load()
	require.Eventually(t, func() bool { return int64(time.Since(c.start)) > slept+int64(20*time.Millisecond) }, 10*time.Second, time.Millisecond)
	assert.Equal(t, slept, c.now.Load(), "asleep, it does not advance")

	real := int64(time.Since(c.start))
	got := c.Now()
	assert.GreaterOrEqual(t, got, real, "a read of a sleeping clock is the real time")
	assert.False(t, asleep(), "a read wakes it")
	// Ticking again: the value advances with no further slow read needed.
	next := got + int64(5*time.Millisecond)
	require.Eventually(t, func() bool { return c.now.Load() >= next }, 5*time.Second, time.Millisecond)
	require.Eventually(t, asleep, 5*time.Second, time.Millisecond, "and sleeps again once unread")
}

// Concurrent readers around sleeps and wake-ups never see the clock step
// back. Run with -race.
func TestCoarseClockMonotonic(t *testing.T) {
	c := NewCoarseClock(100 * time.Microsecond)
	t.Cleanup(c.Stop)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := int64(0)
			for i := range 20_000 {
				v := c.Now()
				if !assert.GreaterOrEqual(t, v, last) {
					return
				}
				last = v
				if i%2000 == 0 {
					time.Sleep(10 * time.Millisecond) // long enough to let the clock fall asleep
				}
			}
		}()
	}
	wg.Wait()
}

// After Stop, Now stays where it is.
func TestCoarseClockStop(t *testing.T) {
	c := NewCoarseClock(time.Millisecond)
	c.Stop()
	v := c.Now()
	require.Eventually(t, func() bool { return int64(time.Since(c.start)) > v+int64(5*time.Millisecond) }, 10*time.Second, time.Millisecond)
	assert.Equal(t, v, c.Now())
}

// BenchmarkCoarseClockNow is the clock read of every leased decision
// (issue 16 wants a whole Take within 45 ns).
func BenchmarkCoarseClockNow(b *testing.B) {
	c := NewCoarseClock(DefaultTick)
	b.Cleanup(c.Stop)
	b.RunParallel(func(pb *testing.PB) {
		var s int64
		for pb.Next() {
			s += c.Now()
		}
		_ = s
	})
}
