package decide_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

func fixed(n int64) func(float64) (int64, int64) {
	return func(float64) (int64, int64) { return n, n }
}

func TestReserveTakesBatchesFromTheLeasesChecksUse(t *testing.T) {
	d, _ := leasedDecider(t)
	ctx := context.Background()
	req := &policy.Request{Tenant: "acme", Route: "/x"}
	var rate float64
	g, err := d.Reserve(ctx, req, func(r float64) (int64, int64) { rate = r; return 6, 6 })
	require.NoError(t, err)
	require.Equal(t, decide.GrantBatch, g.Kind)
	assert.Equal(t, int64(6), g.Requests)
	assert.InDelta(t, 10.0/3600, rate, 1e-9, "size is told the limit's rate in requests/s")
	// The 10-token hour bucket has 4 left, for checks and batches alike.
	assert.Equal(t, 4, countAllowed(t, d, decide.Input{Tenant: "acme", Route: "/x"}, 10))
	g, err = d.Reserve(ctx, req, fixed(3))
	require.NoError(t, err)
	assert.Equal(t, decide.GrantBatch, g.Kind)
	assert.Zero(t, g.Requests)
	assert.Positive(t, g.RetryAfter)
}

func TestReserveAllOrNothingAcrossLimits(t *testing.T) {
	d, _ := leasedDecider(t)
	ctx := context.Background()
	// Two leased limits: 10 an hour per tenant, 3 an hour per client.
	set, err := policy.Load("test", []byte(`
policies:
  - id: per-tenant
    per: [tenant]
    precision: leased
    lease: {max_share: 1}
    limits:
      - {name: per_hour, algorithm: token_bucket, limit: 10, period: 1h}
  - id: per-client
    per: [client]
    precision: leased
    lease: {max_share: 1}
    limits:
      - {name: per_hour, algorithm: token_bucket, limit: 3, period: 1h}
`))
	require.NoError(t, err)
	d.SetPolicies(set)
	g, err := d.Reserve(ctx, &policy.Request{Tenant: "t", Client: "c"}, fixed(8))
	require.NoError(t, err)
	assert.Equal(t, int64(3), g.Requests, "the scarcest limit sizes the batch")
	// The tenant got 5 of its 8 back: another client of it still has 7.
	g, err = d.Reserve(ctx, &policy.Request{Tenant: "t", Client: "other"}, fixed(100))
	require.NoError(t, err)
	assert.Equal(t, int64(3), g.Requests)
	g, err = d.Reserve(ctx, &policy.Request{Tenant: "t", Client: "third"}, fixed(100))
	require.NoError(t, err)
	assert.Equal(t, int64(3), g.Requests)
	g, err = d.Reserve(ctx, &policy.Request{Tenant: "t", Client: "fourth"}, fixed(100))
	require.NoError(t, err)
	assert.Equal(t, int64(1), g.Requests, "10 = 3 + 3 + 3 + 1")
}

func TestReserveBlanketAnswers(t *testing.T) {
	d, _ := leasedDecider(t)
	ctx := context.Background()
	g, err := d.Reserve(ctx, &policy.Request{Tenant: "t", Client: "c", Route: "/both"}, fixed(1))
	require.NoError(t, err)
	assert.Equal(t, decide.GrantDenyAll, g.Kind, "an exact policy cannot be decided by a batch")
	assert.True(t, g.Unbatchable)
	assert.Equal(t, "per-client", g.PolicyID)
	assert.Contains(t, g.Reason, "exact")

	set, err := policy.Load("test", []byte(`
policies:
  - id: shadow
    per: [tenant]
    precision: leased
    mode: shadow
    limits:
      - {name: l, algorithm: token_bucket, limit: 1, period: 1h}
`))
	require.NoError(t, err)
	d.SetPolicies(set)
	g, err = d.Reserve(ctx, &policy.Request{Tenant: "t"}, fixed(1))
	require.NoError(t, err)
	assert.Equal(t, decide.GrantAllowAll, g.Kind, "shadow policies never deny")
	g, err = d.Reserve(ctx, &policy.Request{Client: "nobody"}, fixed(1))
	require.NoError(t, err)
	assert.Equal(t, decide.GrantAllowAll, g.Kind)
	assert.Equal(t, "no enforced policy matches", g.Reason)
}

// downSource is a region that is down.
type downSource struct{}

func (downSource) Lease(context.Context, []lease.Group) ([]lease.Reply, error) {
	return nil, assert.AnError
}

func (downSource) Return(context.Context, []lease.ReturnItem) (int64, error) {
	return 0, assert.AnError
}

type halfShare struct{ failingStore }

func (halfShare) Share(c int64) int64 { return c / 2 }

func TestReserveFollowsOnStoreFailure(t *testing.T) {
	m, err := lease.New(lease.Options{Source: downSource{}, SweepEvery: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	for _, tc := range []struct {
		mode string
		want decide.GrantKind
	}{{"open", decide.GrantAllowAll}, {"closed", decide.GrantDenyAll}, {"local", decide.GrantLocal}} {
		set, err := policy.Load("test", []byte(`
policies:
  - id: p
    per: [tenant]
    precision: leased
    on_store_failure: `+tc.mode+`
    limits:
      - {name: l, algorithm: token_bucket, limit: 100, period: 1s}
`))
		require.NoError(t, err)
		d := decide.New(decide.Config{Store: failingStore{}, Policies: set, Leases: m, Fallback: halfShare{}})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		g, err := d.Reserve(ctx, &policy.Request{Tenant: "t"}, fixed(10))
		cancel()
		require.NoError(t, err, tc.mode)
		assert.Equal(t, tc.want, g.Kind, tc.mode)
		assert.True(t, g.Degraded, tc.mode)
		assert.Equal(t, "p", g.PolicyID, tc.mode)
		if tc.want == decide.GrantLocal {
			assert.Equal(t, int64(50), g.LocalBurst)
			assert.InDelta(t, 50.0, g.LocalRate, 1e-9)
		}
	}
}

func TestReserveKeepsAGlobalLimitToTheRegionsShare(t *testing.T) {
	redistest.Require(t)
	src, err := region.Open(context.Background(), []string{redistest.Server(t).Addr}, region.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	m, err := lease.New(lease.Options{Source: src, SweepEvery: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	set, err := policy.Load("test", []byte(`
policies:
  - id: g
    per: [tenant]
    precision: leased
    scope: global
    lease: {max_share: 1}
    limits:
      - {name: per_hour, algorithm: token_bucket, limit: 30, period: 1h}
`))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: src, Policies: set, Leases: m, Regions: 3})
	var rate float64
	var got int64
	for range 5 {
		g, err := d.Reserve(context.Background(), &policy.Request{Tenant: "t"}, func(r float64) (int64, int64) { rate = r; return 100, 100 })
		require.NoError(t, err)
		got += g.Requests
	}
	assert.InDelta(t, 10.0/3600, rate, 1e-9, "the rate split is the region's default share, L/3")
	assert.Equal(t, int64(10), got, "batches hold the region's share of the burst, and no more")
}
