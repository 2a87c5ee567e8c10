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
// it is two atomic loads (time.Now costs more than a whole leased
// decision). It lags real time by at most one tick, which the overshoot
// bound accounts for.
//
// Nobody reading it, it stops ticking: after idleTicks ticks without a
// read its goroutine sleeps (an idle node is idle: a 1 ms ticker cost it
// most of its 3 % of a core). The next read finds it asleep, reads the
// real time itself and wakes the goroutine, so a read never sees a stale
// value. Stop ends its goroutine.
type CoarseClock struct {
	now     atomic.Int64
	state   atomic.Int32 // clockRead, clockUnread or clockAsleep
	stopped atomic.Bool
	start   time.Time
	tick    time.Duration
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// CoarseClock states. Now's fast path is taken only in clockRead.
const (
	clockRead   = iota // read since the last tick
	clockUnread        // ticking, not read since the last tick
	clockAsleep        // not ticking: the next read reads the real time
)

// idleTicks is how many ticks without a read put a CoarseClock to sleep.
// Waking costs a reader one real-time read and a goroutine wake-up, so
// this only has to be long against the gaps of a busy key.
const idleTicks = 50

// DefaultTick is the CoarseClock resolution a Manager uses by default.
const DefaultTick = time.Millisecond

// NewCoarseClock starts a clock advancing every tick.
func NewCoarseClock(tick time.Duration) *CoarseClock {
	c := &CoarseClock{
		start: time.Now(), tick: tick,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	c.now.Store(1) // never 0: 0 means "no lease" in entries
	go c.run()
	return c
}

func (c *CoarseClock) run() {
	defer close(c.done)
	t := time.NewTicker(c.tick)
	defer t.Stop()
	idle := 0
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.advance()
		if c.state.CompareAndSwap(clockRead, clockUnread) {
			idle = 0
			continue
		}
		if idle++; idle < idleTicks || !c.state.CompareAndSwap(clockUnread, clockAsleep) {
			continue
		}
		t.Stop()
		select {
		case <-c.stop:
			return
		case <-c.wake:
		}
		idle = 0
		t.Reset(c.tick)
	}
}

// advance moves now to the real time, never back (a reader and the
// goroutine may both advance it).
func (c *CoarseClock) advance() int64 {
	v := int64(time.Since(c.start)) + 1
	for {
		old := c.now.Load()
		if v <= old {
			return old
		}
		if c.now.CompareAndSwap(old, v) {
			return v
		}
	}
}

// Now is the time since the clock started, in nanoseconds.
func (c *CoarseClock) Now() int64 {
	if c.state.Load() != clockRead {
		return c.slowNow()
	}
	return c.now.Load()
}

// slowNow is the first read after a tick, or a read of a sleeping clock:
// the real time, stored before the state says "read" so that no reader
// on the fast path sees an older value.
func (c *CoarseClock) slowNow() int64 {
	if c.stopped.Load() {
		return c.now.Load()
	}
	v := c.advance()
	if c.state.CompareAndSwap(clockAsleep, clockRead) {
		c.wake <- struct{}{} // one waker per sleep: never blocks
		return v
	}
	c.state.CompareAndSwap(clockUnread, clockRead)
	return v
}

// Stop ends the clock's goroutine; Now then stays where it is.
func (c *CoarseClock) Stop() {
	c.once.Do(func() {
		c.stopped.Store(true)
		close(c.stop)
	})
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
