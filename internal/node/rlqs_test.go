package node_test

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/internal/testenv/rlqsfilter"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/region"
)

// rlqsPolicies: one leased bucket per tenant of 1,000/s (burst 1,000),
// the lease knobs at their defaults (TTL 2 s).
const rlqsPolicies = `
policies:
  - id: hot
    per: [tenant]
    precision: leased
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000, period: 1s}
`

// rlqsNode starts a node on its own Redis and returns a dialer of fresh
// connections to it (one per RLQS client, as separate Envoys would be).
func rlqsNode(t testing.TB, redis, policies string) (*node.Node, func() *grpc.ClientConn) {
	t.Helper()
	n, _ := nodetest.Start(t, policies, node.Config{Redis: []string{redis}})
	return n, func() *grpc.ClientConn { return nodetest.Dial(t, n) }
}

// envoySettings are the bucket settings of deploy/envoy/rlqs.yaml's
// kind: DENY_ALL before a bucket's first assignment, and for 10 s after
// one expires.
func envoySettings() *rlqsfilterv3.RateLimitQuotaBucketSettings {
	deny := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	return &rlqsfilterv3.RateLimitQuotaBucketSettings{
		NoAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{NoAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: deny}},
		ExpiredAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
			ExpiredAssignmentBehaviorTimeout: durationpb.New(10 * time.Second),
			ExpiredAssignmentBehavior:        &rlqsfilterv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: deny},
		},
		ReportingInterval: durationpb.New(rlqsfilter.EnvoyReportInterval),
	}
}

// envoy starts an emulated Envoy filter (Envoy's 5 s reporting) on conn.
func envoy(t testing.TB, conn *grpc.ClientConn) *rlqsfilter.Filter {
	t.Helper()
	f, err := rlqsfilter.Start(context.Background(), conn, rlqsfilter.Config{Domain: "test", Settings: envoySettings()})
	require.NoError(t, err)
	t.Cleanup(f.Close)
	return f
}

// perSecond counts what a client admitted in each second of a run.
type perSecond struct {
	start time.Time
	bins  [128]atomic.Int64
	// sent is when each request was offered, since start: written by
	// offer's goroutine alone, read once it has returned.
	sent []time.Duration
}

func (p *perSecond) add(now time.Time) { p.bins[int(now.Sub(p.start)/time.Second)].Add(1) }

// logOnFailure logs each second's admissions of ps, by name, if t failed.
func logOnFailure(t *testing.T, names string, ps ...*perSecond) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i := range ps[0].bins {
			line := make([]int64, len(ps))
			for j, p := range ps {
				line[j] = p.bins[i].Load()
			}
			t.Logf("second %d: %s %v", i, names, line)
		}
	})
}

// sum is what was admitted in seconds [from, to).
func (p *perSecond) sum(from, to int) int64 {
	var s int64
	for i := from; i < to; i++ {
		s += p.bins[i].Load()
	}
	return s
}

