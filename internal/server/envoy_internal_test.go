package server

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"

	"github.com/allot-dev/allot/internal/decide"
)

func TestCurrentLimitUnits(t *testing.T) {
	const (
		sec  = rlsv3.RateLimitResponse_RateLimit_SECOND
		min  = rlsv3.RateLimitResponse_RateLimit_MINUTE
		hour = rlsv3.RateLimitResponse_RateLimit_HOUR
		day  = rlsv3.RateLimitResponse_RateLimit_DAY
		week = rlsv3.RateLimitResponse_RateLimit_WEEK
	)
	cases := []struct {
		window   time.Duration
		capacity int64
		unit     rlsv3.RateLimitResponse_RateLimit_Unit
		mult     uint32 // 0: no multiplier
		perUnit  uint32
	}{
		{time.Second, 100, sec, 0, 100},
		{time.Minute, 100, min, 0, 100},
		{90 * time.Second, 100, sec, 90, 100},
		{2 * time.Hour, 100, hour, 2, 100},
		{24 * time.Hour, 100, day, 0, 100},
		{14 * 24 * time.Hour, 100, week, 2, 100},
		{100 * time.Millisecond, 5, sec, 0, 50},
		{1500 * time.Millisecond, 10, sec, 0, 6}, // 6.67 rounded down
		{0, 7, rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0, 7},
		{time.Second, 1 << 40, sec, 0, 1<<32 - 1},
	}
	for _, c := range cases {
		got := currentLimit(&decide.Status{PolicyID: "p", LimitName: "l", Limit: c.capacity, Window: c.window})
		assert.Equal(t, "p/l", got.Name)
		assert.Equal(t, c.unit, got.Unit, "%v", c.window)
		assert.Equal(t, c.perUnit, got.RequestsPerUnit, "%v", c.window)
		if c.mult == 0 {
			assert.Nil(t, got.UnitMultiplier, "%v", c.window)
		} else if assert.NotNil(t, got.UnitMultiplier, "%v", c.window) {
			assert.Equal(t, c.mult, got.UnitMultiplier.GetValue(), "%v", c.window)
		}
	}
}
