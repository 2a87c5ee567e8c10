package algorithm

import (
	"math"
	"time"
)

// BucketState is a token bucket as stored: Tokens held at time TS
// (microseconds on the store's clock).
//
// At time now >= TS the bucket holds min(burst, Tokens + (now-TS)*r) with
// r = Limit/Period tokens per second. A take of cost c succeeds iff that
// amount is >= c, and leaves it minus c. A new bucket starts full.
type BucketState struct {
	Tokens float64
	TS     int64
	Valid  bool
}

// Refill returns the state advanced to now (microseconds).
func (b BucketState) Refill(s Spec, now int64) BucketState {
	capacity := float64(s.Capacity())
	if !b.Valid {
		return BucketState{Tokens: capacity, TS: now, Valid: true}
	}
	elapsed := now - b.TS
	if elapsed < 0 {
		elapsed = 0 // a store clock that steps back must not mint or burn tokens
	}
	t := math.Min(capacity, b.Tokens+float64(elapsed)*s.Rate()/1e6)
	return BucketState{Tokens: t, TS: max(now, b.TS), Valid: true}
}

// Check reports, for a refilled bucket, what a take of cost would give:
// the remaining whole tokens, the wait until it could pass and the wait
// until the bucket is full.
func (b BucketState) Check(s Spec, cost int64) (ok bool, r ItemResult) {
	rate := s.Rate()
	capacity := float64(s.Capacity())
	tokens := b.Tokens
	ok = tokens >= float64(cost)
	switch {
	case cost > s.Capacity():
		r.RetryAfter = Never
	case !ok:
		r.RetryAfter = ceilMicros((float64(cost) - tokens) / rate)
	}
	if ok {
		tokens -= float64(cost)
	}
	r.Remaining = int64(math.Floor(tokens))
	r.ResetAfter = ceilMicros((capacity - tokens) / rate)
	return ok, r
}

func (b BucketState) decide(s Spec, now, cost int64) Decision {
	st := b.Refill(s, now)
	ok, taken := st.Check(s, cost)
	kept := taken
	if ok {
		// Check assumes the take; a denied group leaves the bucket as is.
		_, untouched := st.Check(s, 0)
		kept.Remaining, kept.ResetAfter = untouched.Remaining, untouched.ResetAfter
	}
	next := st
	next.Tokens -= float64(cost)
	return Decision{OK: ok, Next: State{Algorithm: TokenBucket, Bucket: next}, TTL: s.TTL(), Taken: taken, Kept: kept}
}

// refund credits cost to an existing bucket, capped at the capacity, after
// refilling it to now. Exact: the tokens a take removed are put back, and
// the cap only drops what the bucket would have refilled anyway.
func (b BucketState) refund(s Spec, now, cost int64) (State, time.Duration, bool) {
	if !b.Valid {
		return State{}, 0, false // a missing bucket is full
	}
	st := b.Refill(s, now)
	st.Tokens = math.Min(float64(s.Capacity()), st.Tokens+float64(cost))
	return State{Algorithm: TokenBucket, Bucket: st}, s.TTL(), true
}

func ceilMicros(sec float64) time.Duration {
	return time.Duration(math.Ceil(sec*1e6)) * time.Microsecond
}

func ceilMillis(sec float64) time.Duration {
	return time.Duration(math.Ceil(sec*1e3)) * time.Millisecond
}
