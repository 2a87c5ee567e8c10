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

// The Redis and breaker flags reach node.Resilience, with region's
// defaults, from the command line or their ALLOT_ variables.
func TestRedisAndBreakerFlags(t *testing.T) {
	parse := func(args ...string) (time.Duration, region.BreakerOptions) {
		t.Helper()
		fs := flag.NewFlagSet("allot-node", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		res := resilienceFlags(fs)
		require.NoError(t, cli.Parse(fs, args))
		r := res()
		return r.RedisTimeout, r.Breaker
	}
	timeout, brk := parse()
	assert.Equal(t, region.DefaultTimeout, timeout)
	assert.Equal(t, region.BreakerOptions{Failures: region.DefaultBreakerFailures, MaxOpen: region.DefaultBreakerMaxOpen}, brk, "the first probe's wait is region's default")

	timeout, brk = parse("--redis-timeout", "10ms", "--breaker-failures", "-1")
	assert.Equal(t, 10*time.Millisecond, timeout)
	assert.Equal(t, -1, brk.Failures)

	t.Setenv("ALLOT_BREAKER_MAX_OPEN", "1s")
	_, brk = parse()
	assert.Equal(t, time.Second, brk.MaxOpen)
}
