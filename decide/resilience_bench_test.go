package decide_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/decide"
	"github.com/allot-dev/allot/fallback"
	"github.com/allot-dev/allot/internal/faultproxy"
	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

const benchPolicy = `
policies:
  - {id: api, per: [tenant], on_store_failure: local, limits: [{name: s, algorithm: token_bucket, limit: 1000000, period: 1s}]}
`

// TestResilienceLatency measures the decision latency distribution of the
// exact path with the node's defaults (5 ms timeout, breaker 50% over
// 10 s, minimum 20 calls, open 5 s) in normal operation and through each
// Redis fault. It is a measurement for docs/benchmarks.md, not
// a check: run it with
//
//	ALLOT_BENCH_RESILIENCE=1 go test -run TestResilienceLatency -v ./decide/
//
// ALLOT_BENCH_SECONDS sets the length of each phase (default 5).
func TestResilienceLatency(t *testing.T) {
	if os.Getenv("ALLOT_BENCH_RESILIENCE") == "" {
		t.Skip("set ALLOT_BENCH_RESILIENCE=1 to measure")
	}
	redistest.Require(t)
	secs, _ := strconv.Atoi(os.Getenv("ALLOT_BENCH_SECONDS"))
	if secs <= 0 {
		secs = 5
	}
	phase := time.Duration(secs) * time.Second
	type fault struct {
		name  string
		start func(*redistest.Instance, *faultproxy.Proxy)
	}
	faults := []fault{
		{"normal", func(*redistest.Instance, *faultproxy.Proxy) {}},
		{"redis killed", func(in *redistest.Instance, _ *faultproxy.Proxy) { in.Kill() }},
		{"redis frozen (SIGSTOP)", func(in *redistest.Instance, _ *faultproxy.Proxy) { in.Pause() }},
		{"proxy black hole", func(_ *redistest.Instance, p *faultproxy.Proxy) { p.BlackHole(true) }},
		{"50 ms slowdown (proxy)", func(_ *redistest.Instance, p *faultproxy.Proxy) { p.SetLatency(50 * time.Millisecond) }},
	}
	fmt.Printf("| scenario | decisions | p50 | p99 | p99.9 | max | > 5 ms | > 6 ms |\n|---|---|---|---|---|---|---|---|\n")
	for _, f := range faults {
		in := redistest.Server(t)
		p := faultproxy.New(t, in.Addr)
		addr := p.Addr
		if f.name == "redis killed" || f.name == "redis frozen (SIGSTOP)" {
			addr = in.Addr // the store talks to the process itself
		}
		st, err := region.Open(context.Background(), []string{addr}, region.Options{Timeout: region.DefaultTimeout})
		require.NoError(t, err)
		set, err := policy.Load("bench", []byte(benchPolicy))
		require.NoError(t, err)
		d := decide.New(st, set, nil)
		d.SetStoreTimeout(region.DefaultTimeout)
		d.UseFallback(fallback.New(fallback.Fixed(2), nil))
		run := func(n time.Duration) []time.Duration { return measure(t, d, n) }
		run(time.Second) // warm up
		f.start(in, p)
		lat := run(phase)
		slices.Sort(lat)
		q := func(x float64) time.Duration { return lat[min(len(lat)-1, int(x*float64(len(lat))))] }
		over := func(d time.Duration) int {
			i, _ := slices.BinarySearch(lat, d)
			return len(lat) - i
		}
		fmt.Printf("| %s | %d | %v | %v | %v | %v | %d | %d |\n", f.name, len(lat),
			q(0.50).Round(time.Microsecond), q(0.99).Round(time.Microsecond), q(0.999).Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond),
			over(5*time.Millisecond), over(6*time.Millisecond))
		p.Heal()
		in.Continue()
		_ = st.Close()
	}
}

// measure runs checks from 2 goroutines (the machine has 2 cores), each
// pausing 200 µs between checks, for d, and returns every latency.
func measure(t *testing.T, d *decide.Decider, dur time.Duration) []time.Duration {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	end := time.Now().Add(dur)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := policy.Request{Tenant: "tenant-" + strconv.Itoa(w)}
			var lat []time.Duration
			for time.Now().Before(end) {
				start := time.Now()
				_, err := d.Check(context.Background(), &r)
				lat = append(lat, time.Since(start))
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(200 * time.Microsecond)
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}
