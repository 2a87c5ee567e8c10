package coord_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	bkey "github.com/allot-dev/allot/internal/bucket"
	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/coord/demand"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

// A global quota: 300 requests per tenant per hour across the regions;
// and a global rate, exact (not leased): 300/s per client.
const quotaPolicies = `
policies:
  - id: hourly
    match: {route: /quota}
    per: [tenant]
    limits: [{name: quota, algorithm: fixed_window, limit: 300, period: 1h}]
    precision: exact
    scope: global
    on_store_failure: open
  - id: rate
    match: {route: /rate}
    per: [client]
    limits: [{name: s, algorithm: token_bucket, limit: 300, period: 1s}]
    precision: exact
    scope: global
    on_store_failure: open
`

const quotaLimit = 300

func quotaKey(tenant string) string { return bkey.New("tenant="+tenant, "hourly", "quota").String() }

// quotaWorld is three regions, each with its own redis-server, NATS
// server (a supercluster) and a coordinator fed by its decider's demand.
type quotaWorld struct {
	stores   map[string]*region.Store
	deciders map[string]*decide.Decider
}

func startQuotaWorld(t *testing.T, k coord.Knobs) *quotaWorld {
	t.Helper()
	redistest.Require(t)
	sc := natstest.StartSupercluster(t, regions...)
	set, err := policy.Load("quota", []byte(quotaPolicies))
	require.NoError(t, err)
	w := &quotaWorld{stores: map[string]*region.Store{}, deciders: map[string]*decide.Decider{}}
	redises := map[string]*redistest.Instance{}
	for _, r := range regions {
		redises[r] = redistest.Server(t) // started first, so killed after the cleanup below
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var stops []func()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		for _, stop := range stops {
			stop()
		}
	})
	for _, r := range regions {
		st, err := region.Open(ctx, []string{redises[r].Addr}, region.Options{})
		require.NoError(t, err)
		d := decide.New(decide.Config{Store: st, Policies: set, Regions: len(regions), Demand: true})
		w.stores[r], w.deciders[r] = st, d
		nc := connect(t, sc.URL(r))
		tr, err := coord.NewNATSTransport(nc, r, nil)
		require.NoError(t, err)
		stops = append(stops, func() { tr.Close() }, nc.Close, func() { st.Close() })
		co, err := coord.New(coord.Config{
			Region: r, Regions: regions, Transport: tr, Demand: demand.DrainFunc(d.DrainDemand),
			Writer: coord.RedisWriter{Client: st.Client()}, Limits: coord.NewPolicyLimits(set), Knobs: k,
		})
		require.NoError(t, err)
		wg.Go(func() { _ = co.Run(ctx) })
	}
	return w
}

// awaitQuotaWindow waits, if needed, until the hour has a minute left, so
// that no test crosses a window boundary (counts restart there).
func awaitQuotaWindow(t *testing.T) {
	left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour))
	if left < time.Minute {
		t.Logf("waiting %v for the next hourly window", left.Round(time.Second))
		time.Sleep(left + time.Second) // the condition is the clock itself
	}
}

// check sends one request for tenant to region r and reports whether it
// was admitted.
func (w *quotaWorld) check(t *testing.T, r, tenant string) bool {
	dec, err := w.deciders[r].Check(context.Background(), &policy.Request{Tenant: tenant, Route: "/quota"})
	require.NoError(t, err)
	return dec.Outcome == decide.Allowed
}

// remote is the other regions' count region r's bucket holds for tenant.
func (w *quotaWorld) remote(r, tenant string) int64 {
	v, err := w.stores[r].Client().HGet(context.Background(), quotaKey(tenant), "fw_remote").Int64()
	if err != nil {
		return 0
	}
	return v
}

// A tenant that spends its whole quota in one region gets all of it
// there (not L/n), and once the counts are exchanged the other regions
// admit nothing more: the regions together admit exactly L.
func TestGlobalQuotaCountsAreExchanged(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region integration test")
	}
	awaitQuotaWindow(t)
	k := knobs()
	w := startQuotaWorld(t, k)

	admitted := 0
	for range quotaLimit + 50 {
		if w.check(t, "eu", "solo") {
			admitted++
		}
	}
	require.Equal(t, quotaLimit, admitted, "eu alone must get the whole global quota")

	for _, r := range []string{"ap", "us"} {
		require.Eventually(t, func() bool { return w.remote(r, "solo") == quotaLimit },
			20*k.Interval+5*time.Second, 10*time.Millisecond, "%s never learnt eu's count", r) // polling Redis
		for range 20 {
			require.False(t, w.check(t, r, "solo"), "%s admitted past the global quota", r)
		}
	}
	require.Zero(t, w.remote("eu", "solo"), "ap and us counted nothing, so eu holds no remote count")
}

