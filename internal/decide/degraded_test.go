package decide_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/fallback"
	"github.com/allot-dev/allot/internal/memstore"
	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

// flaky is a store that fails while down, else counts in memory.
type flaky struct {
	mem  *memstore.Store
	down atomic.Bool
}

func (f *flaky) Take(ctx context.Context, g []algorithm.Group) ([]algorithm.Result, error) {
	if f.down.Load() {
		return nil, region.ErrUnavailable
	}
	return f.mem.Take(ctx, g)
}

func (f *flaky) Refund(ctx context.Context, g []algorithm.Group) error {
	if f.down.Load() {
		return region.ErrUnavailable
	}
	return f.mem.Refund(ctx, g)
}

const modePolicies = `
policies:
  - {id: api, match: {route: /api}, per: [tenant], on_store_failure: open, limits: [{name: m, algorithm: token_bucket, limit: 90, period: 1h}]}
  - {id: login, match: {route: /login}, per: [client], on_store_failure: closed, limits: [{name: m, algorithm: token_bucket, limit: 90, period: 1h}]}
  - {id: search, match: {route: /search}, per: [tenant], on_store_failure: local, limits: [{name: m, algorithm: token_bucket, limit: 90, period: 1h}]}
  - {id: both, match: {route: /both}, per: [tenant], on_store_failure: local, limits: [{name: m, algorithm: token_bucket, limit: 90, period: 1h}]}
  - {id: both-open, match: {route: /both}, per: [client], on_store_failure: open, limits: [{name: m, algorithm: token_bucket, limit: 90, period: 1h}]}
`

func modeDecider(t *testing.T, n int) (*decide.Decider, *flaky) {
	t.Helper()
	set, err := policy.Load("modes", []byte(modePolicies))
	require.NoError(t, err)
	st := &flaky{mem: memstore.New(nil)}
	d := decide.New(decide.Config{Store: st, Policies: set, Fallback: fallback.New(fallback.Fixed(n), nil)})
	return d, st
}

func checkReq(t *testing.T, d *decide.Decider, r policy.Request) decide.Decision {
	t.Helper()
	dec, err := d.Check(context.Background(), &r)
	require.NoError(t, err)
	return dec
}

func TestOnStoreFailureModes(t *testing.T) {
	d, st := modeDecider(t, 3)
	st.down.Store(true)

	dec := checkReq(t, d, policy.Request{Tenant: "t", Route: "/api"})
	assert.Equal(t, decide.FailedOpen, dec.Outcome, "open")
	assert.True(t, dec.Degraded, "open")

	dec = checkReq(t, d, policy.Request{Tenant: "t", Client: "c", Route: "/login"})
	assert.Equal(t, decide.Throttled, dec.Outcome, "closed")
	assert.Contains(t, dec.Reason, "store unavailable")
	assert.Equal(t, "login", dec.PolicyID)
	assert.True(t, dec.Degraded, "closed")

	// local: this node's share is 90 / 3 = 30.
	allowed := 0
	var last decide.Decision
	for range 40 {
		last = checkReq(t, d, policy.Request{Tenant: "t", Route: "/search"})
		if last.Outcome == decide.Allowed {
			allowed++
			require.Len(t, last.Statuses, 1)
			assert.False(t, last.Statuses[0].Exact)
			assert.Equal(t, int64(30), last.Limit)
			assert.True(t, last.Degraded, "local")
		}
	}
	assert.Equal(t, 30, allowed)
	assert.Equal(t, decide.Throttled, last.Outcome)
	assert.Contains(t, last.Reason, "local share")
	assert.Positive(t, last.RetryAfter)
}

func TestLocalAndOpenTogether(t *testing.T) {
	d, st := modeDecider(t, 3)
	st.down.Store(true)
	// Allowed by the local share, the open policy unchecked: FAILED_OPEN.
	for range 30 {
		assert.Equal(t, decide.FailedOpen, checkReq(t, d, policy.Request{Tenant: "t", Client: "c", Route: "/both"}).Outcome)
	}
	// The local share is spent: denied, whatever the open policy says.
	assert.Equal(t, decide.Throttled, checkReq(t, d, policy.Request{Tenant: "t", Client: "c", Route: "/both"}).Outcome)
}

// What the fallback admits is not written to the store: when it is back,
// counting continues from the store's own state.
func TestCountingResumesFromTheStore(t *testing.T) {
	d, st := modeDecider(t, 3)
	r := policy.Request{Tenant: "t", Route: "/search"}
	for range 5 {
		require.Equal(t, decide.Allowed, checkReq(t, d, r).Outcome)
	}
	st.down.Store(true)
	for range 10 {
		checkReq(t, d, r)
	}
	st.down.Store(false)
	dec := checkReq(t, d, r)
	assert.Equal(t, decide.Allowed, dec.Outcome)
	assert.False(t, dec.Degraded, "the store decided")
	assert.True(t, dec.Statuses[0].Exact)
	assert.Equal(t, int64(90-6), dec.Remaining)
}

func TestLocalWithoutFallbackFailsOpen(t *testing.T) {
	set, err := policy.Load("modes", []byte(modePolicies))
	require.NoError(t, err)
	st := &flaky{mem: memstore.New(nil)}
	st.down.Store(true)
	d := decide.New(decide.Config{Store: st, Policies: set})
	assert.Equal(t, decide.FailedOpen, checkReq(t, d, policy.Request{Tenant: "t", Route: "/search"}).Outcome)
}

const leasedLocal = `
policies:
  - id: leased
    per: [tenant]
    precision: leased
    on_store_failure: local
    lease: {target_period: 1s, ttl: 1h, max_share: 1, low_watermark: 0.01}
    limits:
      - {name: per_hour, algorithm: token_bucket, limit: 300, period: 1h}
`

// A leased policy keeps spending the tokens it holds while Redis is cut
// off, and only then falls back to its local share.
func TestLeasedPolicySpendsTokensOnHandFirst(t *testing.T) {
	redistest.Require(t)
	p := faultproxy.New(t, redistest.Server(t).Addr)
	st, err := region.Open(context.Background(), []string{p.Addr}, region.Options{Timeout: region.DefaultTimeout, Breaker: region.BreakerOptions{Disabled: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	m, err := lease.New(lease.Options{Source: st, MaxWait: region.DefaultTimeout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	set, err := policy.Load("test", []byte(leasedLocal))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: st, Policies: set, Leases: m, Fallback: fallback.New(fallback.Fixed(3), nil)})
	r := policy.Request{Tenant: "acme"}

	// Ramp the grant up until this node holds tokens (granted minus spent).
	var dec decide.Decision
	spent := int64(0)
	require.Eventually(t, func() bool {
		if dec = checkReq(t, d, r); dec.Outcome == decide.Allowed {
			spent++
		}
		return m.Stats().Granted-spent >= 5
	}, 10*time.Second, time.Millisecond)
	p.Cut()
	onHand := 0
	for dec = checkReq(t, d, r); dec.Outcome == decide.Allowed && !dec.Statuses[0].Exact && dec.Statuses[0].Limit == 300; dec = checkReq(t, d, r) {
		onHand++
		require.Less(t, onHand, 301)
	}
	assert.Positive(t, onHand, "tokens on hand were spent first")
	// Then the local share (300 / 3 = 100) decides.
	assert.Equal(t, decide.Allowed, dec.Outcome)
	assert.Equal(t, int64(100), dec.Statuses[0].Limit)
	t.Logf("spent %d leased tokens on hand, then the local share", onHand)
}
