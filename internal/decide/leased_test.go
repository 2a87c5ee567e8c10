package decide_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

const leasedPolicies = `
policies:
  - id: per-tenant
    per: [tenant]
    precision: leased
    lease: {target_period: 1s, ttl: 2s, max_share: 1}
    limits:
      - {name: per_hour, algorithm: token_bucket, limit: 10, period: 1h}
  - id: per-client
    match: {route: "/both"}
    per: [client]
    precision: exact
    limits:
      - {name: per_hour, algorithm: token_bucket, limit: 3, period: 1h}
`

func leasedDecider(t *testing.T) (*decide.Decider, *region.Store) {
	t.Helper()
	st, err := region.Open(context.Background(), []string{redistest.Server(t).Addr}, region.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	m, err := lease.New(lease.Options{Source: st})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	set, err := policy.Load("test", []byte(leasedPolicies))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: st, Policies: set, Leases: m})
	return d, st
}

func TestLeasedPolicyDecidesFromLeases(t *testing.T) {
	d, _ := leasedDecider(t)
	ctx := context.Background()
	allowed := 0
	var last decide.Decision
	for range 15 {
		dec, err := d.Check(ctx, &policy.Request{Tenant: "acme", Route: "/x"})
		require.NoError(t, err)
		if dec.Outcome == decide.Allowed {
			allowed++
			assert.False(t, dec.Statuses[0].Exact)
			assert.Equal(t, int64(10), dec.Limit)
			assert.LessOrEqual(t, dec.Remaining, int64(10))
		}
		last = dec
	}
	assert.Equal(t, 10, allowed, "exactly the burst: leases never over-admit a single node")
	assert.Equal(t, decide.Throttled, last.Outcome)
	assert.Equal(t, "per-tenant", last.PolicyID)
	assert.Positive(t, last.RetryAfter)
}

func TestLeasedAndExactAllOrNothing(t *testing.T) {
	d, st := leasedDecider(t)
	ctx := context.Background()
	// The exact per-client limit (3) denies the 4th request; the leased
	// per-tenant tokens it took are given back, so the tenant keeps 7.
	for i := range 5 {
		dec, err := d.Check(ctx, &policy.Request{Tenant: "t", Client: "c", Route: "/both"})
		require.NoError(t, err)
		assert.Equal(t, i < 3, dec.Outcome == decide.Allowed, "request %d", i)
	}
	allowed := 0
	for range 10 {
		dec, err := d.Check(ctx, &policy.Request{Tenant: "t", Client: "other", Route: "/x"})
		require.NoError(t, err)
		if dec.Outcome == decide.Allowed {
			allowed++
		}
	}
	assert.Equal(t, 7, allowed, "denied requests spent no leased tokens")
	_ = st
}

// hangingSource never answers a lease before its context ends.
type hangingSource struct{}

func (hangingSource) Lease(ctx context.Context, _ []lease.Group) ([]lease.Reply, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (hangingSource) Return(context.Context, []lease.ReturnItem) (int64, error) { return 0, nil }

// budgetStore records how much time the exact path's store call was
// given, and answers allowed.
type budgetStore struct{ left chan time.Duration }

func (s budgetStore) Take(ctx context.Context, groups []algorithm.Group) ([]algorithm.Result, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		s.left <- -1
	} else {
		s.left <- time.Until(dl)
	}
	out := make([]algorithm.Result, len(groups))
	for i, g := range groups {
		out[i] = algorithm.Result{Allowed: true, Items: make([]algorithm.ItemResult, len(g))}
	}
	return out, nil
}
func (budgetStore) Refund(context.Context, []algorithm.Group) error { return nil }

// A check that waits for a lease refill and then calls the store spends
// one timeout on both: the store call gets what the wait left, not a
// fresh timeout.
func TestLeasedWaitAndExactCallShareOneTimeout(t *testing.T) {
	// wait is the lease wait's safety cap (at least lease.MinMaxWait).
	const timeout, wait = 800 * time.Millisecond, 600 * time.Millisecond
	m, err := lease.New(lease.Options{Source: hangingSource{}, MaxWait: wait})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	set, err := policy.Load("test", []byte(leasedPolicies))
	require.NoError(t, err)
	st := budgetStore{left: make(chan time.Duration, 1)}
	d := decide.New(decide.Config{Store: st, Policies: set, Leases: m, Timeout: timeout})
	_, err = d.Check(context.Background(), &policy.Request{Tenant: "acme", Client: "c", Route: "/both"})
	require.NoError(t, err)
	left := <-st.left
	require.Positive(t, left+1, "the store call had no deadline")
	// The refill wait took at least `wait` of the timeout, so at most
	// timeout − wait = 200 ms can be left (less on a slow machine).
	assert.LessOrEqual(t, left, timeout-wait, "the store call got a fresh timeout after the lease wait")
}

