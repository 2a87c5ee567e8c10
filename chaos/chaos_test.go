//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/faultproxy"
	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/loadgen"
	"github.com/allot-dev/allot/sandbox"
)

// The global policy of examples/sandbox-policies.yaml: L = 300/s, burst
// 300, leased with the default lease TTL (2 s) and a 1 ms clock tick.
const (
	limitRate  = 300.0
	limitBurst = 300.0
	leaseTTL   = 2 * time.Second
	tick       = time.Millisecond
)

// Each scenario offers 5·L on one hot key, spread evenly over the three
// regions, for runFor; the fault starts at faultAt and heals at healAt.
const (
	offered = 5 * limitRate
	runFor  = 12 * time.Second
	faultAt = 3 * time.Second
	healAt  = 7 * time.Second
	point   = 250 * time.Millisecond
)

type world struct {
	t       *testing.T
	sb      *sandbox.Sandbox
	proxies map[string][]*faultproxy.Proxy // region → shard proxies
}

type scenario struct {
	name        string
	fault, heal func(w *world, prefix string)
}

type row struct {
	name                   string
	admitted, ideal        int64
	bound                  float64
	failed, failedOpen     int64
	p99                    time.Duration
	recovery               time.Duration
	recovered, withinBound bool
}

func TestChaos(t *testing.T) {
	redistest.Require(t)
	w := &world{t: t, proxies: map[string][]*faultproxy.Proxy{}}
	sb, err := sandbox.Start(context.Background(), sandbox.Config{
		Policies: "../examples/sandbox-policies.yaml", Standby: true,
		RedisProxy: func(region string, _ int, target string) (string, error) {
			p := faultproxy.New(t, target)
			w.proxies[region] = append(w.proxies[region], p)
			return p.Addr, nil
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sb.Stop()) })
	w.sb = sb
	t.Logf("sandbox started in %v", sb.StartupTime())

	scenarios := []scenario{
		{name: "baseline (no fault)", fault: func(*world, string) {}, heal: func(*world, string) {}},
		{name: "partition region us (NATS server stopped)",
			fault: func(w *world, _ string) { w.sb.NATS().Stop("us") },
			heal: func(w *world, _ string) {
				noErr(w.t, w.sb.NATS().Restart("us"))
			}},
		{name: "kill + restart the us Redis shard of the hot key",
			fault: func(w *world, prefix string) { noErr(w.t, w.shardOf("us", prefix).Kill()) },
			heal: func(w *world, prefix string) {
				noErr(w.t, w.shardOf("us", prefix).Restart(context.Background()))
			}},
		{name: "slow us Redis (+50 ms per chunk, all shards)",
			fault: func(w *world, _ string) {
				for _, p := range w.proxies["us"] {
					p.SetLatency(50 * time.Millisecond)
				}
			},
			heal: func(w *world, _ string) {
				for _, p := range w.proxies["us"] {
					p.Heal()
				}
			}},
		{name: "kill us node 0",
			fault: func(w *world, _ string) { noErr(w.t, w.sb.Region("us").StopNode(0, 0)) },
			heal: func(w *world, _ string) {
				noErr(w.t, w.sb.Region("us").StartNode(context.Background(), 0))
			}},
		{name: "kill active us coordinator (standby takes over)",
			fault: func(w *world, _ string) { w.sb.Region("us").StopCoordinator(0) },
			heal: func(w *world, _ string) {
				noErr(w.t, w.sb.Region("us").StartCoordinator(context.Background(), 0))
			}},
		{name: "rolling restart of every node",
			fault: func(w *world, _ string) {
				for _, r := range w.sb.Regions() {
					for i := range r.NodeAddrs() {
						noErr(w.t, r.StopNode(i, time.Second))
						noErr(w.t, r.StartNode(context.Background(), i))
					}
				}
			},
			heal: func(*world, string) {}},
	}
	var rows []row
	for i, sc := range scenarios {
		rows = append(rows, w.run(sc, fmt.Sprintf("c%d-", i)))
	}
	printTable(t, rows)
	for _, r := range rows {
		if !r.withinBound {
			t.Errorf("%s: admitted %d > bound %.0f", r.name, r.admitted, r.bound)
		}
		if !r.recovered {
			t.Errorf("%s: did not recover before the end of the run", r.name)
		}
	}
}

