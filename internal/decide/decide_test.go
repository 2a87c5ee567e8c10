package decide_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/memstore"
	"github.com/allot-dev/allot/internal/testenv/fakeclock"
	"github.com/allot-dev/allot/policy"
)

const policies = `
tenants: {acme: pro}
default_tier: free
costs: {"POST /v1/transfers": 10}
policies:
  - id: ip
    per: [ip]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 100, period: 1s}
  - id: free
    match: {tier: free}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 5, period: 1s, burst: 10}
      - {name: per_day, algorithm: token_bucket, limit: 12, period: 24h}
  - id: shadowed
    match: {tier: free}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1, period: 1s}
    mode: shadow
`

func newDecider(t *testing.T, store decide.Store) *decide.Decider {
	t.Helper()
	set, err := policy.Load("test", []byte(policies))
	require.NoError(t, err)
	return decide.New(decide.Config{Store: store, Policies: set})
}

func check(t *testing.T, d *decide.Decider, in decide.Request) decide.Decision {
	t.Helper()
	require.NoError(t, decide.Validate(&in))
	dec, err := d.Check(context.Background(), &in)
	require.NoError(t, err)
	return dec
}

func TestDenialByDailyLimitBurnsNoPerSecondTokensNorOtherSubjects(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	store := memstore.New(clk.Now)
	d := newDecider(t, store)
	in := decide.Request{Tenant: "t1", IPText: "192.0.2.1"}
	// The per_second bucket (burst 10) allows 10 at once; the day allows 12.
	allowed := 0
	for range 10 {
		if check(t, d, in).Outcome == decide.Allowed {
			allowed++
		}
	}
	require.Equal(t, 10, allowed)
	clk.Advance(time.Second) // per_second refills to 5
	for range 2 {
		require.Equal(t, decide.Allowed, check(t, d, in).Outcome)
	}
	// The day is spent: the next request is denied by per_day ...
	dec := check(t, d, in)
	require.Equal(t, decide.Throttled, dec.Outcome)
	assert.Equal(t, "free", dec.PolicyID)
	assert.Contains(t, dec.Reason, "per_day")
	assert.Greater(t, dec.RetryAfter, time.Hour)
	// ... and took nothing from per_second (still 3) nor from the IP policy
	// (refunded: still 100-12 = 88 whole tokens plus refill).
	var perSecond, ipStatus decide.Status
	for _, st := range dec.Statuses {
		switch st.PolicyID + "/" + st.LimitName {
		case "free/per_second":
			perSecond = st
		case "ip/per_second":
			ipStatus = st
		}
	}
	assert.Equal(t, int64(3), perSecond.Remaining)
	assert.False(t, perSecond.Violated)
	dec2 := check(t, d, decide.Request{Tenant: "t2", IPText: "192.0.2.1"})
	require.Equal(t, decide.Allowed, dec2.Outcome)
	for _, st := range dec2.Statuses {
		if st.PolicyID == "ip" {
			// Refilled to 100 by the 1 s step, minus 2 admitted after it, minus
			// this one: 97. Without the refund of the denied request it is 96.
			assert.Equal(t, int64(97), st.Remaining)
		}
	}
	assert.Equal(t, "ip", ipStatus.PolicyID)
	// The denied answer reports the ip limit as the refund leaves it (98,
	// what the next check then finds before its own take), not as it
	// stood between take and refund (97).
	assert.Equal(t, int64(98), ipStatus.Remaining)
}