// With every region spending the same quota at once, the regions admit
// more than L only by what they served during one exchange lag.
func TestGlobalQuotaOvershootWithinLagBound(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region integration test")
	}
	awaitQuotaWindow(t)
	k := knobs()
	w := startQuotaWorld(t, k)

	// Each region offers rate requests/s until the quota has been gone
	// everywhere for a few intervals.
	const rate = 100.0
	var total atomic.Int64
	var last atomic.Int64 // unix ns of the last admission anywhere
	start := time.Now()
	var wg sync.WaitGroup
	for _, r := range regions {
		wg.Go(func() {
			tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
			defer tick.Stop()
			for time.Since(start) < 6*time.Second {
				<-tick.C
				if w.check(t, r, "shared") {
					total.Add(1)
					last.Store(time.Now().UnixNano())
				}
			}
		})
	}
	wg.Wait()
	// Bound (docs/multi-region.md, "Global quotas"): the regions admit
	// beyond L at most what each served during the exchange lag
	// Λ = I + Gather·I (+ a message's trip): a count read at an epoch's
	// start is in the others' buckets by the end of its gather phase.
	// Two more intervals of slack cover late epochs on a loaded machine.
	lag := 3*k.Interval + time.Duration(k.Gather*float64(k.Interval))
	bound := quotaLimit + float64(len(regions))*rate*lag.Seconds()
	got := total.Load()
	t.Logf("admitted %d of quota %d (bound %.0f, lag %v); last admission %v after start",
		got, quotaLimit, bound, lag, time.Duration(last.Load()-start.UnixNano()).Round(time.Millisecond))
	require.GreaterOrEqual(t, got, int64(quotaLimit), "the regions must together admit the whole quota")
	require.LessOrEqual(t, float64(got), bound, "overshoot beyond the exchange-lag bound")
}

// An exact-path global token bucket is rebalanced like a leased one: the
// nodes publish its demand, the coordinators shift the share toward the
// region with the traffic, and check.lua enforces the share.
func TestExactGlobalBucketFollowsTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region integration test")
	}
	k := knobs()
	w := startQuotaWorld(t, k)
	offer := map[string]float64{"ap": 10, "eu": 250, "us": 10}
	var admitted, tried sync.Map // region -> *atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, r := range regions {
		n, a := &atomic.Int64{}, &atomic.Int64{}
		admitted.Store(r, n)
		tried.Store(r, a)
		wg.Go(func() {
			tick := time.NewTicker(time.Duration(float64(time.Second) / offer[r]))
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				dec, err := w.deciders[r].Check(ctx, &policy.Request{Client: "c", Route: "/rate"})
				a.Add(1)
				if err == nil && dec.Outcome == decide.Allowed {
					n.Add(1)
				}
			}
		})
	}
	share := func(r string) float64 {
		v, err := w.stores[r].Client().HGet(context.Background(), "rl:{client=c}:rate:s", "rate").Float64()
		if err != nil {
			return 100 // no share written: the default L/3
		}
		return v
	}
	require.Eventually(t, func() bool { return share("eu") >= 250 }, 20*k.Interval+5*time.Second, 10*time.Millisecond,
		"eu's share never reached its demand (now %.0f/s)", share("eu")) // polling Redis
	v, _ := admitted.Load("eu")
	a, _ := tried.Load("eu")
	got, asked, start := v.(*atomic.Int64).Load(), a.(*atomic.Int64).Load(), time.Now()
	time.Sleep(time.Second) // the measurement window
	secs := time.Since(start).Seconds()
	rate, attempted := float64(v.(*atomic.Int64).Load()-got)/secs, float64(a.(*atomic.Int64).Load()-asked)/secs
	t.Logf("shares ap %.0f eu %.0f us %.0f; eu admitted %.0f/s of %.0f attempted", share("ap"), share("eu"), share("us"), rate, attempted)
	require.Greater(t, attempted, 150.0, "the load generator fell too far behind to judge")
	require.Greater(t, rate, 0.95*attempted, "eu must be served in full, beyond L/3 = 100/s, once its share grew")
	require.LessOrEqual(t, share("ap")+share("eu")+share("us"), 300.0+1e-6, "shares never sum past L")
}
