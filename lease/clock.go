package lease

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the manager's time source in nanoseconds. Only differences
// matter; the value must never step back.
type Clock interface {
	Now() int64
}

// CoarseClock is a Clock that a goroutine advances every tick, so reading
// it is one atomic load (time.Now costs more than a whole leased
// decision). It lags real time by at most one tick, which the overshoot
// bound accounts for. Stop ends its goroutine.
type CoarseClock struct {
	now   atomic.Int64
	start time.Time
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// DefaultTick is the CoarseClock resolution a Manager uses by default.
const DefaultTick = time.Millisecond

// NewCoarseClock starts a clock advancing every tick.
func NewCoarseClock(tick time.Duration) *CoarseClock {
	c := &CoarseClock{start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	c.now.Store(1) // never 0: 0 means "no lease" in entries
	go c.run(tick)
	return c
}

func (c *CoarseClock) run(tick time.Duration) {
	defer close(c.done)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.now.Store(int64(time.Since(c.start)) + 1)
		}
	}
}

// Now is the time since the clock started, in nanoseconds.
func (c *CoarseClock) Now() int64 { return c.now.Load() }

// Stop ends the clock's goroutine; Now then stays where it is.
func (c *CoarseClock) Stop() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
}

// ManualClock is a Clock tests move by hand.
type ManualClock struct{ now atomic.Int64 }

// NewManualClock returns a clock at a nonzero instant.
func NewManualClock() *ManualClock {
	c := &ManualClock{}
	c.now.Store(int64(time.Hour))
	return c
}

// Now returns the clock's time.
func (c *ManualClock) Now() int64 { return c.now.Load() }

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) { c.now.Add(int64(d)) }
