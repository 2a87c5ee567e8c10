package algorithm

import (
	"fmt"
	"math/bits"
	"time"
)

// The bounds below are what the Lua scripts (package lua) can compute.
// Lua 5.1 has one number type, the IEEE double, exact for integers up to
// 2^53; the scripts do every sum in it, and pass results to Redis as
// decimal integers. The derivation, per quantity (ARCHITECTURE.md,
// "Numbers the scripts can hold", says the same):
//
//   - now, Redis TIME in µs, is about 1.8·10^15 today and stays below 2^52
//     until the year 2112 (below 2^53 until 2255).
//   - The longest span any algorithm times, its horizon (the time from a
//     fresh key back to fresh: capacity/rate, τ, the window, two windows),
//     is at most MaxHorizon = 2^51 µs (71.4 years). The largest absolute
//     time a script forms is GCRA's tat + cost·T <= now + 2τ (tat is at
//     most τ ahead, and a cost above the burst is denied before the
//     product), so below 2^52 + 2·2^51 = 2^53: exact. The windows' (i+1)·w
//     is below now + w.
//   - Every duration a script returns (retry, reset: at most the horizon,
//     in µs) and every TTL it sets (horizon/1000 + 1000 ms) is then an
//     exact integer, fits PEXPIRE (which adds now in ms and must stay
//     below 2^63), and fits a time.Duration in ns (2^51 µs is 2.3·10^18
//     ns, 2^63 is 9.2·10^18). The scripts refuse, before any write, a TTL
//     above 2^53/1000 ms: four times this bound, so that rounding in the
//     token bucket's float maths, or a shared bucket of a global limit
//     (Share rounds limit and burst down separately, which can double
//     the horizon), never reaches the refusal.
//   - Limit and Burst are at most MaxCount = 2^52: a count plus an
//     admitted cost (at most the limit or burst) stays below 2^53. The
//     token bucket's fractional tokens keep a resolution of one unit in
//     the last place; with the horizon bound, one µs of refill
//     (burst/horizon tokens) is at least two units in the last place of
//     the burst, so a refill is never rounded away.
//
// A policy file's own ranges (policy.MaxLimit 2^40, policy.MaxPeriod 366
// days) are tighter for counts and periods but not for a token bucket's
// or GCRA's horizon: limit 1 per 366 days with burst 72 already exceeds
// it.
const (
	// MaxHorizon is the longest a key may take to become fresh again.
	MaxHorizon = maxHorizonMicros * time.Microsecond
	// MaxCount is the largest Limit and Burst.
	MaxCount = 1 << 52

	maxHorizonMicros = 1 << 51
)

// horizonOK reports whether the time a drained key of s takes to be fresh
// again (Spec.TTL without the grace second) is at most MaxHorizon. s must
// have passed Validate's checks of positive numbers and MaxCount.
func (s Spec) horizonOK() bool {
	switch s.Algorithm {
	case TokenBucket:
		// capacity/rate = capacity·period/limit: compared in 128 bits, so
		// the bound is exact whatever the numbers.
		hi, lo := bits.Mul64(uint64(s.Capacity()), uint64(s.window()))
		mhi, mlo := bits.Mul64(maxHorizonMicros, uint64(s.Limit))
		return hi < mhi || hi == mhi && lo <= mlo
	case GCRA:
		return s.Capacity() <= maxHorizonMicros/s.interval()
	case SlidingWindowCounter:
		return s.window() <= maxHorizonMicros/2
	}
	return s.window() <= maxHorizonMicros
}

// horizonError explains a spec whose horizon is too long, with the
// largest burst (or period) that would do.
func (s Spec) horizonError() error {
	const bound = "longer than the 71 years (2^51 µs) the scripts can time exactly"
	switch s.Algorithm {
	case TokenBucket:
		// ⌊2^51·limit/period⌋, capped at MaxCount (and at 2^64, where
		// Div64 would overflow).
		maxBurst := int64(MaxCount)
		hi, lo := bits.Mul64(maxHorizonMicros, uint64(s.Limit))
		if w := uint64(s.window()); hi < w {
			if q, _ := bits.Div64(hi, lo, w); q < MaxCount {
				maxBurst = int64(q)
			}
		}
		return fmt.Errorf("token_bucket refills burst %d at %d per %v in %s, %s; at most burst %d for this limit and period",
			s.Capacity(), s.Limit, s.Period, years(float64(s.Capacity())/s.Rate()), bound, maxBurst)
	case GCRA:
		return fmt.Errorf("gcra burst tolerance burst × period/limit = %d × %dµs is too long: %s, %s; at most burst %d for this limit and period",
			s.Capacity(), s.interval(), years(float64(s.Capacity())*float64(s.interval())/1e6), bound, maxHorizonMicros/s.interval())
	case SlidingWindowCounter:
		return fmt.Errorf("sliding_window_counter keeps two windows: period %v is too long (%s); at most %v",
			s.Period, bound, (maxHorizonMicros / 2 * time.Microsecond).Truncate(time.Millisecond))
	}
	return fmt.Errorf("%v: period %v is too long (%s); at most %v", s.Algorithm, s.Period, bound,
		(maxHorizonMicros * time.Microsecond).Truncate(time.Millisecond))
}

// years spells a span in seconds for an error message.
func years(sec float64) string {
	const year = 365.25 * 24 * 3600
	if sec < year {
		return time.Duration(sec * 1e9).Round(time.Second).String()
	}
	return fmt.Sprintf("%.3g years", sec/year)
}
