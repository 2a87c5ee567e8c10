package sandbox_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/internal/tools/sandbox"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// The sandbox answers through every region's nodes, and Stop leaves no
// listener (so no redis-server) behind.
func TestStartDecideStop(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	sb, err := sandbox.Start(ctx, sandbox.Config{Policies: "../../../examples/sandbox-policies.yaml", Masters: 1, Nodes: 1})
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			sb.Stop()
		}
	})
	var redisAddrs []string
	for _, r := range sb.Regions() {
		redisAddrs = append(redisAddrs, r.RedisAddrs...)
		c, err := sandbox.DialRegion(r)
		require.NoError(t, err)
		d, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{ClientIdentifier: "k0"})
		require.NoError(t, c.Close())
		require.NoError(t, err, r.Name)
		require.Equal(t, ratelimitv1.RateLimitResponse_ALLOWED, d.Decision, r.Name)
	}
	stopped = true
	require.NoError(t, sb.Stop())
	for _, a := range redisAddrs {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			c.Close()
		}
		require.Error(t, err, "redis-server %s still listens after Stop", a)
	}
}

// A Start that fails part-way returns its error (it used to panic in its
// own clean-up) and stops what it had started.
func TestFailedStartStopsWhatItStarted(t *testing.T) {
	redistest.Require(t)
	var started []string
	_, err := sandbox.Start(context.Background(), sandbox.Config{
		Policies: "../../../examples/sandbox-policies.yaml", Masters: 1, Nodes: 1,
		RedisProxy: func(region string, _ int, target string) (string, error) {
			if region == "eu" {
				return "", errors.New("injected failure")
			}
			started = append(started, target)
			return target, nil
		},
	})
	require.ErrorContains(t, err, "injected failure")
	require.NotEmpty(t, started, "us's redis-server was started before eu failed")
	for _, a := range started {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			c.Close()
		}
		require.Error(t, err, "redis-server %s still listens after a failed Start", a)
	}
}
