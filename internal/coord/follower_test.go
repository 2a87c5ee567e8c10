package coord

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/coord/demand"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/rebalance"
)

// noWrites is a ShareWriter for a coordinator that is never run.
type noWrites struct{}

func (noWrites) WriteShares(context.Context, []ShareUpdate) error { return nil }
func (noWrites) ReadShares(context.Context, []string, Limits) (map[string]rebalance.Share, error) {
	return nil, nil
}

// followSource wires a coordinator to st as StartProcess does and watches until
// the test ends. The coordinator is not run: SetKnobs and Knobs do not
// need it, and its epochs would only add timing to the test.
func followSource(t *testing.T, st policystore.Source, flags Knobs) *Coordinator {
	t.Helper()
	c, err := New(Config{
		Region: "eu", Regions: []string{"eu", "us"}, Transport: NewHub().Join("eu"),
		Demand: demand.DrainFunc(func(func(string, int64, int64)) {}), Writer: noWrites{},
		Limits: StaticLimits{}, Knobs: flags, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	fl := &Follower{Source: st.String(), Limits: NewPolicyLimits(nil), Coord: c, Base: flags, Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- st.Watch(ctx, fl.Apply) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return c
}

func TestCoordinatorFollowsTheSettingsDocument(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) policystore.Source{
		"memory": func(*testing.T) policystore.Source { return policystore.NewMemory() },
		"file":   openFileSource,
	} {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			ctx := context.Background()
			flags := DefaultKnobs()
			c := followSource(t, st, flags)
			require.Equal(t, flags, c.Knobs())

			decay, hh := 0.5, 0.3
			_, err := st.PutSettings(ctx, policystore.Settings{DefaultTier: "free", Rebalance: &policy.RebalanceKnobs{
				Interval: policy.Duration(2 * time.Second), HeavyHitter: &hh, Decay: &decay,
			}}, policystore.AnyVersion)
			require.NoError(t, err)
			want := flags
			want.Interval, want.HeavyHitter, want.Decay = 2*time.Second, 0.3, 0.5
			require.Eventually(t, func() bool { return c.Knobs() == want }, 10*time.Second, 5*time.Millisecond)

			floor := 0.0
			_, err = st.PutSettings(ctx, policystore.Settings{Rebalance: &policy.RebalanceKnobs{Floor: &floor}}, policystore.AnyVersion)
			require.NoError(t, err)
			want = flags
			want.Floor = 0
			require.Eventually(t, func() bool { return c.Knobs() == want }, 10*time.Second, 5*time.Millisecond)

			// Removing the block restores the flags.
			_, err = st.PutSettings(ctx, policystore.Settings{}, policystore.AnyVersion)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return c.Knobs() == flags }, 10*time.Second, 5*time.Millisecond)
		})
	}
}

// A store holding an invalid set (written by another tool: the admin API
// would refuse it) changes neither the limits nor the knobs.
func TestCoordinatorIgnoresAnInvalidSet(t *testing.T) {
	flags := DefaultKnobs()
	c, err := New(Config{
		Region: "eu", Regions: []string{"eu", "us"}, Transport: NewHub().Join("eu"),
		Demand: demand.DrainFunc(func(func(string, int64, int64)) {}), Writer: noWrites{},
		Limits: StaticLimits{}, Knobs: flags, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	limits := NewPolicyLimits(nil)
	fl := &Follower{Source: "test", Limits: limits, Coord: c, Base: flags, Log: slog.New(slog.DiscardHandler)}
	global := policy.Policy{ID: "g", Scope: policy.ScopeGlobal, Per: []policy.Field{policy.FieldTenant},
		Limits: []policy.Limit{{Name: "l", Algorithm: "token_bucket", Limit: 10, Period: policy.Duration(time.Second)}}}
	key := "rl:{tenant=a}:g:l"

	bad, good := 2.0, 0.6
	fl.Apply(policystore.Snapshot{File: &policy.File{
		Rebalance: &policy.RebalanceKnobs{Decay: &bad, Smoothing: &good},
		Policies:  []policy.Policy{global},
	}})
	assert.Equal(t, flags, c.Knobs(), "an invalid set moves no knob, not even its valid ones")
	_, ok := limits.Global(key)
	assert.False(t, ok, "nor the limits")

	fl.Apply(policystore.Snapshot{File: &policy.File{Rebalance: &policy.RebalanceKnobs{Smoothing: &good}, Policies: []policy.Policy{global}}})
	want := flags
	want.Smoothing = good
	assert.Equal(t, want, c.Knobs())
	_, ok = limits.Global(key)
	assert.True(t, ok)

	// Valid on its own, but 40m intervals clash with the 1h share TTL
	// flag it leaves alone: SetKnobs refuses and the knobs stay.
	fl.Apply(policystore.Snapshot{File: &policy.File{Rebalance: &policy.RebalanceKnobs{Interval: policy.Duration(40 * time.Minute)}}})
	assert.Equal(t, want, c.Knobs())
}

func openFileSource(t *testing.T) policystore.Source {
	t.Helper()
	path := t.TempDir() + "/p.yaml"
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	st, err := policystore.OpenFile(path, policystore.Options{PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, st.Close()) })
	return st
}
