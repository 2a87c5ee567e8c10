// Package algorithm defines what a limit is (Spec), what one check asks of
// a store (Item, Group) and what it answers (Result), and holds the pure
// maths of each algorithm.
//
// The maths here is the in-process twin of the scripts that check and
// refund in package lua (check.lua, check_tb.lua, refund.lua): same
// state, same formulas. The standalone store (internal/memstore) runs it
// directly; tests compare it with Redis. Leasing, shares and RLQS parts
// have no twin here.
//
// It does no I/O, reads no clock and keeps no state: time comes in as
// microseconds and a key's State as an argument, and the State to store
// goes back to the caller.
package algorithm

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names a rate-limiting algorithm.
type Algorithm uint8

// The algorithms Allot knows. Their names are the policy file's spelling;
// docs/algorithms.md says which to pick when.
const (
	// TokenBucket refills Limit/Period tokens per second up to Burst.
	TokenBucket Algorithm = iota + 1
	// GCRA is the generic cell rate algorithm: the token bucket's
	// decisions kept as one theoretical arrival time (see GCRAState).
	GCRA
	// SlidingWindowLog admits at most Limit in any window of length Period,
	// exactly, at one stored entry per admitted token (see LogState).
	SlidingWindowLog
	// SlidingWindowCounter estimates the sliding window from two fixed
	// windows' counts (see CounterState).
	SlidingWindowCounter
	// FixedWindow counts per epoch-aligned window of length Period (see
	// WindowState).
	FixedWindow
)

var names = map[Algorithm]string{
	TokenBucket:          "token_bucket",
	GCRA:                 "gcra",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	FixedWindow:          "fixed_window",
}

// codes are the tokens check.lua and refund.lua switch on.
var codes = map[Algorithm]string{
	TokenBucket:          "tb",
	GCRA:                 "gcra",
	SlidingWindowLog:     "swl",
	SlidingWindowCounter: "swc",
	FixedWindow:          "fw",
}

// String returns the policy-file spelling of a.
func (a Algorithm) String() string {
	if s, ok := names[a]; ok {
		return s
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// Code is the short token the Lua scripts switch on ("" if a is unknown).
func (a Algorithm) Code() string { return codes[a] }

// Leasable reports whether a node may take tokens of a in advance and
// spend them in memory. Only the token bucket is: its state is an amount
// that can be drawn down and given back, and lease.lua keeps exactly that
// state. GCRA is the same bucket in another encoding (a theoretical
// arrival time), but lease.lua does not read it, so leasing it would
// split its state from the exact path's; a window or a log counts what
// happened at which time, and a lease would hide when.
func (a Algorithm) Leasable() bool { return a == TokenBucket }

// Windowed reports whether a counts requests in time windows (the log and
// window algorithms): for these Burst has no meaning.
func (a Algorithm) Windowed() bool {
	return a == SlidingWindowLog || a == SlidingWindowCounter || a == FixedWindow
}

// Parse returns the algorithm spelled s in a policy file.
func Parse(s string) (Algorithm, error) {
	for a, n := range names {
		if n == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want token_bucket, gcra, sliding_window_log, sliding_window_counter or fixed_window)", s)
}

// Spec is one limit: Limit tokens per Period, with a capacity of Burst.
//
// For a token bucket and GCRA the refill rate is Limit/Period tokens per
// second and at most Burst tokens can be taken at once (Burst defaults to
// Limit). For the window and log algorithms at most Limit tokens are taken
// per window of length Period, and Burst must be 0 or Limit.
type Spec struct {
	Algorithm Algorithm
	Limit     int64
	Period    time.Duration
	Burst     int64
}

// MaxLogLimit is the largest Limit of a sliding window log: it stores one
// entry per admitted token, so a key can cost O(Limit) memory in Redis.
const MaxLogLimit = 10_000

// Validate reports what makes s unusable, beyond the ranges a policy file
// checks: an unknown algorithm, a sub-millisecond period (the scripts take
// milliseconds), numbers the scripts cannot compute exactly (MaxCount,
// MaxHorizon; bounds.go derives them) and each algorithm's own bounds.
// Several problems are joined into one error.
func (s Spec) Validate() error {
	var errs []error
	if s.Algorithm.Code() == "" {
		errs = append(errs, fmt.Errorf("unknown algorithm %v", s.Algorithm))
	}
	if s.Limit <= 0 {
		errs = append(errs, fmt.Errorf("limit %d must be positive", s.Limit))
	}
	if s.Period <= 0 || s.Period%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("period %v must be a positive whole number of milliseconds", s.Period))
	}
	if s.Burst < 0 {
		errs = append(errs, fmt.Errorf("burst %d must not be negative", s.Burst))
	}
	if s.Limit > MaxCount || s.Burst > MaxCount {
		errs = append(errs, fmt.Errorf("limit %d and burst %d must be at most 2^52 (%d)", s.Limit, s.Burst, int64(MaxCount)))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	switch {
	case s.Algorithm.Windowed() && s.Burst != 0 && s.Burst != s.Limit:
		return fmt.Errorf("%v counts at most limit per period and has no burst: burst %d must be 0 or the limit (%d); use token_bucket or gcra for bursts", s.Algorithm, s.Burst, s.Limit)
	case s.Algorithm == SlidingWindowLog && s.Limit > MaxLogLimit:
		return fmt.Errorf("sliding_window_log stores one entry per admitted token: limit %d is above %d; use sliding_window_counter for high limits", s.Limit, MaxLogLimit)
	case s.Algorithm == GCRA && s.Limit > s.Period.Microseconds():
		return fmt.Errorf("gcra spaces requests at least 1µs apart: limit %d per %v is faster than that; use token_bucket", s.Limit, s.Period)
	case !s.horizonOK():
		return s.horizonError()
	}
	return nil
}

// Rate is the sustained refill rate in tokens per second.
func (s Spec) Rate() float64 { return float64(s.Limit) / s.Period.Seconds() }

// Capacity is the most tokens one key can hold (or admit in one window).
func (s Spec) Capacity() int64 {
	if s.Burst > 0 {
		return s.Burst
	}
	return s.Limit
}

// window is the window length in microseconds.
func (s Spec) window() int64 { return s.Period.Microseconds() }

// Item asks a store to take Cost tokens from the bucket at Key.
type Item struct {
	Key  string
	Spec Spec
	Cost int64
}

// Group is the items of one subject: they share a Redis hash slot and are
// taken all-or-nothing in one script call.
type Group []Item

// Never is the RetryAfter of a request that can never pass (its cost is
// larger than the capacity).
const Never time.Duration = -1

// ItemResult is the state of one item's bucket after a take.
type ItemResult struct {
	// Remaining is the whole tokens left after the take (or, if the group
	// was denied, left without it).
	Remaining int64
	// RetryAfter is how long until this item alone could admit its cost:
	// 0 if it can now, Never if it never can.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
}

// Result answers one group: Allowed says whether every item was taken.
type Result struct {
	Allowed bool
	Items   []ItemResult
}

// Share is the spec of one of n equal shares of s: Limit/n per Period and
// a capacity of Capacity/n, each rounded down so that n shares never add
// up to more than s, and at least 1 so a share can admit something.
func (s Spec) Share(n int) Spec {
	if n <= 1 {
		return s
	}
	out := s
	out.Limit = max(1, s.Limit/int64(n))
	out.Burst = max(1, s.Capacity()/int64(n))
	return out
}