// offer sends rate requests/s of one bucket through decide from start
// until until, counting the admitted ones in out.
func offer(decide func(now time.Time) bool, rate float64, start, until time.Time, out *perSecond) {
	sent := 0
	for now := time.Now(); now.Before(until); now = time.Now() {
		for due := int(rate * now.Sub(start).Seconds()); sent < due; sent++ {
			out.sent = append(out.sent, now.Sub(out.start))
			if decide(now) {
				out.add(now)
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// rlqsBound is ARCHITECTURE.md's bound ("RLQS: rate parts") for a run of
// T seconds of a region bucket of rate r and burst b: b + r·(T + lease
// TTL + A + I + 0.1 s), with the lease TTL 2 s, Envoy's reporting
// interval I = 5 s and the assignment TTL A = I + 2 s.
func rlqsBound(r, b, T float64) float64 { return b + r*(T+2+7+5+0.1) }

// Issue 43's first acceptance point: two emulated Envoys on one node
// share a 1,000/s bucket, 5,000/s offered each for 30 s.
func TestRLQSTwoFiltersOneNode(t *testing.T) {
	if testing.Short() {
		t.Skip("30 s of load")
	}
	t.Parallel()
	redistest.Require(t)
	_, dial := rlqsNode(t, redistest.Server(t).Addr, rlqsPolicies)
	a, b := envoy(t, dial()), envoy(t, dial())
	id := map[string]string{"tenant": "acme"}

	const run = 30
	start := time.Now()
	pa, pb := &perSecond{start: start}, &perSecond{start: start}
	logOnFailure(t, "a, b", pa, pb)
	var wg sync.WaitGroup
	for _, f := range []struct {
		f *rlqsfilter.Filter
		p *perSecond
	}{{a, pa}, {b, pb}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			offer(func(now time.Time) bool { return f.f.Allow(id, now) }, 5000, start, start.Add(run*time.Second), f.p)
		}()
	}
	wg.Wait()
	require.NoError(t, a.Err())

	const rate, burst = 1000.0, 1000.0
	total := pa.sum(0, run) + pb.sum(0, run)
	ideal := burst + rate*run
	t.Logf("admitted %d of ideal %.0f (%.3f), bound %.0f; a %d, b %d (from 5 s: %d, %d)",
		total, ideal, float64(total)/ideal, rlqsBound(rate, burst, run), pa.sum(0, run), pb.sum(0, run), pa.sum(5, run), pb.sum(5, run))
	assert.LessOrEqual(t, float64(total), rlqsBound(rate, burst, run))
	assert.GreaterOrEqual(t, float64(total), 0.95*ideal)
	// Fair once both have reported (the first interval is their
	// subscription: parts already sent are only taken back as they are
	// replaced).
	ra, rb := float64(pa.sum(5, run)), float64(pb.sum(5, run))
	assert.InDelta(t, 1, ra/rb, 0.2, "each filter's part near the other's: %v vs %v", ra, rb)
}

// Issue 43's second acceptance point: one filter on each of two nodes,
// then a closed-loop CheckRateLimit caller (32 in flight) on a third.
func TestRLQSSplitsAcrossNodesAndChecks(t *testing.T) {
	if testing.Short() {
		t.Skip("60 s of load")
	}
	t.Parallel()
	redistest.Require(t)
	addr := redistest.Server(t).Addr
	_, dial1 := rlqsNode(t, addr, rlqsPolicies)
	_, dial2 := rlqsNode(t, addr, rlqsPolicies)
	_, dial3 := rlqsNode(t, addr, rlqsPolicies)
	a, b := envoy(t, dial1()), envoy(t, dial2())
	checks := ratelimitv1.NewRateLimiterServiceClient(dial3())
	id := map[string]string{"tenant": "acme"}

	const phase = 30
	start := time.Now()
	pa, pb, pc := &perSecond{start: start}, &perSecond{start: start}, &perSecond{start: start}
	logOnFailure(t, "a, b, checks", pa, pb, pc)
	var wg sync.WaitGroup
	for _, f := range []struct {
		f *rlqsfilter.Filter
		p *perSecond
	}{{a, pa}, {b, pb}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			offer(func(now time.Time) bool { return f.f.Allow(id, now) }, 5000, start, start.Add(2*phase*time.Second), f.p)
		}()
	}
	time.Sleep(time.Until(start.Add(phase * time.Second))) // the second phase starts at a time, not on a condition
	ctx := context.Background()
	end := start.Add(2 * phase * time.Second)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				resp, err := checks.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "acme"})
				if now := time.Now(); err == nil && resp.Decision == ratelimitv1.RateLimitResponse_ALLOWED && now.Before(end) {
					pc.add(now)
				}
			}
		}()
	}
	wg.Wait()

	const rate, burst = 1000.0, 1000.0
	two := pa.sum(0, phase) + pb.sum(0, phase)
	ideal := burst + rate*phase
	t.Logf("two nodes: %d of ideal %.0f (%.3f); a %d, b %d (from 10 s: %d, %d)", two, ideal, float64(two)/ideal, pa.sum(0, phase), pb.sum(0, phase), pa.sum(10, phase), pb.sum(10, phase))
	assert.GreaterOrEqual(t, float64(two), 0.95*ideal)
	assert.LessOrEqual(t, float64(two), rlqsBound(rate, burst, phase))
	// Parts already sent are taken back only as they are replaced, one
	// report at a time: measured once each filter has reported twice.
	assert.InDelta(t, 1, float64(pa.sum(10, phase))/float64(pb.sum(10, phase)), 0.2, "the two filters' parts once both reported twice: %d vs %d", pa.sum(10, phase), pb.sum(10, phase))

	// Three consumers: measured after two reporting intervals to settle.
	from := phase + 10
	ca, cb, cc := pa.sum(from, 2*phase), pb.sum(from, 2*phase), pc.sum(from, 2*phase)
	total := pa.sum(phase, 2*phase) + pb.sum(phase, 2*phase) + pc.sum(phase, 2*phase)
	t.Logf("three consumers from %d s: filters %d and %d, checks %d; the phase's total %d, bound %.0f", from, ca, cb, cc, total, rlqsBound(rate, burst, phase))
	assert.LessOrEqual(t, float64(total), rlqsBound(rate, burst, phase))
	third := float64(ca+cb+cc) / 3
	for name, v := range map[string]int64{"filter a": ca, "filter b": cb, "checks": cc} {
		assert.InDelta(t, third, float64(v), 0.25*third, "%s near a third", name)
	}
}

