package decide_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

const warmPolicies = `
policies:
  - id: tenant
    per: [tenant]
    precision: %s
    on_store_failure: open
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000000000, period: 1s}
`

// BenchmarkWarmKeys is issue 12's "many warm keys": 10,000 (or 40,000)
// tenants checked round-robin by 32 closed-loop workers on one local
// redis-server, so each key sees a check every few hundred ms to a
// second, as tenants at about 1 check/s do (checks/s/key says which). Leasing cannot help there;
// it must not hurt: compare decisions/s and failed_open of leased and
// exact, in one run. leased is what a node runs (Options.ColdExact: keys
// not seen within their lease TTL are decided by check.lua);
// leased-always leases every key.
func BenchmarkWarmKeys(b *testing.B) {
	srv := redistest.Server(b)
	for _, run := range []struct {
		name string
		keys int
	}{
		{"exact", 10_000}, {"leased", 10_000}, {"leased-always", 10_000},
		{"exact", 20_000}, {"leased", 20_000},
		{"exact", 40_000}, {"leased", 40_000}, {"leased-always", 40_000},
	} {
		precision, _, _ := strings.Cut(run.name, "-")
		b.Run(fmt.Sprintf("%s/keys=%d", run.name, run.keys), func(b *testing.B) {
			st, err := region.Open(context.Background(), []string{srv.Addr}, region.Options{PoolSize: 64})
			require.NoError(b, err)
			b.Cleanup(func() { st.Close() })
			set, err := policy.Load("bench", fmt.Appendf(nil, warmPolicies, precision))
			require.NoError(b, err)
			var m *lease.Manager
			if precision == "leased" {
				// leased is the node's setting (cold keys decided exactly);
				// leased-always leases every key.
				m, err = lease.New(lease.Options{Source: st, ColdExact: run.name == "leased"})
				require.NoError(b, err)
				b.Cleanup(func() { _ = m.Close(context.Background()) })
			}
			d := decide.New(decide.Config{Store: st, Policies: set, Leases: m})
			runWarm(b, d, m, run.keys, 32)
		})
	}
}

func runWarm(b *testing.B, d *decide.Decider, m *lease.Manager, keys, conc int) {
	reqs := make([]decide.Request, keys)
	for i := range reqs {
		r, err := (&decide.Input{Tenant: fmt.Sprintf("org_%d", i)}).Request()
		require.NoError(b, err)
		reqs[i] = r
	}
	per := b.N/conc + 1
	lat := make([][]time.Duration, conc)
	var failed atomic.Int64
	ctx := context.Background()
	var before lease.Stats
	if m != nil {
		before = m.Stats()
	}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			l := make([]time.Duration, 0, per)
			for i := range per {
				t0 := time.Now()
				dec, err := d.Check(ctx, &reqs[(w+i*conc)%len(reqs)])
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
	all := slices.Concat(lat...)
	slices.Sort(all)
	rate := float64(len(all)) / elapsed.Seconds()
	b.ReportMetric(rate, "decisions/s")
	b.ReportMetric(rate/float64(keys), "checks/s/key")
	b.ReportMetric(float64(failed.Load()), "failed")
	for _, q := range []struct {
		name string
		p    float64
	}{{"p50", 0.50}, {"p99", 0.99}} {
		b.ReportMetric(float64(all[int(q.p*float64(len(all)-1))].Microseconds()), q.name+"-µs")
	}
	if m != nil {
		s := m.Stats()
		b.ReportMetric(float64(s.Groups-before.Groups)/float64(len(all))*1000, "leases/1000")
	}
}
