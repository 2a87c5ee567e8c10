package decide_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/memstore"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

// A high limit so the benchmark measures deciding, not denying.
const benchPolicies = `
policies:
  - id: tenant
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000000000, period: 1s}
`

func benchDecider(b *testing.B, store decide.Store) *decide.Decider {
	set, err := policy.Load("bench", []byte(benchPolicies))
	require.NoError(b, err)
	return decide.New(decide.Config{Store: store, Policies: set})
}

// BenchmarkStandaloneDecision is one decision on the in-process store.
func BenchmarkStandaloneDecision(b *testing.B) {
	d := benchDecider(b, memstore.New(nil))
	r := decide.Request{Tenant: "org_bench"}
	err := decide.Validate(&r)
	require.NoError(b, err)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Check(ctx, &r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExactRedis is the exact path (one EVALSHA per decision) against
// one local redis-server, at concurrency 1 and 32, over 1,000 tenants. It
// reports decisions/s and latency percentiles next to ns/op.
func BenchmarkExactRedis(b *testing.B) {
	srv := redistest.Server(b)
	st, err := region.Open(context.Background(), []string{srv.Addr}, region.Options{PoolSize: 64})
	require.NoError(b, err)
	b.Cleanup(func() { st.Close() })
	d := benchDecider(b, st)
	for _, conc := range []int{1, 32} {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			runConcurrent(b, d, conc)
		})
	}
}

func runConcurrent(b *testing.B, d *decide.Decider, conc int) {
	reqs := tenantRequests(b, 1000)
	per := b.N/conc + 1
	all, rate, _ := closedLoop(b, d, conc, func(w, i int) *decide.Request { return &reqs[(w*per+i)%len(reqs)] })
	b.ReportMetric(rate, "decisions/s")
	reportQuantiles(b, all, 0.50, 0.99, 0.999)
}

// tenantRequests is n requests, of tenants org_0 to org_<n-1>.
func tenantRequests(b *testing.B, n int) []decide.Request {
	reqs := make([]decide.Request, n)
	for i := range reqs {
		r := decide.Request{Tenant: fmt.Sprintf("org_%d", i)}
		err := decide.Validate(&r)
		require.NoError(b, err)
		reqs[i] = r
	}
	return reqs
}

// closedLoop has conc workers decide b.N/conc+1 checks each, worker w's
// i-th being req(w, i), on the benchmark's clock. It returns the sorted
// latencies, the decisions per second and how many answers were not the
// store's (FAILED_OPEN or degraded). A worker stops at its first error.
func closedLoop(b *testing.B, d *decide.Decider, conc int, req func(w, i int) *decide.Request) (all []time.Duration, rate float64, notByStore int64) {
	per := b.N/conc + 1
	lat := make([][]time.Duration, conc)
	var failed atomic.Int64
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			l := make([]time.Duration, 0, per)
			for i := range per {
				t0 := time.Now()
				dec, err := d.Check(ctx, req(w, i))
				if err != nil {
					b.Error(err)
					return
				}
				if dec.Outcome == decide.FailedOpen || dec.Degraded {
					failed.Add(1)
				}
				l = append(l, time.Since(t0))
			}
			lat[w] = l
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all = slices.Concat(lat...)
	slices.Sort(all)
	return all, float64(len(all)) / elapsed.Seconds(), failed.Load()
}

// reportQuantiles reports the quantiles qs of the sorted latencies as
// p50-µs, p99-µs, p999-µs (q's digits after the point).
func reportQuantiles(b *testing.B, all []time.Duration, qs ...float64) {
	if len(all) == 0 {
		return
	}
	for _, q := range qs {
		name := strings.TrimPrefix(strconv.FormatFloat(q, 'f', -1, 64), "0.")
		if len(name) == 1 {
			name += "0"
		}
		b.ReportMetric(float64(all[int(q*float64(len(all)-1))].Microseconds()), "p"+name+"-µs")
	}
}

// BenchmarkLeasedDecision is one leased decision in process: policy
// matching, the subject, the lease take and the statuses, with the lease
// manager over a real redis-server (refills are rare: the limit is high
// and the grants large). "check" is Check, "append" CheckAppend with a
// reused status buffer, as a batch decides.
func BenchmarkLeasedDecision(b *testing.B) {
	d, r := leasedBenchDecider(b)
	ctx := context.Background()
	b.Run("check", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if dec, err := d.Check(ctx, r); err != nil || dec.Outcome != decide.Allowed {
				b.Fatal(err, dec.Outcome)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		buf := make([]decide.Status, 0, 8)
		b.ReportAllocs()
		for b.Loop() {
			if dec, err := d.CheckAppend(ctx, r, buf); err != nil || dec.Outcome != decide.Allowed {
				b.Fatal(err, dec.Outcome)
			}
		}
	})
}

// leasedBenchDecider is a decider with one leased policy over a real
// redis-server, and a request of it, warmed: its key holds a grant.
func leasedBenchDecider(tb testing.TB) (*decide.Decider, *decide.Request) {
	st, err := region.Open(context.Background(), []string{redistest.Server(tb).Addr}, region.Options{})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = st.Close() })
	m, err := lease.New(lease.Options{Source: st})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = m.Close(context.Background()) })
	set, err := policy.Load("bench", []byte(`
policies:
  - id: tenant
    per: [tenant]
    precision: leased
    lease: {target_period: 10s, ttl: 20s}
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000000000, period: 1s}
`))
	require.NoError(tb, err)
	d := decide.New(decide.Config{Store: st, Policies: set, Leases: m})
	r := &decide.Request{Tenant: "org_bench", Route: "/v1/x", Method: "GET"}
	require.NoError(tb, decide.Validate(r))
	// Warm: the first takes wait for the key's first grants.
	for range 1000 {
		_, err := d.Check(context.Background(), r)
		require.NoError(tb, err)
	}
	return d, r
}

// A leased decision with its statuses in the caller's storage allocates
// nothing: the subject is built in a stack buffer and the lease take
// writes its result in place. (A hash called through a function value
// once moved that buffer to the heap on every decision.)
func TestLeasedDecisionAllocatesNothing(t *testing.T) {
	d, r := leasedBenchDecider(t)
	ctx := context.Background()
	buf := make([]decide.Status, 0, 8)
	allocs := testing.AllocsPerRun(200, func() {
		if dec, err := d.CheckAppend(ctx, r, buf); err != nil || dec.Outcome != decide.Allowed {
			t.Fatal(err, dec.Outcome)
		}
	})
	assert.Zero(t, allocs)
}