// A filter whose stream closes leaves its part to the other within two
// reporting intervals (once the closed stream's last assignment has
// expired); one that goes idle, within three.
func TestRLQSSurvivorTakesTheLeaversPart(t *testing.T) {
	if testing.Short() {
		t.Skip("30 s of load")
	}
	t.Parallel()
	redistest.Require(t)
	_, dial := rlqsNode(t, redistest.Server(t).Addr, rlqsPolicies)
	const run, leave = 30, 10
	for _, tc := range []struct {
		name   string
		within int // reporting intervals
	}{{"closes", 2}, {"idle", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := envoy(t, dial()), envoy(t, dial())
			id := map[string]string{"tenant": tc.name}
			start := time.Now()
			pa, pb := &perSecond{start: start}, &perSecond{start: start}
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				offer(func(now time.Time) bool { return a.Allow(id, now) }, 5000, start, start.Add(run*time.Second), pa)
			}()
			go func() {
				defer wg.Done()
				offer(func(now time.Time) bool { return b.Allow(id, now) }, 5000, start, start.Add(leave*time.Second), pb)
				if tc.name == "closes" {
					b.Close()
				}
			}()
			wg.Wait()
			// The leaver's last assignment lives up to its TTL (7 s) past
			// leave; the survivor's part grows at its next report.
			from := leave + tc.within*5
			if tc.name == "closes" {
				from += 2 // its last assignment's TTL is 2 s longer than an interval
			}
			t.Logf("a alone from %d s: %d/s", from, pa.sum(from, run)/int64(run-from))
			assert.GreaterOrEqual(t, float64(pa.sum(from, run)), 0.9*1000*float64(run-from), "the survivor holds the whole rate")
			require.NoError(t, a.Err())
		})
	}
}