// A check's budget (decide.Config.Timeout) is the deadline of its lease
// wait too, passed down as the ctx's: a refill that never comes back ends
// the wait at the budget, not at the lease manager's safety cap, and the
// check is shed (overload), as a store call the check stopped waiting for
// is.
func TestCheckBudgetBoundsTheLeaseWait(t *testing.T) {
	const budget, wait = 50 * time.Millisecond, 10 * time.Second
	m, err := lease.New(lease.Options{Source: hangingSource{}, MaxWait: wait})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	set, err := policy.Load("test", []byte(leasedPolicies))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: budgetStore{left: make(chan time.Duration, 1)}, Policies: set, Leases: m, Timeout: budget})
	start := time.Now()
	_, err = d.Check(context.Background(), &policy.Request{Tenant: "acme", Client: "c", Route: "/both"})
	took := time.Since(start)
	require.Error(t, err)
	assert.True(t, decide.IsOverloaded(err), "%v", err)
	assert.GreaterOrEqual(t, took, budget)
	assert.Less(t, took, wait/2, "the wait ran to the safety cap, not the check's budget")
}

// A cold key of a leased policy (lease.Options.ColdExact, as a node runs)
// is decided on the exact path: its check goes to check.lua (no lease
// call) and debits the same bucket; checked often enough (ColdHits
// times within half its lease TTL), the key is leased. All-or-nothing holds across both paths. The cold check's status
// says exact: true (Redis decided it); the leased ones say false.
func TestColdLeasedKeyDecidedExactly(t *testing.T) {
	st, err := region.Open(context.Background(), []string{redistest.Server(t).Addr}, region.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	m, err := lease.New(lease.Options{Source: st, ColdExact: true, Defaults: lease.Config{ColdHits: 4}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	set, err := policy.Load("test", []byte(leasedPolicies))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: st, Policies: set, Leases: m})
	ctx := context.Background()

	dec, err := d.Check(ctx, &policy.Request{Tenant: "cold", Route: "/x"})
	require.NoError(t, err)
	assert.Equal(t, decide.Allowed, dec.Outcome)
	assert.Equal(t, int64(9), dec.Remaining, "first sight: check.lua debited the bucket")
	assert.True(t, dec.Statuses[0].Exact, "decided by the store")
	assert.Equal(t, int64(1), m.Stats().Exact)
	assert.Zero(t, m.Stats().Calls)

	// Checked again at once: two more exact checks (ColdHits 4), then
	// leased, from the same bucket.
	allowed := 1
	for range 14 {
		dec, err = d.Check(ctx, &policy.Request{Tenant: "cold", Route: "/x"})
		require.NoError(t, err)
		if dec.Outcome == decide.Allowed {
			allowed++
		}
	}
	assert.Positive(t, m.Stats().Calls, "then leased")
	assert.False(t, dec.Statuses[0].Exact, "a leased decision is not exact")
	assert.Equal(t, 10, allowed, "exact and leased admissions share the bucket: exactly the burst")
	assert.Equal(t, int64(3), m.Stats().Exact)

	// A cold leased key next to an exact policy: both go in one store call,
	// and the exact limit still decides the 4th request.
	for i := range 4 {
		dec, err = d.Check(ctx, &policy.Request{Tenant: "cold2", Client: "c", Route: "/both"})
		require.NoError(t, err)
		assert.Equal(t, i < 3, dec.Outcome == decide.Allowed, "request %d", i)
	}
}

// A cold key of a leased policy is decided on the exact path; when the
// store fails there, its policy's on_store_failure decides, as for an
// exact policy: closed throttles, open fails open (counted as such), and
// neither is a silent allow.
func TestColdLeasedKeyStoreFailureFollowsPolicy(t *testing.T) {
	st, err := region.Open(context.Background(), []string{redistest.Server(t).Addr}, region.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	m, err := lease.New(lease.Options{Source: st, ColdExact: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	for mode, want := range map[string]decide.Outcome{"closed": decide.Throttled, "open": decide.FailedOpen} {
		set, err := policy.Load("test", fmt.Appendf(nil, `
policies:
  - id: p
    per: [tenant]
    precision: leased
    on_store_failure: %s
    limits:
      - {name: a, algorithm: token_bucket, limit: 10, period: 1h}
`, mode))
		require.NoError(t, err)
		d := decide.New(decide.Config{Store: failingStore{}, Policies: set, Leases: m})
		dec, err := d.Check(context.Background(), &policy.Request{Tenant: "cold-" + mode})
		require.NoError(t, err)
		assert.Equal(t, want, dec.Outcome, mode)
		assert.True(t, dec.Degraded, mode)
	}
}
