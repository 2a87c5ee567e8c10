package algorithm

import (
	"math"
	"time"
)

// Windows are aligned to the Unix epoch: window i of length w is
// [i·w, (i+1)·w) in microseconds, so a 24h window is a UTC day, and every
// store and node agrees on the window from the clock alone.
//
// A stored window later than now's (the store's clock stepped back) is
// kept as the current one, at its start: counts are never forgotten early.

// windowAt returns the window index of now and the time elapsed in it,
// given the stored window (valid or not).
func windowAt(w, now, stored int64, valid bool) (idx, elapsed int64) {
	idx, elapsed = now/w, now%w
	if valid && stored > idx {
		return stored, 0
	}
	return idx, elapsed
}

// WindowState is the fixed window's state: Count tokens taken in window
// Win.
//
// With window w = Period and i = ⌊now/w⌋, the key counts n = Count if
// Win = i, else 0. A take of cost c admits iff n + c <= Limit and stores
// (i, n + c). Cheap, O(1), and coarse: Limit at the end of one window and
// Limit again at the start of the next are both admitted, so up to
// 2·Limit can pass within any span of length w straddling a boundary.
// That is fine for daily or monthly quotas, not for abuse limits.
//
// The results are: remaining Limit − n (− c if taken); retry, when
// denied, the time until the window ends; reset, the time until the
// window ends if it counted anything, else 0.
//
// Refund subtracts c (not below 0) if the window is still the current
// one: exact; a refund after the window ended has nothing to give back.
type WindowState struct {
	Win, Count int64
	Valid      bool
}

// Decide answers a take of cost at now (see WindowState for the formulas).
func (f WindowState) Decide(s Spec, now, cost int64) Decision {
	w := s.window()
	idx, _ := windowAt(w, now, f.Win, f.Valid)
	n := int64(0)
	if f.Valid && f.Win == idx {
		n = f.Count
	}
	toEnd := micros((idx+1)*w - now)
	d := Decision{OK: cost <= s.Limit && n+cost <= s.Limit, TTL: ttlMicros((idx+1)*w - now)}
	switch {
	case cost > s.Limit:
		d.Kept.RetryAfter = Never
	case !d.OK:
		d.Kept.RetryAfter = toEnd
	}
	d.Kept.Remaining = max(s.Limit-n, 0)
	if n > 0 {
		d.Kept.ResetAfter = toEnd
	}
	d.Taken = d.Kept
	if d.OK {
		d.Taken.Remaining = s.Limit - n - cost
		if n+cost > 0 {
			d.Taken.ResetAfter = toEnd
		}
		d.Next = State{Algorithm: FixedWindow, Window: WindowState{Win: idx, Count: n + cost, Valid: true}}
	}
	return d
}

func (f WindowState) refund(s Spec, now, cost int64) (State, time.Duration, bool) {
	idx, _ := windowAt(s.window(), now, f.Win, f.Valid)
	if !f.Valid || f.Win != idx {
		return State{}, 0, false
	}
	f.Count -= min(f.Count, max(cost, 0))
	return State{Algorithm: FixedWindow, Window: f}, 0, true
}

// CounterState is the sliding window counter's state: Curr tokens taken
// in window Win and Prev in the window before it.
//
// With window w = Period, i = ⌊now/w⌋ and e = now − i·w the time elapsed
// in window i, the counts are rolled to window i (if Win = i−1, Prev
// becomes Curr and Curr 0; if older, both are 0) and the tokens taken in
// the sliding window (now − w, now] are estimated as
//
//	n̂ = Curr + Prev·(w − e)/w
//
// which assumes the previous window's tokens were spread evenly over it
// (Cloudflare measured 0.003% of requests wrongly allowed or denied). For
// w = 60s, e = 15s, Prev = 80, Curr = 30: n̂ = 30 + 80·0.75 = 90, so a
// limit of 100 allows 10 more. A take of cost c admits iff n̂ + c <= Limit
// and adds c to Curr. O(1) memory: three integers.
//
// The results are: remaining ⌊Limit − n̂⌋ (− c if taken); retry, when
// denied, the time until n̂ + c <= Limit given no further takes (Prev's
// weight decays within this window; if Curr + c alone is over, the next
// window, where Curr has become Prev, must decay it); reset, the time
// until n̂ is 0 (the end of the next window if Curr > 0, of this one if
// only Prev > 0).
//
// Refund subtracts c from Curr, and what Curr lacks from Prev (the take
// was in the previous window if the window turned in between). Exact
// within a window; across the boundary the count is right but the
// estimate weighs it as the previous window's.
type CounterState struct {
	Win, Curr, Prev int64
	Valid           bool
}

