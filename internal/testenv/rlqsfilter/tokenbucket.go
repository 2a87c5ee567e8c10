package rlqsfilter

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// minFillRate is token_bucket_impl.cc's kMinFillRate: one token a year.
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// cppMin and cppMax are std::min and std::max for doubles: a NaN in the
// second place loses, in the first it wins. Go's min and max return NaN
// for either; the NaN cases are reachable here (an infinite fill rate
// times a zero time step), so the port keeps C++'s order.
func cppMin(a, b float64) float64 {
	if b < a {
		return b
	}
	return a
}

func cppMax(a, b float64) float64 {
	if a < b {
		return b
	}
	return a
}

// tokenBucket ports AtomicTokenBucketImpl (source/common/common/
// token_bucket_impl.h/.cc) as the RLQS filter uses it: its whole state is
// the time at which the bucket was empty, in seconds of the monotonic
// clock; the tokens are derived from it. The core is single-threaded, so
// the compare-and-swap loop of consume is a plain update.
type tokenBucket struct {
	serial    int // identity, for tests that check a bucket is kept
	maxTokens float64
	fillRate  float64
	emptyAt   float64 // time_in_seconds_
}

// newTokenBucket ports the constructor taking initial_tokens (the one
// createTokenBucketFromAction calls at the pinned commit): no tokens
// means the bucket starts empty; there is no check of the clock (later
// versions' init_fill constructor starts empty, with an ENVOY_BUG, when
// max_tokens / fill_rate is not below the clock's seconds).
func newTokenBucket(serial int, maxTokens uint64, fillRate float64, initialTokens uint64, now time.Duration) *tokenBucket {
	tb := &tokenBucket{serial: serial, maxTokens: float64(maxTokens), fillRate: cppMax(math.Abs(fillRate), minFillRate)}
	t := now.Seconds()
	if initialTokens != 0 {
		t -= float64(initialTokens) / tb.fillRate
	}
	tb.emptyAt = t
	return tb
}

// consume1 ports consume(1, /*allow_partial=*/false) through the consume
// template of token_bucket_impl.h: take one whole token if there is one.
func (tb *tokenBucket) consume1(now time.Duration) bool {
	t := now.Seconds()
	total := cppMin(tb.maxTokens, (t-tb.emptyAt)*tb.fillRate)
	if !(total >= 1) {
		return false
	}
	tb.emptyAt = t - (total-1)/tb.fillRate
	return true
}

// remaining ports remainingTokens.
func (tb *tokenBucket) remaining(now time.Duration) float64 {
	return cppMin(tb.maxTokens, (now.Seconds()-tb.emptyAt)*tb.fillRate)
}

// wholeSeconds is absl::ToInt64Seconds of a proto Duration's seconds plus
// nanos: truncated toward zero, so 0.9 s is 0 and 1 h + 0.5 s is 3600.
func wholeSeconds(seconds int64, nanos int32) int64 {
	s := seconds + int64(nanos)/1e9
	rem := int64(nanos) % 1e9
	switch {
	case s > 0 && rem < 0:
		s--
	case s < 0 && rem > 0:
		s++
	}
	return s
}

// fillRate is createTokenBucketFromAction's rate (global_client_impl.cc):
// tokens_per_fill (0 when unset: the wrapper's default value, not the 1
// the proto's comment promises) over the WHOLE seconds of fill_interval,
// as doubles. An interval under 1 s divides by zero: +Inf for a positive
// tokens_per_fill (a bucket that never runs dry), NaN for zero.
func fillRate(tb *typev3.TokenBucket) float64 {
	secs := wholeSeconds(tb.GetFillInterval().GetSeconds(), tb.GetFillInterval().GetNanos())
	return float64(tb.GetTokensPerFill().GetValue()) / float64(secs)
}

// tokenBucketsEq ports protoTokenBucketsEq (global_client_impl.cc): only
// max_tokens, tokens_per_fill and fill_interval.nanos are compared, so
// two intervals that differ in whole seconds are "equal".
func tokenBucketsEq(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// tokenBucketFromStrategy ports createTokenBucketFromAction: a new bucket
// starts full, or, replacing one, with the old bucket's ratio of remaining
// to max tokens applied to the new max_tokens, truncated to whole tokens
// (uint64_t initial_tokens); an empty old bucket makes an empty new one.
func tokenBucketFromStrategy(serial int, s *typev3.RateLimitStrategy, old *tokenBucket, now time.Duration) *tokenBucket {
	tb := s.GetTokenBucket()
	maxTokens := uint64(tb.GetMaxTokens())
	initial := maxTokens
	if old != nil {
		x := float64(maxTokens) * (old.remaining(now) / old.maxTokens)
		// C++ converts a negative or NaN double to uint64_t with undefined
		// behaviour (an old bucket of max_tokens 0, or a clock that ran
		// back); the port takes 0.
		switch {
		case !(x >= 0):
			initial = 0
		case x >= float64(maxTokens):
			initial = maxTokens
		default:
			initial = uint64(x)
		}
	}
	return newTokenBucket(serial, maxTokens, fillRate(tb), initial, now)
}