func TestCostWeightingAndRetryAfter(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	set, err := policy.Load("t", []byte(`
costs: {"POST /v1/transfers": 10}
policies:
  - {id: free, per: [tenant], limits: [{name: per_second, algorithm: token_bucket, limit: 5, period: 1s, burst: 10}]}
`))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: memstore.New(clk.Now), Policies: set})
	in := decide.Request{Tenant: "t1", Route: "/v1/transfers", Method: "post"}
	dec := check(t, d, in) // cost 10 takes the whole burst
	require.Equal(t, decide.Allowed, dec.Outcome)
	assert.Equal(t, int64(0), dec.Remaining)
	assert.Equal(t, int64(10), dec.Limit)
	assert.Equal(t, 2*time.Second, dec.ResetAfter) // 10 tokens at 5/s
	dec = check(t, d, in)
	require.Equal(t, decide.Throttled, dec.Outcome)
	assert.Equal(t, 2*time.Second, dec.RetryAfter)
	assert.Equal(t, int64(2), decide.Seconds(dec.ResetAfter))
	clk.Advance(2 * time.Second)
	assert.Equal(t, decide.Allowed, check(t, d, in).Outcome)
}

func TestCostAboveCapacityNeverPasses(t *testing.T) {
	d := newDecider(t, memstore.New(nil))
	dec := check(t, d, decide.Request{Tenant: "t1", Cost: 11})
	require.Equal(t, decide.Throttled, dec.Outcome)
	assert.Contains(t, dec.Reason, "exceeds its capacity")
	assert.Equal(t, time.Duration(0), dec.RetryAfter)
	require.Len(t, dec.Statuses, 3) // ip, free/per_second, free/per_day
}

func TestShadowPolicyNeverDeniesButReports(t *testing.T) {
	d := newDecider(t, memstore.New(nil))
	in := decide.Request{Tenant: "t1"}
	require.Equal(t, decide.Allowed, check(t, d, in).Outcome)
	dec := check(t, d, in) // the shadow limit (burst 1) would deny now
	assert.Equal(t, decide.Allowed, dec.Outcome)
	require.Len(t, dec.Shadow, 1)
	assert.Equal(t, "shadowed", dec.Shadow[0].PolicyID)
}

func TestNoMatchingPolicyIsAllowed(t *testing.T) {
	set, err := policy.Load("empty", []byte(`policies: [{id: x, match: {tenant: only}, limits: [{name: a, algorithm: token_bucket, limit: 1, period: 1s}]}]`))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: memstore.New(nil), Policies: set})
	dec := check(t, d, decide.Request{Tenant: "other"})
	assert.Equal(t, decide.Allowed, dec.Outcome)
	assert.Empty(t, dec.Statuses)
}

type failingStore struct{}

func (failingStore) Take(context.Context, []algorithm.Group) ([]algorithm.Result, error) {
	return nil, assert.AnError
}
func (failingStore) Refund(context.Context, []algorithm.Group) error { return assert.AnError }

func TestStoreFailureFailsOpenOrClosedPerPolicy(t *testing.T) {
	set, err := policy.Load("t", []byte(`
policies:
  - {id: api, per: [tenant], limits: [{name: a, algorithm: token_bucket, limit: 1, period: 1s}]}
  - {id: login, match: {route: /login}, per: [client], on_store_failure: closed, limits: [{name: a, algorithm: token_bucket, limit: 1, period: 1s}]}
`))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: failingStore{}, Policies: set})
	assert.Equal(t, decide.FailedOpen, check(t, d, decide.Request{Tenant: "t"}).Outcome)
	dec := check(t, d, decide.Request{Tenant: "t", Client: "u", Route: "/login"})
	assert.Equal(t, decide.Throttled, dec.Outcome)
	assert.Contains(t, dec.Reason, "unavailable")
}

func TestReloadKeepsCounters(t *testing.T) {
	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	d := newDecider(t, memstore.New(clk.Now))
	in := decide.Request{Tenant: "t1"}
	for range 10 {
		check(t, d, in)
	}
	require.Equal(t, decide.Throttled, check(t, d, in).Outcome)
	// Same key, larger burst: the bucket keeps its (empty) state.
	set, err := policy.Load("v2", []byte(`
policies:
  - id: free
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 5, period: 1s, burst: 20}
`))
	require.NoError(t, err)
	d.SetPolicies(set)
	require.Equal(t, decide.Throttled, check(t, d, in).Outcome)
	clk.Advance(time.Second)
	dec := check(t, d, in)
	require.Equal(t, decide.Allowed, dec.Outcome)
	assert.Equal(t, int64(4), dec.Remaining)
}

