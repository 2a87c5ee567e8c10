// Package algorithm defines what a limit is (Spec), what one check asks of
// a store (Item, Group) and what it answers (Result), and holds the pure
// maths of each algorithm.
//
// The maths here is the in-process twin of the Lua scripts in package lua:
// same state, same formulas, time passed in as microseconds, no I/O. The
// standalone store runs it directly; tests compare it with Redis.
package algorithm

import (
	"fmt"
	"time"
)

// Algorithm names a rate-limiting algorithm.
type Algorithm uint8

// The algorithms Allot knows. Their names are the policy file's spelling.
const (
	TokenBucket Algorithm = iota + 1
)

var names = map[Algorithm]string{
	TokenBucket: "token_bucket",
}

// String returns the policy-file spelling of a.
func (a Algorithm) String() string {
	if s, ok := names[a]; ok {
		return s
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// Code is the short token the Lua scripts switch on.
func (a Algorithm) Code() string {
	switch a {
	case TokenBucket:
		return "tb"
	}
	return ""
}

// Parse returns the algorithm spelled s in a policy file.
func Parse(s string) (Algorithm, error) {
	for a, n := range names {
		if n == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q", s)
}

// Spec is one limit: Limit tokens per Period, with a capacity of Burst.
//
// For a token bucket the refill rate is Limit/Period tokens per second and
// the bucket holds at most Burst tokens (Burst defaults to Limit).
type Spec struct {
	Algorithm Algorithm
	Limit     int64
	Period    time.Duration
	Burst     int64
}

// Rate is the sustained refill rate in tokens per second.
func (s Spec) Rate() float64 { return float64(s.Limit) / s.Period.Seconds() }

// Capacity is the most tokens one key can hold.
func (s Spec) Capacity() int64 {
	if s.Burst > 0 {
		return s.Burst
	}
	return s.Limit
}

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
