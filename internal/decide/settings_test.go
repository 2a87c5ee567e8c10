package decide_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
)

// noSource is a lease.Source for tests that build lease limits but never
// take from them.
type noSource struct{}

func (noSource) Lease(context.Context, []lease.Group) ([]lease.Reply, error) {
	return nil, errors.New("not in this test")
}
func (noSource) Return(context.Context, []lease.ReturnItem) (int64, error) { return 0, nil }

// A node picks up the settings document's lease defaults without a
// restart: after the change its lease limits (which size every new grant)
// carry them (cold_hits included); a policy's own lease knobs still win,
// and knobs neither sets keep the manager's defaults.
func TestLeaseDefaultsFollowTheSettingsDocument(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	st := policystore.NewMemory()
	leased := func(id string, k *policy.LeaseKnobs) policy.Policy {
		return policy.Policy{ID: id, Per: []policy.Field{policy.FieldTenant}, Precision: policy.PrecisionLeased, Lease: k,
			Limits: []policy.Limit{{Name: "l", Algorithm: "token_bucket", Limit: 100, Period: policy.Duration(time.Second)}}}
	}
	_, err := st.Put(ctx, leased("own", &policy.LeaseKnobs{TTL: policy.Duration(3 * time.Second)}), policystore.AnyVersion)
	require.NoError(t, err)
	_, err = st.Put(ctx, leased("plain", nil), policystore.AnyVersion)
	require.NoError(t, err)

	flags := lease.Config{TargetPeriod: time.Second, TTL: 2 * time.Second, LowWatermark: 0.25, MaxShare: 0.5, ColdHits: lease.DefaultColdHits}
	m, err := lease.New(lease.Options{Source: noSource{}, Defaults: flags, Clock: lease.NewManualClock(), SweepEvery: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	set, err := policystore.NewReloader(st, nil).Load(ctx)
	require.NoError(t, err)
	d := decide.New(decide.Config{Policies: set, Leases: m})
	assert.Equal(t, []lease.Config{flags}, d.LeaseConfigs("plain"))
	own := flags
	own.TTL = 3 * time.Second
	assert.Equal(t, []lease.Config{own}, d.LeaseConfigs("own"))

	done := make(chan error, 1)
	go func() { done <- policystore.NewReloader(st, nil).Run(ctx, d) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	_, err = st.PutSettings(ctx, policystore.Settings{Lease: &policy.LeaseKnobs{
		TargetPeriod: policy.Duration(500 * time.Millisecond), TTL: policy.Duration(4 * time.Second), MaxShare: 0.2, ColdHits: 4,
	}}, policystore.AnyVersion)
	require.NoError(t, err)

	plain := lease.Config{TargetPeriod: 500 * time.Millisecond, TTL: 4 * time.Second, LowWatermark: 0.25, MaxShare: 0.2, ColdHits: 4}
	require.Eventually(t, func() bool {
		c := d.LeaseConfigs("plain")
		return len(c) == 1 && c[0] == plain
	}, 10*time.Second, 5*time.Millisecond)
	own = plain
	own.TTL = 3 * time.Second
	assert.Equal(t, []lease.Config{own}, d.LeaseConfigs("own"), "the policy's own ttl wins over the document's")

	// Removing the block restores the manager's defaults.
	_, err = st.PutSettings(ctx, policystore.Settings{}, policystore.AnyVersion)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c := d.LeaseConfigs("plain")
		return len(c) == 1 && c[0] == flags
	}, 10*time.Second, 5*time.Millisecond)
}
