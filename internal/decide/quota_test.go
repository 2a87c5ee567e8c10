package decide_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
)

// Quota names the region buckets of every enforced leased policy, with
// the region's numbers (a global limit's default share) and the cost.
func TestQuotaNamesTheRegionBuckets(t *testing.T) {
	d, _ := leasedDecider(t)
	set, err := policy.Load("test", []byte(`
policies:
  - id: per-tenant
    per: [tenant]
    precision: leased
    limits:
      - {name: s, algorithm: token_bucket, limit: 50, period: 1s}
      - {name: m, algorithm: token_bucket, limit: 1000, period: 1m}
  - id: global
    per: [client]
    precision: leased
    scope: global
    limits:
      - {name: h, algorithm: token_bucket, limit: 30, period: 1h}
`))
	require.NoError(t, err)
	d.SetPolicies(set)
	g := d.Quota(&policy.Request{Tenant: "t", Client: "c"})
	require.Equal(t, decide.GrantParts, g.Kind)
	assert.Equal(t, int64(1), g.Cost)
	require.Len(t, g.Keys, 3)
	assert.Equal(t, "rl:{tenant=t}:per-tenant:s", g.Keys[0].Key)
	assert.Equal(t, int64(1000), g.Keys[1].Spec.Limit)
	assert.True(t, g.Keys[2].Global)
	assert.False(t, g.Keys[0].Global)
}

func TestQuotaBlanketAnswers(t *testing.T) {
	d, _ := leasedDecider(t)
	g := d.Quota(&policy.Request{Tenant: "t", Client: "c", Route: "/both"})
	assert.Equal(t, decide.GrantDenyAll, g.Kind, "an exact policy cannot be decided by a quota client")
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
	assert.Equal(t, decide.GrantAllowAll, d.Quota(&policy.Request{Tenant: "t"}).Kind, "shadow policies never deny")
	g = d.Quota(&policy.Request{Client: "nobody"})
	assert.Equal(t, decide.GrantAllowAll, g.Kind)
	assert.Equal(t, "no enforced policy matches", g.Reason)
}

// QuotaFailed decides by the strictest on_store_failure: closed, then
// local (limit / N), then open.
func TestQuotaFailedFollowsOnStoreFailure(t *testing.T) {
	m, err := lease.New(lease.Options{Source: downSource{}, SweepEvery: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	for _, tc := range []struct {
		modes []string
		want  decide.GrantKind
	}{
		{[]string{"open"}, decide.GrantAllowAll},
		{[]string{"closed"}, decide.GrantDenyAll},
		{[]string{"local"}, decide.GrantLocal},
		{[]string{"open", "local"}, decide.GrantLocal},
		{[]string{"local", "closed"}, decide.GrantDenyAll},
	} {
		yaml := "policies:\n"
		for i, mode := range tc.modes {
			yaml += "  - {id: p" + string(rune('0'+i)) + ", per: [tenant], precision: leased, on_store_failure: " + mode +
				", limits: [{name: l, algorithm: token_bucket, limit: 100, period: 1s}]}\n"
		}
		set, err := policy.Load("test", []byte(yaml))
		require.NoError(t, err)
		d := decide.New(decide.Config{Store: failingStore{}, Policies: set, Leases: m, Fallback: halfShare{}})
		g := d.Quota(&policy.Request{Tenant: "t"})
		require.Equal(t, decide.GrantParts, g.Kind)
		f := d.QuotaFailed(&g, assert.AnError)
		assert.Equal(t, tc.want, f.Kind, "%v", tc.modes)
		assert.True(t, f.Degraded)
		if tc.want == decide.GrantLocal {
			assert.Equal(t, int64(50), f.LocalBurst)
			assert.InDelta(t, 50.0, f.LocalRate, 1e-9)
		}
	}
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