// roll returns the state's counts as of now's window, and e.
func (c CounterState) roll(w, now int64) (CounterState, int64) {
	idx, e := windowAt(w, now, c.Win, c.Valid)
	switch {
	case !c.Valid || c.Win < idx-1:
		return CounterState{Win: idx, Valid: true}, e
	case c.Win == idx-1:
		return CounterState{Win: idx, Prev: c.Curr, Valid: true}, e
	}
	return c, e
}

// estimate is n̂ = Curr + Prev·(w − e)/w. The explicit float64 conversion
// stops the compiler fusing the multiply and add (FMA), which would round
// differently from the Lua twin.
func (c CounterState) estimate(w, e int64) float64 {
	return float64(c.Curr) + float64(float64(c.Prev)*(float64(w-e)/float64(w)))
}

// Decide answers a take of cost at now (see CounterState for the formulas).
func (c CounterState) Decide(s Spec, now, cost int64) Decision {
	w := s.window()
	c, e := c.roll(w, now)
	est := c.estimate(w, e)
	limit := float64(s.Limit)
	d := Decision{OK: cost <= s.Limit && est+float64(cost) <= limit, TTL: ttlMicros(2*w - e)}
	d.Kept.RetryAfter = c.retry(s, w, e, cost, d.OK)
	d.Kept.Remaining = int64(math.Max(math.Floor(limit-est), 0))
	d.Kept.ResetAfter = c.reset(w, e)
	d.Taken = d.Kept
	if d.OK {
		d.Taken.Remaining = int64(math.Max(math.Floor(limit-est-float64(cost)), 0))
		c.Curr += cost
		d.Taken.ResetAfter = c.reset(w, e)
		d.Next = State{Algorithm: SlidingWindowCounter, Counter: c}
	}
	return d
}

func (c CounterState) retry(s Spec, w, e, cost int64, ok bool) time.Duration {
	fw := float64(w)
	switch {
	case cost > s.Limit:
		return Never
	case ok:
		return 0
	case c.Curr+cost <= s.Limit:
		// Prev > 0 here, else n̂ = Curr would admit. Solve
		// Curr + Prev·(w − e')/w = Limit − c for e'.
		at := fw - float64(s.Limit-cost-c.Curr)*fw/float64(c.Prev)
		return micros(int64(math.Ceil(at - float64(e))))
	}
	// Next window: Curr becomes Prev. Solve Curr·(w − e')/w = Limit − c.
	at := fw - float64(s.Limit-cost)*fw/float64(c.Curr)
	return micros(int64(math.Ceil(float64(w-e) + at)))
}

func (c CounterState) reset(w, e int64) time.Duration {
	switch {
	case c.Curr > 0:
		return micros(2*w - e)
	case c.Prev > 0:
		return micros(w - e)
	}
	return 0
}

func (c CounterState) refund(s Spec, now, cost int64) (State, time.Duration, bool) {
	if !c.Valid {
		return State{}, 0, false
	}
	c, _ = c.roll(s.window(), now)
	cost = max(cost, 0)
	fromCurr := min(c.Curr, cost)
	c.Curr -= fromCurr
	c.Prev -= min(c.Prev, cost-fromCurr)
	return State{Algorithm: SlidingWindowCounter, Counter: c}, 0, true
}
