package algorithm

import (
	"sort"
	"time"
)

// LogState is the sliding window log's state: the timestamps
// (microseconds, ascending) of every token admitted in the last window.
// In Redis it is a sorted set, one member per token, scored by timestamp.
//
// With window w = Period, the key counts n = |{ts in TS : ts > now − w}|,
// the tokens admitted in (now − w, now]. A take of cost c admits iff
// n + c <= Limit and appends c timestamps. So no window of length w ever
// holds more than Limit admitted tokens, exactly, at any time: the price
// is O(Limit) memory per key (Limit <= MaxLogLimit).
//
// New timestamps are max(now, newest): a store clock that steps back
// neither reorders the log nor lets entries leave early.
//
// The results are: remaining Limit − n (− c if taken); retry, when denied,
// the time until the (n + c − Limit)-th oldest entry leaves the window;
// reset, the time until the newest leaves it.
//
// Refund removes the c newest entries. That is exact when no other take
// of the key came between the take and its refund; otherwise it removes
// that later take's entries and leaves the earlier ones, which leave the
// window up to the gap between the two takes sooner.
type LogState struct {
	TS []int64
}

// Decide answers a take of cost at now (see LogState for the formulas).
func (l LogState) Decide(s Spec, now, cost int64) Decision {
	w := s.window()
	// Entries at or before now − w have left the window.
	first := sort.Search(len(l.TS), func(i int) bool { return l.TS[i] > now-w })
	live := l.TS[first:]
	n := int64(len(live))
	at := now
	if len(l.TS) > 0 {
		at = max(now, l.TS[len(l.TS)-1])
	}

	d := Decision{OK: cost <= s.Limit && n+cost <= s.Limit}
	switch {
	case cost > s.Limit:
		d.Kept.RetryAfter = Never
	case !d.OK:
		d.Kept.RetryAfter = micros(live[n+cost-s.Limit-1] + w - now)
	}
	d.Kept.Remaining = max(s.Limit-n, 0)
	if n > 0 {
		d.Kept.ResetAfter = micros(live[n-1] + w - now)
	}
	if !d.OK {
		d.Taken = d.Kept
		return d
	}

	d.Taken = ItemResult{Remaining: s.Limit - n - cost, ResetAfter: d.Kept.ResetAfter}
	newest := int64(-1)
	if n > 0 {
		newest = live[n-1]
	}
	if cost > 0 {
		newest = at
		d.Taken.ResetAfter = micros(at + w - now)
	}
	// Appending may write past the end of l.TS in a shared array; l's own
	// elements are untouched, so a denied group's state stays valid.
	next := live
	for range cost {
		next = append(next, at)
	}
	d.Next = State{Algorithm: SlidingWindowLog, Log: LogState{TS: next}}
	d.TTL = ttlMicros(newest + w - now)
	if newest < 0 {
		d.TTL = ttlMicros(0)
	}
	return d
}

func (l LogState) refund(s Spec, cost int64) (State, time.Duration, bool) {
	if len(l.TS) == 0 {
		return State{}, 0, false
	}
	k := min(int64(len(l.TS)), max(cost, 0))
	return State{Algorithm: SlidingWindowLog, Log: LogState{TS: l.TS[:int64(len(l.TS))-k]}}, 0, true
}
