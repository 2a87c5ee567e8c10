package main

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/region"
)

// --redis-timeout keeps its default; --redis-timeout-margin (or its
// ALLOT_ variable) reaches node.Resilience, 0 (automatic) by default.
func TestRedisTimeoutFlags(t *testing.T) {
	parse := func(args ...string) (time.Duration, time.Duration) {
		t.Helper()
		fs := flag.NewFlagSet("allot-node", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		res := resilienceFlags(fs)
		require.NoError(t, cli.Parse(fs, args))
		r := res()
		return r.RedisTimeout, r.RedisTimeoutMargin
	}
	timeout, margin := parse()
	assert.Equal(t, region.DefaultTimeout, timeout)
	assert.Zero(t, margin, "automatic: min(1ms, timeout/5)")

	timeout, margin = parse("--redis-timeout", "10ms", "--redis-timeout-margin", "1500us")
	assert.Equal(t, 10*time.Millisecond, timeout)
	assert.Equal(t, 1500*time.Microsecond, margin)

	t.Setenv("ALLOT_REDIS_TIMEOUT_MARGIN", "-1ns")
	_, margin = parse()
	assert.Equal(t, -time.Nanosecond, margin, "negative: no margin")
}