func TestInputValidation(t *testing.T) {
	long := string(make([]byte, decide.MaxIdentityLen+1))
	cases := []struct {
		in    decide.Request
		field string
	}{
		{decide.Request{}, "tenant_id"},
		{decide.Request{Tenant: "t", Cost: -1}, "token_cost"},
		{decide.Request{Tenant: "t", Cost: decide.MaxCost + 1}, "token_cost"},
		{decide.Request{Tenant: long}, "tenant_id"},
		{decide.Request{Tenant: "t", Client: "\xff"}, "client_identifier"},
		{decide.Request{Tenant: "t", IPText: "1.2.3"}, "ip"},
	}
	for _, c := range cases {
		err := decide.Validate(&c.in)
		var bad *decide.InvalidError
		require.ErrorAs(t, err, &bad, "%+v", c.in)
		assert.Equal(t, c.field, bad.Field)
	}
	r := decide.Request{IPText: "::ffff:10.0.0.1", Method: "get"}
	err := decide.Validate(&r)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1", r.IP.String())
	assert.Equal(t, "GET", r.Method)
}

// FuzzInput: whatever a caller sends, Request either refuses it or gives a
// request the decider answers. Tenant and client travel as one string cut
// at the first NUL, route and method likewise, so the fuzzed function
// keeps to six parameters.
func FuzzInput(f *testing.F) {
	f.Add("t\x00c", "/r\x00GET", "10.0.0.1", "free", int64(1))
	f.Add("", "", "", "", int64(-1))
	f.Add("\xff\x00c", "/r\x00GET", "::1", "", int64(1<<40))
	set, err := policy.Load("fuzz", []byte(policies))
	if err != nil {
		f.Fatal(err)
	}
	d := decide.New(decide.Config{Store: memstore.New(nil), Policies: set})
	f.Fuzz(func(t *testing.T, who, what, ip, tier string, cost int64) {
		tenant, client, _ := strings.Cut(who, "\x00")
		route, method, _ := strings.Cut(what, "\x00")
		in := decide.Request{Tenant: tenant, Client: client, Route: route, Method: method, IPText: ip, Tier: tier, Cost: cost}
		if err := decide.Validate(&in); err != nil {
			return
		}
		if _, err := d.Check(context.Background(), &in); err != nil {
			t.Fatalf("valid input %+v: %v", in, err)
		}
	})
}

// countAllowed sends in n times and counts the allowed answers.
func countAllowed(t *testing.T, d *decide.Decider, in decide.Request, n int) int {
	t.Helper()
	allowed := 0
	for range n {
		if check(t, d, in).Outcome == decide.Allowed {
			allowed++
		}
	}
	return allowed
}

func TestGlobalLimitsEnforceTheRegionsShare(t *testing.T) {
	set, err := policy.Load("t", []byte(`
policies:
  - {id: global, scope: global, match: {tenant: t}, per: [tenant], limits: [{name: s, algorithm: token_bucket, limit: 30, period: 1h}]}
  - {id: regional, per: [client], limits: [{name: s, algorithm: token_bucket, limit: 30, period: 1h}]}
`))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: memstore.New(nil), Policies: set, Regions: 3})
	allowed := countAllowed(t, d, decide.Request{Tenant: "t"}, 40)
	assert.Equal(t, 10, allowed, "a global limit of 30 in one of 3 regions admits its share, 10")
	dec := check(t, d, decide.Request{Client: "c"})
	assert.Equal(t, int64(30), dec.Limit, "a regional limit is not divided")
}

