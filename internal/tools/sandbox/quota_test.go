package sandbox_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/internal/tools/sandbox"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// The sandbox's global daily quota (tenant-exports-daily, 1,000 a day):
// a tenant that spends it in us gets all of it there, not a third, and
// once the coordinators exchanged the counts eu refuses the next export.
func TestSandboxGlobalQuota(t *testing.T) {
	redistest.Require(t)
	if testing.Short() {
		t.Skip("starts the 3-region sandbox")
	}
	if left := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)); left < time.Minute {
		t.Skip("too close to the end of the UTC day for a daily window")
	}
	ctx := context.Background()
	sb, err := sandbox.Start(ctx, sandbox.Config{Policies: "../../../examples/sandbox-policies.yaml", Masters: 1, Nodes: 1, Interval: 300 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sb.Stop()) })
	dial := func(region string) func(int) (ratelimitv1.RateLimitResponse_Decision, bool) {
		c, err := sandbox.DialRegion(sb.Region(region))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return func(i int) (ratelimitv1.RateLimitResponse_Decision, bool) {
			// A new client each time, so that only the tenant's quota binds.
			a, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t-exports", Route: "/v1/export", ClientIdentifier: "c" + strconv.Itoa(i)})
			require.NoError(t, err)
			return a.Decision, a.Degraded
		}
	}
	us, eu := dial("us"), dial("eu")
	// The nodes run with production deadlines (5 ms): under -race on a
	// loaded machine a call may miss one and be decided without the store
	// (degraded, failed open here). Only the store's answers count.
	// A call that timed out may still have been counted by Redis, so the
	// store's own ALLOWED answers are 1,000 less at most the degraded ones.
	allowed, degraded, throttled := 0, 0, false
	for i := 0; i < 2000 && !throttled; i++ {
		d, deg := us(i)
		switch {
		case deg:
			degraded++
		case d == ratelimitv1.RateLimitResponse_ALLOWED:
			allowed++
		case d == ratelimitv1.RateLimitResponse_THROTTLED:
			throttled = true
		}
	}
	t.Logf("us: %d allowed by the store, %d decided without it, then throttled", allowed, degraded)
	require.True(t, throttled, "us never reached the quota")
	require.LessOrEqual(t, allowed, 1000, "never more than the quota")
	require.GreaterOrEqual(t, allowed, 1000-degraded, "us alone gets the whole global quota, not L/3")
	require.Greater(t, allowed, 1000/3, "us alone gets more than L/3")
	require.Eventually(t, func() bool {
		d, degraded := eu(-1)
		return !degraded && d == ratelimitv1.RateLimitResponse_THROTTLED
	}, 20*time.Second, 50*time.Millisecond, "eu never learnt us's count") // polling the node
}
