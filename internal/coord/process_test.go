package coord

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lua"
	"github.com/allot-dev/allot/policy"
)

// A coordinator's store is opened without the node's warm-up
// (region.Options.NoWarmUp): it loads none of the decision scripts.
func TestStartLoadsNoDecisionScripts(t *testing.T) {
	srv := redistest.Server(t)
	ctx := context.Background()
	c, err := StartProcess(ctx, ProcessConfig{
		Region: "eu", Regions: []string{"eu", "us"}, NATSURL: natstest.Server(t),
		RedisAddrs: []string{srv.Addr}, PolicySource: policystore.NewMemory(),
		Knobs: DefaultKnobs(), Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	t.Cleanup(c.Stop)

	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	exists, err := direct.ScriptExists(ctx, lua.CheckTB.Hash(), lua.Check.Hash(), lua.Refund.Hash(), lua.Lease.Hash(), lua.Return.Hash()).Result()
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false, false, false, false}, exists)
}

// The first epoch already has the settings document's knobs: they are
// read before the coordinator runs, not left to the first snapshot.
func TestInitialKnobsFromTheSettingsDocument(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	st := policystore.NewMemory()
	base := DefaultKnobs()
	assert.Equal(t, base, initialKnobs(ctx, st, base, log), "no document: the defaults")

	_, err := st.PutSettings(ctx, policystore.Settings{Rebalance: &policy.RebalanceKnobs{
		Interval: policy.Duration(200 * time.Millisecond), ShareTTL: policy.Duration(time.Second)}}, policystore.AnyVersion)
	require.NoError(t, err)
	want := base
	want.Interval, want.ShareTTL = 200*time.Millisecond, time.Second
	assert.Equal(t, want, initialKnobs(ctx, st, base, log))

	// Valid alone, but under two default intervals once combined: the
	// defaults stay (the Follower refuses it the same way).
	_, err = st.PutSettings(ctx, policystore.Settings{Rebalance: &policy.RebalanceKnobs{ShareTTL: policy.Duration(time.Second)}}, policystore.AnyVersion)
	require.NoError(t, err)
	assert.Equal(t, base, initialKnobs(ctx, st, base, log))
}