// Issue 43's multi-window point: a tier of 50/s + 1,000/min +
// 50,000/day, one filter at 200/s for 60 s, within 5 % of what
// CheckRateLimit admits for the same offered load.
func TestRLQSTierFollowsTheBindingLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("60 s of load")
	}
	t.Parallel()
	redistest.Require(t)
	_, dial := rlqsNode(t, redistest.Server(t).Addr, `
policies:
  - id: tier
    per: [tenant]
    precision: leased
    limits:
      - {name: s, algorithm: token_bucket, limit: 50, period: 1s}
      - {name: m, algorithm: token_bucket, limit: 1000, period: 1m}
      - {name: d, algorithm: token_bucket, limit: 50000, period: 24h}
`)
	f := envoy(t, dial())
	checks := ratelimitv1.NewRateLimiterServiceClient(dial())
	const run = 60
	start := time.Now()
	viaRLQS, viaCheck := &perSecond{start: start}, &perSecond{start: start}
	logOnFailure(t, "rlqs, checks", viaRLQS, viaCheck)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		offer(func(now time.Time) bool { return f.Allow(map[string]string{"tenant": "rlqs"}, now) }, 200, start, start.Add(run*time.Second), viaRLQS)
	}()
	go func() {
		defer wg.Done()
		offer(func(time.Time) bool {
			resp, err := checks.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: "check"})
			return err == nil && resp.Decision == ratelimitv1.RateLimitResponse_ALLOWED
		}, 200, start, start.Add(run*time.Second), viaCheck)
	}()
	wg.Wait()
	r, c := viaRLQS.sum(0, run), viaCheck.sum(0, run)
	// Each against the ideal buckets over the requests it was offered: a
	// loaded machine can starve an offering loop, which then sends what
	// is due in a burst, and a burst past the 50-token bucket is lost to
	// any bucket. When both keep up, the two ideals are one.
	idealR, idealC := idealTier(viaRLQS.sent), idealTier(viaCheck.sent)
	rr, cc := float64(r)/idealR, float64(c)/idealC
	t.Logf("RLQS admitted %d (%.3f of the ideal buckets over its requests, %.0f), CheckRateLimit %d (%.3f of %.0f): %.3f", r, rr, idealR, c, cc, idealC, rr/cc)
	// Both references: the (CheckRateLimit on the same leased
	// policy, alone on its buckets, so paced as a lone node is) and the
	// three ideal buckets, which an exact policy admits to within a token.
	assert.InDelta(t, 1, rr/cc, 0.05)
	assert.InDelta(t, 1, rr, 0.05)
}

// idealTier is what the tier's three buckets, full at the start, admit
// of requests sent at the given offsets from the start, all-or-nothing.
func idealTier(sent []time.Duration) float64 {
	type tb struct{ tokens, burst, perSec float64 }
	bs := []*tb{{50, 50, 50}, {1000, 1000, 1000.0 / 60}, {50000, 50000, 50000.0 / 86400}}
	admitted := 0.0
	var last time.Duration
	for _, at := range sent {
		dt := (at - last).Seconds()
		last = at
		ok := true
		for _, b := range bs {
			b.tokens = min(b.burst, b.tokens+b.perSec*dt)
			ok = ok && b.tokens >= 1
		}
		if ok {
			admitted++
			for _, b := range bs {
				b.tokens--
			}
		}
	}
	return admitted
}

const rlqsFaultPolicies = `
policies:
  - {id: open, match: {route: /open}, per: [tenant], precision: leased, on_store_failure: open, limits: [{name: s, algorithm: token_bucket, limit: 100, period: 1s}]}
  - {id: closed, match: {route: /closed}, per: [tenant], precision: leased, on_store_failure: closed, limits: [{name: s, algorithm: token_bucket, limit: 100, period: 1s}]}
  - {id: local, match: {route: /local}, per: [tenant], precision: leased, on_store_failure: local, limits: [{name: s, algorithm: token_bucket, limit: 100, period: 1s}]}
`

