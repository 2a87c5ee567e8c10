package coordinator

import (
	"context"
	"log/slog"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/lua"
)

// A coordinator's store is opened without the node's warm-up
// (region.Options.NoWarmUp): it loads none of the decision scripts.
func TestStartLoadsNoDecisionScripts(t *testing.T) {
	srv := redistest.Server(t)
	ctx := context.Background()
	c, err := Start(ctx, Config{
		Region: "eu", Regions: []string{"eu", "us"}, NATSURL: natstest.Server(t),
		RedisAddrs: []string{srv.Addr}, Store: policystore.NewMemory(),
		Knobs: coord.DefaultKnobs(), Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	t.Cleanup(c.Stop)

	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	exists, err := direct.ScriptExists(ctx, lua.CheckTB.Hash(), lua.Check.Hash(), lua.Refund.Hash(), lua.Lease.Hash(), lua.Return.Hash()).Result()
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false, false, false, false}, exists)
}
