package rlqs

import (
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// sent is the token bucket last sent for a bucket.
type sent struct {
	rate float64 // requests/s it was made for
	tb   *typev3.TokenBucket
}

// precision is the fewest tokens one fill carries: the fill interval is
// the fewest whole seconds that bring that many at the part's rate, so
// tokens_per_fill / fill_interval rounds the rate by at most 1 %.
const precision = 100

// burstWindow is the time of its part a client's token bucket holds.
const burstWindow = 100 * time.Millisecond

// maxFill is the longest fill interval sent (a rate under 100/day is
// rounded coarser).
const maxFill = 24 * time.Hour

// tokenBucket is the strategy for rate requests/s with burst max_tokens:
// fill_interval whole seconds (Envoy divides tokens_per_fill by
// absl::ToInt64Seconds of it: under 1 s would be an unbounded rate).
func tokenBucket(rate float64, burst int64) *typev3.TokenBucket {
	fill := time.Second
	if rate*fill.Seconds() < precision {
		fill = time.Duration(min(math.Ceil(precision/max(rate, 1e-9)), maxFill.Seconds())) * time.Second
	}
	per := max(math.Floor(rate*fill.Seconds()), 1)
	return &typev3.TokenBucket{
		MaxTokens:     uint32(min(max(burst, 1), math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(min(per, math.MaxUint32))),
		FillInterval:  durationpb.New(fill),
	}
}

// rate answers b with its part, rate requests/s, and records the claim
// on each region bucket until the assignment's TTL ends. While rate is
// within hysteresis of what was last sent, the same strategy is sent
// again, byte-identical: Envoy then keeps its bucket and the tokens in
// it. A new one differs in max_tokens or tokens_per_fill, the only fields
// Envoy compares (with fill_interval.nanos, which is always 0 here).
func (st *stream) rate(b *bucket, id *rlqsv3.BucketId, rate float64, now time.Time) (*rlqsv3.RateLimitQuotaResponse_BucketAction, bool) {
	ttl := st.ttl()
	same := b.sent != nil && math.Abs(rate-b.sent.rate) <= hysteresis*b.sent.rate
	if !same {
		if rate <= 0 || math.IsInf(rate, 0) || math.IsNaN(rate) {
			rate = 0
		}
		// The bucket's burst reaches the client through the rate (avail,
		// lua/part.lua); the bucket Envoy starts full holds a tenth of a
		// second of the part, enough for requests that come in clumps.
		tb := tokenBucket(rate, int64(math.Ceil(rate*burstWindow.Seconds())))
		if old := b.sent; old != nil && tb.MaxTokens == old.tb.MaxTokens &&
			tb.TokensPerFill.GetValue() == old.tb.TokensPerFill.GetValue() {
			// Only fill_interval.seconds differs, which Envoy does not
			// compare: make the bucket a new one.
			if tb.MaxTokens > 1 {
				tb.MaxTokens--
			} else {
				tb.MaxTokens++
			}
		}
		b.sent = &sent{rate: rate, tb: tb}
	}
	claim := b.sent.rate * float64(b.grant.Cost)
	if b.sent.rate == 0 {
		b.sent = nil
		claim = 0
	}
	st.s.split.claim(b.cons, claim, now.Add(ttl))
	if claim == 0 {
		return blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl), false
	}
	return assignment(id, ttl, b.sent.tb), same
}

// abandon tells the client to forget the bucket: its next request makes
// a new one.
func abandon(id *rlqsv3.BucketId) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
}

func blanket(id *rlqsv3.BucketId, rule typev3.RateLimitStrategy_BlanketRule, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return action(id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}})
}

func assignment(id *rlqsv3.BucketId, ttl time.Duration, tb *typev3.TokenBucket) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return action(id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tb}})
}

func action(id *rlqsv3.BucketId, ttl time.Duration, strategy *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl.Truncate(time.Second)),
				RateLimitStrategy:    strategy,
			},
		},
	}
}