// A global rate limit below the number of regions cannot be split (each
// region's default share is at least 1): the decider says so, for every
// such limit and only those, when it is made for n regions or gets a new
// set.
func TestUndividableGlobalLimitIsLogged(t *testing.T) {
	set, err := policy.Load("t", []byte(`
policies:
  - {id: tiny, scope: global, match: {tenant: t}, per: [tenant], limits: [{name: s, algorithm: token_bucket, limit: 2, period: 1s}, {name: h, algorithm: token_bucket, limit: 300, period: 1h}]}
  - {id: quota, scope: global, match: {tenant: q}, per: [tenant], limits: [{name: d, algorithm: fixed_window, limit: 2, period: 24h}]}
  - {id: regional, per: [client], limits: [{name: s, algorithm: token_bucket, limit: 1, period: 1s}]}
`))
	require.NoError(t, err)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	decide.New(decide.Config{Store: memstore.New(nil), Policies: set, Log: log})
	assert.Empty(t, buf.String(), "one region: nothing to split")
	d := decide.New(decide.Config{Store: memstore.New(nil), Policies: set, Log: log, Regions: 3})
	out := buf.String()
	assert.Equal(t, 1, strings.Count(out, "global limit below the number of regions"), out)
	assert.Contains(t, out, "policy=tiny limit=s")
	buf.Reset()
	d.SetPolicies(set)
	assert.Equal(t, 1, strings.Count(buf.String(), "global limit below the number of regions"), "again for a new set")
}

// A global quota (fixed window) is enforced whole in each region: the
// coordinator's exchange of counts, not a division, keeps the regions
// within it (docs/multi-region.md, "Global quotas"). Its demand, like
// every exact global key's, is counted for the coordinator.
func TestGlobalQuotaIsWholeAndDemandIsCounted(t *testing.T) {
	set, err := policy.Load("t", []byte(`
policies:
  - {id: rate, scope: global, match: {tenant: t}, per: [tenant], limits: [{name: s, algorithm: token_bucket, limit: 30, period: 1h}]}
  - {id: quota, scope: global, match: {tenant: q}, per: [client], limits: [{name: d, algorithm: fixed_window, limit: 30, period: 24h}]}
  - {id: regional, per: [ip], limits: [{name: s, algorithm: token_bucket, limit: 30, period: 1h}]}
`))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: memstore.New(nil), Policies: set, Regions: 3, Demand: true})
	allowed := countAllowed(t, d, decide.Request{Tenant: "q", Client: "c"}, 40)
	assert.Equal(t, 30, allowed, "a global quota of 30 is not divided by the regions")
	for range 12 {
		check(t, d, decide.Request{Tenant: "t", IPText: "10.0.0.1"})
	}

	got := map[string][2]int64{}
	d.DrainDemand(func(key string, admitted, denied int64) { got[key] = [2]int64{admitted, denied} })
	assert.Equal(t, map[string][2]int64{
		"rl:{client=c}:quota:d": {30, 10},
		"rl:{tenant=t}:rate:s":  {10, 2},
	}, got, "global keys only, admitted and denied tokens")
	d.DrainDemand(func(key string, _, _ int64) { t.Errorf("drained twice: %s", key) })
}

// Demand is counted only for a drainer (Config.Demand): without one, no
// global key's counts, the exact path's or a quota client's, are kept.
func TestDemandIsCountedOnlyForADrainer(t *testing.T) {
	set, err := policy.Load("t", []byte(`
policies:
  - {id: rate, scope: global, match: {tenant: t}, per: [tenant], limits: [{name: s, algorithm: token_bucket, limit: 30, period: 1h}]}
`))
	require.NoError(t, err)
	for _, drained := range []bool{false, true} {
		d := decide.New(decide.Config{Store: memstore.New(nil), Policies: set, Regions: 3, Demand: drained})
		check(t, d, decide.Request{Tenant: "t"})
		d.QuotaUsage("rl:{tenant=u}:rate:s", 5, 1)
		got := map[string][2]int64{}
		d.DrainDemand(func(key string, admitted, denied int64) { got[key] = [2]int64{admitted, denied} })
		if !drained {
			assert.Empty(t, got, "nothing drains it: nothing is kept")
			continue
		}
		assert.Equal(t, map[string][2]int64{"rl:{tenant=t}:rate:s": {1, 0}, "rl:{tenant=u}:rate:s": {5, 1}}, got)
	}
}
