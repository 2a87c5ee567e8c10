package decide_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/memstore"
	"github.com/allot-dev/allot/internal/redistest"
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
	r, err := (&decide.Input{Tenant: "org_bench"}).Request()
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
	reqs := make([]decide.Request, 1000)
	for i := range reqs {
		r, err := (&decide.Input{Tenant: fmt.Sprintf("org_%d", i)}).Request()
		require.NoError(b, err)
		reqs[i] = r
	}
	per := b.N/conc + 1
	lat := make([][]time.Duration, conc)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			l := make([]time.Duration, 0, per)
			for i := range per {
				t0 := time.Now()
				if _, err := d.Check(ctx, &reqs[(w*per+i)%len(reqs)]); err != nil {
					b.Error(err)
					return
				}
				l = append(l, time.Since(t0))
			}
			lat[w] = l
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "decisions/s")
	for _, q := range []struct {
		name string
		p    float64
	}{{"p50", 0.50}, {"p99", 0.99}, {"p999", 0.999}} {
		b.ReportMetric(float64(all[int(q.p*float64(len(all)-1))].Microseconds()), q.name+"-µs")
	}
}

// BenchmarkLeasedDecision is one leased decision in process: policy
// matching, the subject, the lease take and the statuses, with the lease
// manager over a real redis-server (refills are rare: the limit is high
// and the grants large). "check" is Check, "append" CheckAppend with a
// reused status buffer, as a batch decides.
func BenchmarkLeasedDecision(b *testing.B) {
	st, err := region.Open(context.Background(), []string{redistest.Server(b).Addr}, region.Options{})
	require.NoError(b, err)
	b.Cleanup(func() { _ = st.Close() })
	m, err := lease.New(lease.Options{Source: st})
	require.NoError(b, err)
	b.Cleanup(func() { _ = m.Close(context.Background()) })
	set, err := policy.Load("bench", []byte(`
policies:
  - id: tenant
    per: [tenant]
    precision: leased
    lease: {target_period: 10s, ttl: 20s}
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000000000, period: 1s}
`))
	require.NoError(b, err)
	d := decide.New(decide.Config{Store: st, Policies: set, Leases: m})
	r, err := (&decide.Input{Tenant: "org_bench", Route: "/v1/x", Method: "GET"}).Request()
	require.NoError(b, err)
	ctx := context.Background()
	// Warm: the first takes wait for the key's first grants.
	for range 1000 {
		_, err := d.Check(ctx, &r)
		require.NoError(b, err)
	}
	b.Run("check", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if dec, err := d.Check(ctx, &r); err != nil || dec.Outcome != decide.Allowed {
				b.Fatal(err, dec.Outcome)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		buf := make([]decide.Status, 0, 8)
		b.ReportAllocs()
		for b.Loop() {
			if dec, err := d.CheckAppend(ctx, &r, buf); err != nil || dec.Outcome != decide.Allowed {
				b.Fatal(err, dec.Outcome)
			}
		}
	})
}
