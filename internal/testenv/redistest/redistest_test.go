package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/redistest"
)

func TestServerLifecycle(t *testing.T) {
	srv := redistest.Server(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond})
	defer c.Close()
	ctx := context.Background()

	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())

	srv.Pause()
	require.Error(t, c.Ping(ctx).Err(), "a paused server must not answer")
	srv.Continue()
	require.Eventually(t, func() bool { return c.Ping(ctx).Err() == nil }, 5*time.Second, 10*time.Millisecond)

	srv.Restart()
	require.Eventually(t, func() bool { return c.Ping(ctx).Err() == nil }, 5*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, c.Get(ctx, "k").Err(), redis.Nil, "restart loses data: persistence is off")

	srv.Kill()
	require.Error(t, c.Ping(ctx).Err())
	srv.Kill() // idempotent
}
