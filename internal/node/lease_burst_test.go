package node_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/allot-dev/allot/internal/testenv/redistest"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// Issue 44's fresh-burst point on a real node and Redis: a fresh key
// (100/s, burst 1,000; and 1,000/s) with 32 requests in flight. A lone
// node takes the burst in grants of max_share of it, then refills every
// quarter of the target period (lease.LonePaceFraction): 0.978-0.992 of
// the ideal over the first 1 s and 3 s, 0.963-0.977 over 5 s, on a quiet
// machine. Here the figures are logged and only gross breakage fails (0.9):
// under a loaded make test the first second once came to 0.940, when
// scheduling delays moved the first paced refills. The reference is what
// the ideal bucket admits of the requests this test managed to send: on
// a machine loaded enough, 32 workers sent 810 requests in the first
// second, and the node admitted all the ideal bucket would of them (0.736
// of the ideal for the rate offered). The thresholds
// (0.97 and 0.95) are asserted on virtual time, where no stall moves a
// refill: lease's TestLoneFreshBurst and the simulator's
// TestLeasedFreshBurst; docs/performance.md ("A fresh bucket's burst")
// measures them on a real node with allot-load.
func TestLeasedFreshBurst(t *testing.T) {
	if testing.Short() {
		t.Skip("8 s of load")
	}
	t.Parallel()
	redistest.Require(t)
	_, dial := rlqsNode(t, redistest.Server(t).Addr, `
policies:
  - {id: slow, match: {tier: slow}, per: [tenant], precision: leased, limits: [{name: s, algorithm: token_bucket, limit: 100, period: 1s, burst: 1000}]}
  - {id: fast, match: {tier: fast}, per: [tenant], precision: leased, limits: [{name: s, algorithm: token_bucket, limit: 1000, period: 1s, burst: 1000}]}
`)
	client := ratelimitv1.NewRateLimiterServiceClient(dial())
	for _, tc := range []struct {
		tier  string
		rate  float64
		run   time.Duration
		marks []time.Duration // the first marks[i] of the run
		least float64         // of the ideal at each mark
	}{
		{"slow", 100, 3 * time.Second, []time.Duration{time.Second, 3 * time.Second}, 0.9},
		{"fast", 1000, 5 * time.Second, []time.Duration{5 * time.Second}, 0.9},
	} {
		// Requests sent and admissions, per millisecond since the first
		// request was sent.
		sent := make([]atomic.Int64, tc.run/time.Millisecond)
		bins := make([]atomic.Int64, tc.run/time.Millisecond)
		req := &ratelimitv1.RateLimitRequest{TenantId: "fresh-" + tc.tier, Tier: tc.tier}
		start := time.Now()
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for {
					el := time.Since(start)
					if el >= tc.run {
						return
					}
					sent[el/time.Millisecond].Add(1)
					resp, err := client.CheckRateLimit(context.Background(), req)
					if assert.NoError(t, err) && resp.Decision == ratelimitv1.RateLimitResponse_ALLOWED {
						bins[el/time.Millisecond].Add(1)
					}
				}
			})
		}
		wg.Wait()
		for _, at := range tc.marks {
			var admitted int64
			for i := range at / time.Millisecond {
				admitted += bins[i].Load()
			}
			// The ideal bucket, full at the start, admits its burst and then
			// its rate when requests arrive faster (they do, thousands of
			// times, unless the machine starves this test's workers).
			ideal := 1000 + tc.rate*at.Seconds()
			over := idealOver(sent[:at/time.Millisecond], 1000, tc.rate)
			t.Logf("%s (%.0f/s, burst 1,000) first %v: admitted %d of the ideal %.0f (%.3f); of the ideal over the requests sent, %.0f (%.3f)", tc.tier, tc.rate, at, admitted, ideal, float64(admitted)/ideal, over, float64(admitted)/over)
			assert.GreaterOrEqual(t, float64(admitted)/over, tc.least, "%s over %v", tc.tier, at)
		}
	}
}

// idealOver is what an ideal token bucket (full at the start) admits of
// the requests sent per millisecond.
func idealOver(sent []atomic.Int64, burst, rate float64) float64 {
	tokens, admitted := burst, 0.0
	for i := range sent {
		tokens = min(burst, tokens+rate/1000)
		n := min(float64(sent[i].Load()), float64(int(tokens)))
		tokens -= n
		admitted += n
	}
	return admitted
}
