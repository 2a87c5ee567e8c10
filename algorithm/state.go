package algorithm

import "time"

// State is one key's stored state, as a store holds it: a tagged union of
// the algorithms' states, so that a store keeps any of them without boxing.
// The zero State is a key never seen (or forgotten when idle).
//
// Only the field of Algorithm is meaningful. A State of another algorithm
// than the Spec asks for (a policy changed a limit's algorithm) is taken
// as a new key: the old algorithm's counts do not translate.
type State struct {
	Algorithm Algorithm
	Bucket    BucketState  // TokenBucket
	GCRA      GCRAState    // GCRA
	Log       LogState     // SlidingWindowLog
	Counter   CounterState // SlidingWindowCounter
	Window    WindowState  // FixedWindow
}

// Decision is what one key answers to a take of cost at time now. Nothing
// is written by deciding: a store writes Next only when every key of the
// group admitted its cost, which is how a group is all-or-nothing.
type Decision struct {
	// OK reports whether this key alone admits the cost.
	OK bool
	// Next is the state to store if the whole group is taken. For the
	// sliding window log it may share memory with the state decided on,
	// which must not be used once Next is stored.
	Next State
	// TTL is how long Next must be kept; after that, idle, the key is
	// equivalent to a missing one and can be evicted.
	TTL time.Duration
	// Taken is the result to report if the group was taken, Kept if it
	// was denied and nothing was written. They differ in Remaining and
	// ResetAfter; RetryAfter is this key's own answer either way.
	Taken, Kept ItemResult
}

// Result returns Taken if the group was taken, else Kept.
func (d *Decision) Result(taken bool) ItemResult {
	if taken {
		return d.Taken
	}
	return d.Kept
}

// Decide answers a take of cost (>= 0) from the key whose stored state is
// st, at time now in microseconds on the store's clock. It is the maths of
// check.lua, and the stores' only way to decide.
//
// A Spec that fails Validate is a caller's bug: it is denied, RetryAfter
// Never, rather than answered with made-up maths.
func Decide(s Spec, st State, now, cost int64) Decision {
	if st.Algorithm != s.Algorithm {
		st = State{}
	}
	switch s.Algorithm {
	case TokenBucket:
		return st.Bucket.decide(s, now, cost)
	case GCRA:
		return st.GCRA.Decide(s, now, cost)
	case SlidingWindowLog:
		return st.Log.Decide(s, now, cost)
	case SlidingWindowCounter:
		return st.Counter.Decide(s, now, cost)
	case FixedWindow:
		return st.Window.Decide(s, now, cost)
	}
	never := ItemResult{RetryAfter: Never}
	return Decision{Taken: never, Kept: never}
}

// Refund gives back cost that a successful take of the same item took, at
// time now, as refund.lua does. It returns the state to store and how
// long to keep it (0: keep the key's current expiry), or ok false when
// there is nothing to give back to (a missing key, or a window that has
// passed). What each algorithm's refund restores, exactly or not, is in
// the doc comment of its state type.
func Refund(s Spec, st State, now, cost int64) (next State, ttl time.Duration, ok bool) {
	if st.Algorithm != s.Algorithm {
		return State{}, 0, false
	}
	switch s.Algorithm {
	case TokenBucket:
		return st.Bucket.refund(s, now, cost)
	case GCRA:
		return st.GCRA.refund(s, now, cost)
	case SlidingWindowLog:
		return st.Log.refund(s, cost)
	case SlidingWindowCounter:
		return st.Counter.refund(s, now, cost)
	case FixedWindow:
		return st.Window.refund(s, now, cost)
	}
	return State{}, 0, false
}

// TTL is the longest an idle key of s must be kept; after that it is
// equivalent to a missing key. Each write sets the key's TTL from its own
// state (Decision.TTL), which is never longer than this:
//
//	token_bucket           capacity/rate + 1s   (time to refill from empty)
//	gcra                   burst·T + 1s         (T = ⌈period/limit⌉)
//	sliding_window_log     period + 1s          (newest entry leaves)
//	sliding_window_counter 2·period + 1s        (this window's count, then as previous)
//	fixed_window           period + 1s          (the window ends)
//
// The extra second is slack for the store's clock resolution.
func (s Spec) TTL() time.Duration {
	switch s.Algorithm {
	case GCRA:
		return ttlMicros(s.tolerance())
	case SlidingWindowLog, FixedWindow:
		return ttlMicros(s.window())
	case SlidingWindowCounter:
		return ttlMicros(2 * s.window())
	}
	return ceilMillis(float64(s.Capacity())/s.Rate()) + time.Second
}

// ttlMicros is the TTL the scripts set for a key needed for us more
// microseconds: whole milliseconds rounded up, plus the grace second.
func ttlMicros(us int64) time.Duration {
	return time.Duration(ceilDiv(max(us, 0), 1000)+1000) * time.Millisecond
}

// ceilDiv is ⌈a/b⌉ for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
