package ratelimitheaders_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/ratelimitheaders"
	"github.com/allot-dev/allot/ratelimitheaders/ratelimitheaderstest"
)

func TestSetThrottledMatchesSeed(t *testing.T) {
	// Seed 002, 4.2: a burst limit of 100 per second and a daily one.
	h := http.Header{}
	h.Set("RateLimit", `"stale";r=1`) // replaced, not appended
	ratelimitheaders.Set(h, &ratelimitv1.RateLimitResponse{
		Decision: ratelimitv1.RateLimitResponse_THROTTLED, Limit: 100, Remaining: 0, ResetAfterSeconds: 3, RetryAfterMs: 2001,
		Statuses: []*ratelimitv1.LimitStatus{
			{PolicyId: "api", LimitName: "burst", Limit: 100, Remaining: 0, ResetAfterSeconds: 20, WindowSeconds: 1, Violated: true},
			{PolicyId: "api", LimitName: "daily", Limit: 50000, Remaining: 41000, ResetAfterSeconds: 15552, WindowSeconds: 86400},
		},
	})
	assert.Equal(t, `"api/burst";q=100;w=1, "api/daily";q=50000;w=86400`, h.Get("RateLimit-Policy"))

	// q is the quota per window when the node sends it, not the burst.
	hq := http.Header{}
	ratelimitheaders.Set(hq, &ratelimitv1.RateLimitResponse{Limit: 400, Remaining: 399, Statuses: []*ratelimitv1.LimitStatus{
		{PolicyId: "ip", LimitName: "s", Limit: 400, Quota: 200, Remaining: 399, WindowSeconds: 1},
	}})
	assert.Equal(t, `"ip/s";q=200;w=1`, hq.Get("RateLimit-Policy"))
	// t of the violated limit is capped at Retry-After (draft-11 section 6).
	assert.Equal(t, `"api/burst";r=0;t=3, "api/daily";r=41000;t=15552`, h.Get("RateLimit"))
	assert.Equal(t, "3", h.Get("Retry-After"))
	assert.Equal(t, "100", h.Get("X-RateLimit-Limit"))
	assert.Equal(t, "0", h.Get("X-RateLimit-Remaining"))
	assert.Equal(t, "3", h.Get("X-RateLimit-Reset"))
	_, err := ratelimitheaderstest.Parse(h)
	require.NoError(t, err)
}

func TestNamesAreEscapedStrings(t *testing.T) {
	for _, name := range []string{`a"b`, `a\b`, "a\x00b", "é", "100%", "a,b;c=d"} {
		h := http.Header{}
		ratelimitheaders.Set(h, &ratelimitv1.RateLimitResponse{
			Statuses: []*ratelimitv1.LimitStatus{{PolicyId: name, LimitName: "l", Limit: 1, Remaining: -5, ResetAfterSeconds: 1 << 62, WindowSeconds: 0}},
		})
		f, err := ratelimitheaderstest.Parse(h)
		require.NoError(t, err, "%q -> %q", name, h.Get("RateLimit-Policy"))
		require.Len(t, f.Policy, 1)
		assert.Equal(t, []string{"q"}, f.Policy[0].Keys, "no w for a limit without a period")
		assert.Equal(t, int64(0), f.RateLimit[0].Params["r"], "clamped to non-negative")
		assert.Equal(t, int64(999_999_999_999_999), f.RateLimit[0].Params["t"], "clamped to the largest Integer")
	}
	h := http.Header{}
	ratelimitheaders.Set(h, &ratelimitv1.RateLimitResponse{Statuses: []*ratelimitv1.LimitStatus{{PolicyId: `q"\`, LimitName: "l", Limit: 1}}})
	f, err := ratelimitheaderstest.Parse(h)
	require.NoError(t, err)
	assert.Equal(t, `q"\/l`, f.Policy[0].Name, "quote and backslash round-trip")
}

func TestBypass(t *testing.T) {
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "5")
	ratelimitheaders.SetBypass(h)
	assert.Equal(t, http.Header{"X-Ratelimit-Status": {"Bypass"}}, h)
}