// shardOf finds the real redis-server of region holding the hot key of
// the scenario (its keys carry the scenario's prefix).
func (w *world) shardOf(region, prefix string) interface {
	Kill() error
	Restart(context.Context) error
} {
	r := w.sb.Region(region)
	for _, s := range r.Redis {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		keys, err := c.Keys(context.Background(), "*"+prefix+"*").Result()
		c.Close()
		if err == nil && len(keys) > 0 {
			return s
		}
	}
	// No key found (the subject may be rendered without the prefix):
	// fall back to shard 0, so the scenario still kills a shard.
	w.t.Logf("no %s shard holds a key with prefix %q; killing shard 0", region, prefix)
	return r.Redis[0]
}

func (w *world) run(sc scenario, prefix string) row {
	t := w.t
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	faulted := make(chan struct{})
	go func() { // owned: ends with the scenario (cancel) or after healing
		defer close(faulted)
		select {
		case <-ctx.Done():
			return
		case <-time.After(faultAt):
		}
		sc.fault(w, prefix)
		select {
		case <-ctx.Done():
			return
		case <-time.After(healAt - faultAt):
		}
		sc.heal(w, prefix)
	}()
	rep, err := loadgen.Run(ctx, loadgen.Config{
		Targets: w.sb.Targets(), Dial: w.sb.Dial, Rate: offered, Concurrency: 256,
		Duration: runFor, Timeout: time.Second, Keys: loadgen.Keys{Dist: loadgen.Hot},
		KeyField: loadgen.Client, KeyPrefix: prefix, Interval: point,
		Ideal: &algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: int64(limitRate), Period: time.Second, Burst: int64(limitBurst)},
	})
	cancel()
	<-faulted
	require.NoError(t, err, sc.name)
	// The window in which a node saw requests: [FirstSend, LastAnswer].
	T := (rep.LastAnswer - rep.FirstSend).Seconds()
	bound := limitBurst + limitRate*(T+leaseTTL.Seconds()+tick.Seconds())
	r := row{name: sc.name, admitted: rep.Total.Counts.Admitted(), ideal: rep.IdealAdmitted, bound: bound,
		failed: rep.Total.Counts.Failed, failedOpen: rep.Total.Counts.FailedOpen, p99: rep.Total.Latency.P99}
	r.withinBound = float64(r.admitted) <= bound
	r.recovery, r.recovered = recovery(rep, healAt)
	return r
}

// recovery is the time from the heal until the run's series is healthy
// for good: every later point has no failed request and admits at least
// 70 % of the limit's rate.
func recovery(rep *loadgen.Report, heal time.Duration) (time.Duration, bool) {
	want := int64(0.7 * limitRate * point.Seconds())
	healthyFrom := -1
	for i, p := range rep.Series {
		ok := p.Total.Failed == 0 && p.Total.Admitted() >= want
		// The last point may be partial.
		if i == len(rep.Series)-1 {
			ok = p.Total.Failed == 0
		}
		switch {
		case !ok:
			healthyFrom = -1
		case healthyFrom < 0:
			healthyFrom = i
		}
	}
	if healthyFrom < 0 {
		return 0, false
	}
	return max(0, rep.Series[healthyFrom].Offset-heal), true
}

func printTable(t *testing.T, rows []row) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tADMITTED\tIDEAL\tBOUND\tOVERSHOOT/IDEAL\tFAILED\tFAILED-OPEN\tP99\tRECOVERY\tVERDICT")
	for _, r := range rows {
		verdict := "ok"
		if !r.withinBound {
			verdict = "OVER BOUND"
		}
		rec := r.recovery.Round(time.Millisecond).String()
		if !r.recovered {
			rec, verdict = "never", verdict+", not recovered"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%+d\t%d\t%d\t%v\t%s\t%s\n", r.name, r.admitted, r.ideal, r.bound,
			r.admitted-r.ideal, r.failed, r.failedOpen, r.p99.Round(10*time.Microsecond), rec, verdict)
	}
	tw.Flush()
	t.Log("\n" + b.String())
	fmt.Fprint(os.Stdout, b.String())
}

// noErr reports err without FailNow: faults run on the scenario's own
// goroutine, where FailNow must not be called.
func noErr(t *testing.T, err error) {
	if err != nil {
		t.Error(err)
	}
}
