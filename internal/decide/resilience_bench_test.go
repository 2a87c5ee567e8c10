package decide_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/fallback"
	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

const benchPolicy = `
policies:
  - {id: api, per: [tenant], on_store_failure: local, limits: [{name: s, algorithm: token_bucket, limit: 1000000, period: 1s}]}
`

// TestResilienceLatency measures the decision latency distribution of the
// exact path with the node's defaults (--redis-timeout 5 ms, of which the
// Redis call gets 4 ms; breaker opening on a stall or 10 failures in a
// row, probing from 50 ms up to 5 s) in normal operation and through each Redis fault, and
// through a black hole with breakers off, where every decision waits for
// the deadline. It is a measurement for docs/performance.md ("Resilience"), not a check:
// run it with
//
//	ALLOT_BENCH_RESILIENCE=1 go test -count=1 -run TestResilienceLatency -v ./internal/decide/
//
// ALLOT_BENCH_SECONDS sets the length of each phase (default 5), and
// ALLOT_BENCH_MARGIN the part of the budget kept back from the Redis call
// (default 0: automatic;
// -1ns gives the Redis call the whole 5 ms, as before the margin).
// redis-server runs on a CPU of its own (the last; redistest.PinRedis),
// as on a Redis host of its own, and this process (the decider, the
// store and the load) on the others.
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
	var margin time.Duration
	if m := os.Getenv("ALLOT_BENCH_MARGIN"); m != "" {
		var err error
		margin, err = time.ParseDuration(m)
		require.NoError(t, err, "ALLOT_BENCH_MARGIN")
	}
	// As a node wires --redis-timeout: the store's calls and the decider's
	// store work get the budget less the margin (internal/node/resilience.go).
	call, err := region.CallTimeout(region.DefaultTimeout, margin)
	require.NoError(t, err)
	budget := region.DefaultTimeout
	redisCPUs := redistest.PinRedis(t)
	fmt.Printf("budget (--redis-timeout) %v, Redis call deadline %v, redis-server on CPUs %v (nil: unpinned)\n\n", budget, call, redisCPUs)
	type fault struct {
		name  string
		start func(*redistest.Instance, *faultproxy.Proxy)
		// noBreaker turns the breakers off: every call goes to the faulty
		// Redis and waits for its deadline, which samples the wake-up
		// after a deadline thousands of times instead of ~10.
		noBreaker bool
	}
	faults := []fault{
		{"normal", func(*redistest.Instance, *faultproxy.Proxy) {}, false},
		{"redis killed", func(in *redistest.Instance, _ *faultproxy.Proxy) { in.Kill() }, false},
		{"redis frozen (SIGSTOP)", func(in *redistest.Instance, _ *faultproxy.Proxy) { in.Pause() }, false},
		{"proxy black hole", func(_ *redistest.Instance, p *faultproxy.Proxy) { p.BlackHole(true) }, false},
		{"50 ms slowdown (proxy)", func(_ *redistest.Instance, p *faultproxy.Proxy) { p.SetLatency(50 * time.Millisecond) }, false},
		{"black hole, breaker off", func(_ *redistest.Instance, p *faultproxy.Proxy) { p.BlackHole(true) }, true},
	}
	fmt.Printf("| scenario | decisions | not by Redis | p50 | p99 | p99.9 | max | > 5 ms | > 6 ms | waited for the deadline | their max |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range faults {
		in := redistest.ServerOn(t, redisCPUs)
		p := faultproxy.New(t, in.Addr)
		addr := p.Addr
		if f.name == "redis killed" || f.name == "redis frozen (SIGSTOP)" {
			addr = in.Addr // the store talks to the process itself
		}
		st, err := region.Open(context.Background(), []string{addr}, region.Options{Timeout: call, Breaker: region.BreakerOptions{Disabled: f.noBreaker}})
		require.NoError(t, err)
		set, err := policy.Load("bench", []byte(benchPolicy))
		require.NoError(t, err)
		// As a node wires it: no per-check store deadline; the store
		// judges stalls itself (region.Options.Timeout).
		d := decide.New(decide.Config{Store: deadlineStore{st}, Policies: set, Fallback: fallback.New(fallback.Fixed(2), nil)})
		measure(t, d, time.Second) // warm up
		f.start(in, p)
		m := measure(t, d, phase)
		lat := m.all
		slices.Sort(lat)
		q := func(x float64) time.Duration { return lat[min(len(lat)-1, int(x*float64(len(lat))))] }
		over := func(d time.Duration) int {
			i, _ := slices.BinarySearch(lat, d)
			return len(lat) - i
		}
		r := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
		waitedMax := "–"
		if len(m.waited) > 0 {
			waitedMax = r(slices.Max(m.waited)).String()
		}
		fmt.Printf("| %s | %d | %d | %v | %v | %v | %v | %d | %d | %d | %s |\n", f.name, len(lat), m.local,
			r(q(0.50)), r(q(0.99)), r(q(0.999)), r(lat[len(lat)-1]),
			over(budget), over(budget+time.Millisecond), len(m.waited), waitedMax)
		p.Heal()
		in.Continue()
		_ = st.Close()
	}
}

// waitedKey carries a *bool into the store's context: deadlineStore sets
// it when the check's take failed as stalled (or timed out), i.e. the
// decision waited for the store until the stall threshold.
type waitedKey struct{}

type deadlineStore struct{ decide.Store }

func (s deadlineStore) Take(ctx context.Context, groups []algorithm.Group) ([]algorithm.Result, error) {
	res, err := s.Store.Take(ctx, groups)
	if w, ok := ctx.Value(waitedKey{}).(*bool); ok && errors.Is(err, context.DeadlineExceeded) {
		*w = true
	}
	return res, err
}

// measured is one phase: every decision's latency, how many decisions
// Redis did not make (the local fallback did: a timeout, an error or an
// open breaker), and the latencies of the decisions whose take waited
// until its deadline.
type measured struct {
	all    []time.Duration
	local  int
	waited []time.Duration
}

// measure runs checks from 2 goroutines (the machine has 2 cores), each
// pausing 200 µs between checks, for dur.
func measure(t *testing.T, d *decide.Decider, dur time.Duration) measured {
	var mu sync.Mutex
	var out measured
	var wg sync.WaitGroup
	end := time.Now().Add(dur)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := policy.Request{Tenant: "tenant-" + strconv.Itoa(w)}
			var m measured
			for time.Now().Before(end) {
				var waited bool
				ctx := context.WithValue(context.Background(), waitedKey{}, &waited)
				start := time.Now()
				dec, err := d.Check(ctx, &r)
				took := time.Since(start)
				m.all = append(m.all, took)
				if err != nil {
					t.Error(err)
					return
				}
				if len(dec.Statuses) == 0 || !dec.Statuses[0].Exact {
					m.local++
				}
				if waited {
					m.waited = append(m.waited, took)
				}
				time.Sleep(200 * time.Microsecond)
			}
			mu.Lock()
			out.all = append(out.all, m.all...)
			out.local += m.local
			out.waited = append(out.waited, m.waited...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}
