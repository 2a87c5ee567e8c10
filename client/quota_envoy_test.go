package client

import (
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/internal/testenv/rlqsfilter"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// The client applies a sequence of assignments as the port of Envoy's
// filter does: a token bucket equal in max_tokens, tokens_per_fill and
// fill_interval.nanos is kept with its spent tokens (even if
// fill_interval.seconds differs), another replaces it with the old one's
// ratio of tokens left, and one after a blanket rule starts full. Both
// decide the same requests on the same virtual clock.
func TestQuotaAppliesAssignmentsAsEnvoy(t *testing.T) {
	tb := func(maxTokens, per uint32, fill time.Duration) *typev3.RateLimitStrategy {
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: maxTokens, TokensPerFill: wrapperspb.UInt32(per), FillInterval: durationpb.New(fill)}}}
	}
	deny := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	steps := []struct {
		at       time.Duration
		strategy *typev3.RateLimitStrategy
	}{
		{0, tb(100, 100, time.Second)},
		{1500 * time.Millisecond, tb(100, 100, 2*time.Second)}, // equal to Envoy: kept
		{3 * time.Second, tb(50, 200, time.Second)},            // replaced: the ratio left
		{4 * time.Second, deny},
		{5 * time.Second, tb(30, 10, time.Second)}, // after a blanket rule: full
	}
	const end = 6 * time.Second

	port, err := rlqsfilter.NewClient(rlqsfilter.Config{Domain: "d"}, nil)
	require.NoError(t, err)
	req := &ratelimitv1.RateLimitRequest{TenantId: "t"}
	id := bucketID(req)
	base := time.Now().UnixNano()
	var now time.Duration
	q := &quota{keys: map[denyKey]*qkey{}, warm: map[denyKey]int32{}, unbatchable: map[denyKey]int64{},
		now: func() int64 { return base + int64(now) }}
	b := &qkey{id: id, key: keyOf(req)}
	q.keys[b.key] = b
	port.Allow(0, id) // the port's bucket exists from its first request

	// Per step, the requests each admits: the two refill the same tokens
	// in different floating-point forms, so a request at a token's exact
	// boundary may go either way; a step's count may differ by one.
	var out ratelimitv1.RateLimitResponse
	next := 0
	ports, clients := make([]int, len(steps)), make([]int, len(steps))
	for now = 0; now < end; now += 10 * time.Millisecond {
		if next < len(steps) && now >= steps[next].at {
			resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{
				BucketId: &rlqsv3.BucketId{Bucket: id},
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
					AssignmentTimeToLive: durationpb.New(time.Minute), RateLimitStrategy: steps[next].strategy}},
			}}}
			port.Apply(now, resp)
			q.apply(resp)
			next++
		}
		for range 3 {
			if port.Allow(now, id) {
				ports[next-1]++
			}
			require.True(t, b.decide(base+int64(now), &out))
			if out.Decision == ratelimitv1.RateLimitResponse_ALLOWED {
				clients[next-1]++
			}
		}
	}
	require.Equal(t, len(steps), next)
	t.Logf("admitted per step: Envoy's port %v, the client %v", ports, clients)
	for i := range steps {
		assert.InDelta(t, ports[i], clients[i], 1, "step %d", i)
	}
}