// TestRLQSFollowsOnStoreFailure: Redis frozen, then back: assignments
// follow each policy's on_store_failure; under local the filter admits
// at most 1.1x its limit/N part over 10 s plus that part's burst.
func TestRLQSFollowsOnStoreFailure(t *testing.T) {
	t.Parallel()
	redistest.Require(t)
	in := redistest.Server(t)
	p := faultproxy.New(t, in.Addr)
	_, conn := nodetest.Start(t, rlqsFaultPolicies, node.Config{
		Redis:      []string{p.Addr},
		Resilience: node.Resilience{RedisTimeout: region.DefaultTimeout, Breaker: region.BreakerOptions{MaxOpen: 300 * time.Millisecond}, GossipFloor: 4},
	})
	// Reports every second (Envoy's are 5 s apart: this only shortens
	// the test).
	f, err := rlqsfilter.Start(context.Background(), conn, rlqsfilter.Config{Domain: "test", Settings: envoySettings(), ReportInterval: time.Second})
	require.NoError(t, err)
	defer f.Close()

	ids := map[string]map[string]string{}
	for _, route := range []string{"/open", "/closed", "/local"} {
		ids[route] = map[string]string{"tenant": "t", "route": route}
	}
	// kind names what a bucket holds now: a rate (a token bucket), allow
	// or deny; the local part's rate is kept.
	var localRate, localBurst float64
	kind := func(route string) string {
		s, _ := f.Strategy(ids[route])
		if s == nil {
			return "none"
		}
		if tb := s.GetTokenBucket(); tb != nil {
			rate := float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
			if route == "/local" && rate < 50 { // limit / N with N = 4 (the gossip floor), not a part of 100/s
				localRate, localBurst = rate, float64(tb.GetMaxTokens())
				return "local"
			}
			return "rate"
		}
		if s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL {
			return "allow"
		}
		return "deny"
	}
	want := func(phase string, expect map[string]string) {
		t.Helper()
		assert.Eventually(t, func() bool {
			for route := range ids {
				f.Allow(ids[route], time.Now())
			}
			for route, w := range expect {
				if kind(route) != w {
					return false
				}
			}
			return true
		}, 15*time.Second, 20*time.Millisecond, "%s: want %v, have open=%s closed=%s local=%s", phase, expect, kind("/open"), kind("/closed"), kind("/local"))
	}
	healthy := map[string]string{"/open": "rate", "/closed": "rate", "/local": "rate"}
	want("healthy", healthy)
	p.BlackHole(true)
	want("frozen", map[string]string{"/open": "allow", "/closed": "deny", "/local": "local"})
	assert.False(t, f.Allow(ids["/closed"], time.Now()), "a closed policy's bucket denies while the store is down")

	// Local: 10 s at 1,000/s offered, bounded by the part it was sent.
	start := time.Now()
	admitted := &perSecond{start: start}
	offer(func(now time.Time) bool { return f.Allow(ids["/local"], now) }, 1000, start, start.Add(10*time.Second), admitted)
	got := float64(admitted.sum(0, 10))
	t.Logf("local part %.1f/s, burst %.0f: admitted %.0f in 10 s", localRate, localBurst, got)
	require.Positive(t, localRate)
	assert.LessOrEqual(t, got, 1.1*localRate*10+localBurst)
	assert.False(t, math.IsInf(localRate, 0), "a whole-second fill interval")
	p.Heal()
	want("restored", healthy)
	require.NoError(t, f.Err())
}

// A node with 100 open streams, shut down: the streams end at the
// drain's start, new ones are refused, and it stops within the drain
// period plus 1 s.
func TestRLQSStreamsEndWhenTheNodeDrains(t *testing.T) {
	t.Parallel()
	redistest.Require(t)
	n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", Redis: []string{redistest.Server(t).Addr}, PoliciesPath: nodetest.PolicyFile(t, rlqsPolicies)})
	require.NoError(t, err)
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	c := rlqsv3.NewRateLimitQuotaServiceClient(conn)
	var streams []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	for range 100 {
		s, err := c.StreamRateLimitQuotas(context.Background())
		require.NoError(t, err)
		require.NoError(t, s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "t"}}, TimeElapsed: durationpb.New(0)},
		}}))
		_, err = s.Recv()
		require.NoError(t, err)
		streams = append(streams, s)
	}
	const drain = 2 * time.Second
	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- n.Shutdown(context.Background(), drain, 5*time.Second) }()
	for _, s := range streams {
		var err error
		for err == nil { // updates of a part may come first
			_, err = s.Recv()
		}
		assert.Equal(t, codes.Unavailable, status.Code(err))
	}
	assert.Less(t, time.Since(start), drain, "every stream ended at the drain's start")
	s, err := c.StreamRateLimitQuotas(context.Background())
	if err == nil {
		_ = s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d"})
		_, err = s.Recv()
	}
	assert.Equal(t, codes.Unavailable, status.Code(err), "a new stream is refused while draining")
	require.NoError(t, <-stopped)
	assert.Less(t, time.Since(start), drain+time.Second)
}

// The node lists RLQS by reflection and reports it SERVING by health.
func TestRLQSIsListedAndServing(t *testing.T) {
	_, conn := nodetest.Start(t, rlqsPolicies, node.Config{})
	ctx := context.Background()
	s, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, s.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	resp, err := s.Recv()
	require.NoError(t, err)
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	assert.Contains(t, names, rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName)
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hc.Status)
}
