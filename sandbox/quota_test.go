package sandbox_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/redistest"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/sandbox"
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
	sb, err := sandbox.Start(ctx, sandbox.Config{Policies: "../examples/sandbox-policies.yaml", Masters: 1, Nodes: 1, Interval: 300 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sb.Stop()) })
	dial := func(region string) func(int) ratelimitv1.RateLimitResponse_Decision {
		c, err := sandbox.DialRegion(sb.Region(region))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return func(i int) ratelimitv1.RateLimitResponse_Decision {
			// A new client each time, so that only the tenant's quota binds.
			a, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t-exports", Route: "/v1/export", ClientIdentifier: "c" + strconv.Itoa(i)})
			require.NoError(t, err)
			require.False(t, a.Degraded)
			return a.Decision
		}
	}
	us, eu := dial("us"), dial("eu")
	allowed := 0
	for i := range 1000 {
		if us(i) == ratelimitv1.RateLimitResponse_ALLOWED {
			allowed++
		}
	}
	require.Equal(t, 1000, allowed, "us alone gets the whole global quota, not L/3")
	require.Eventually(t, func() bool { return eu(-1) == ratelimitv1.RateLimitResponse_THROTTLED },
		20*time.Second, 50*time.Millisecond, "eu never learnt us's count") // polling the node
	require.Equal(t, ratelimitv1.RateLimitResponse_THROTTLED, us(-2), "us's own count is spent too")
}
