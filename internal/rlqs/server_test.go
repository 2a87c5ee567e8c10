package rlqs_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/rlqs"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

// decider answers every bucket with grant: by default the parts of one
// region bucket of 1,000/s per tenant.
type decider struct {
	mu     sync.Mutex
	grant  decide.Grant
	failed decide.Grant
	reqs   []policy.Request
	usage  map[string][2]int64
}

func partsOf(rate int64) decide.Grant {
	return decide.Grant{Kind: decide.GrantParts, Cost: 1, PolicyID: "p"}
}

func (d *decider) Quota(r *policy.Request) decide.Grant {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reqs = append(d.reqs, *r)
	g := d.grant
	if g.Kind == decide.GrantParts {
		g.Keys = []decide.QuotaKey{{Key: "rl:{tenant=" + r.Tenant + "}:p:l", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 1000, Period: time.Second}, Global: true}}
	}
	return g
}

func (d *decider) QuotaFailed(*decide.Grant, error) decide.Grant { return d.failed }

func (d *decider) QuotaUsage(key string, admitted, denied int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.usage == nil {
		d.usage = map[string][2]int64{}
	}
	u := d.usage[key]
	d.usage[key] = [2]int64{u[0] + admitted, u[1] + denied}
}

// ledger is a region store on its own Redis.
func ledger(t *testing.T) *region.Store {
	t.Helper()
	redistest.Require(t)
	s, err := region.Open(context.Background(), []string{redistest.Server(t).Addr}, region.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func serve(t *testing.T, cfg rlqs.Config) (rlqsv3.RateLimitQuotaServiceClient, *rlqs.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	if cfg.Keys == nil {
		cfg.Keys = server.DefaultEnvoyKeys()
	}
	if cfg.Now != nil && cfg.Ticks == nil {
		// On a virtual clock, settlements between reports are the test's
		// to make (they send updates the test would read as answers).
		cfg.Ticks = make(chan time.Time)
	}
	rs := rlqs.New(cfg)
	t.Cleanup(rs.Close)
	rlqsv3.RegisterRateLimitQuotaServiceServer(srv, rs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return rlqsv3.NewRateLimitQuotaServiceClient(conn), rs
}

type usage = rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage

func report(id map[string]string, elapsed time.Duration, allowed, denied uint64) *usage {
	return &usage{BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

func roundTrip(t *testing.T, s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, domain string, us ...*usage) (*rlqsv3.RateLimitQuotaResponse, error) {
	t.Helper()
	require.NoError(t, s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}))
	return s.Recv()
}

// clock is a settable time for the server's settlement cadence.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func strategy(t *testing.T, resp *rlqsv3.RateLimitQuotaResponse) (*typev3.RateLimitStrategy, time.Duration) {
	t.Helper()
	require.Len(t, resp.BucketAction, 1)
	qa := resp.BucketAction[0].GetQuotaAssignmentAction()
	require.NotNil(t, qa)
	return qa.GetRateLimitStrategy(), qa.GetAssignmentTimeToLive().AsDuration()
}

// rateOf is a token bucket's rate as Envoy computes it: tokens_per_fill
// over the whole seconds of fill_interval.
func rateOf(tb *typev3.TokenBucket) float64 {
	return float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
}

// A bucket is assigned a rate in whole seconds; while its part holds the
// strategy is sent again byte-identical, so Envoy keeps its bucket.
func TestRateStrategyIsWholeSecondsAndKeptWhileThePartHolds(t *testing.T) {
	clk := &clock{now: time.Unix(1e6, 0)}
	c, _ := serve(t, rlqs.Config{Decider: &decider{grant: partsOf(1000)}, Ledger: ledger(t), Now: clk.Now})
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	id := map[string]string{"tenant": "acme"}
	resp, err := roundTrip(t, s, "d", report(id, 0, 1, 0))
	require.NoError(t, err)
	first, ttl := strategy(t, resp)
	tb := first.GetTokenBucket()
	require.NotNil(t, tb)
	assert.Equal(t, 7*time.Second, ttl, "Envoy's 5 s interval assumed until a report shows it, plus 2 s")
	assert.Zero(t, tb.GetFillInterval().GetNanos(), "whole seconds: Envoy divides by ToInt64Seconds")
	assert.GreaterOrEqual(t, tb.GetFillInterval().GetSeconds(), int64(1))
	assert.InDelta(t, 1200, rateOf(tb), 12, "a lone consumer's part is all the bucket can give: its rate, and its burst over the 5 s horizon")

	// The client spends about its part each second: the bucket drains
	// to its rate, then the part holds and the bytes repeat.
	var prev []byte
	same := 0
	for range 8 {
		clk.add(time.Second)
		resp, err = roundTrip(t, s, "", report(id, time.Second, 1000, 4000))
		require.NoError(t, err)
		st, ttl := strategy(t, resp)
		assert.Equal(t, 3*time.Second, ttl, "the interval the reports show, plus 2 s")
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(st)
		require.NoError(t, err)
		if string(b) == string(prev) {
			same++
		}
		prev = b
	}
	assert.GreaterOrEqual(t, same, 4, "the strategy repeats byte-identical while the part holds")
}

// A part that a settlement moves is sent between reports: when a second
// consumer arrives, the first one's part shrinks and is sent to it at
// once, and the second is answered with the room that frees.
func TestMovedPartsAreSentBetweenReports(t *testing.T) {
	clk := &clock{now: time.Unix(1e6, 0)}
	c, _ := serve(t, rlqs.Config{Decider: &decider{grant: partsOf(1000)}, Ledger: ledger(t), Now: clk.Now})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := c.StreamRateLimitQuotas(ctx)
	require.NoError(t, err)
	b, err := c.StreamRateLimitQuotas(ctx)
	require.NoError(t, err)
	id := map[string]string{"tenant": "acme"}
	resp, err := roundTrip(t, a, "d", report(id, 0, 1, 0))
	require.NoError(t, err)
	st, _ := strategy(t, resp)
	assert.InDelta(t, 1200, rateOf(st.GetTokenBucket()), 12, "alone: all the bucket can give")

	// A moment later (what a spent meanwhile is charged on this virtual
	// clock while Redis refills on its own: keep it short).
	clk.add(10 * time.Millisecond)
	resp, err = roundTrip(t, b, "d", report(id, 0, 1, 0))
	require.NoError(t, err)
	st, _ = strategy(t, resp)
	rb := rateOf(st.GetTokenBucket())
	pushed, err := a.Recv()
	require.NoError(t, err)
	st, _ = strategy(t, pushed)
	ra := rateOf(st.GetTokenBucket())
	t.Logf("a %.0f, b %.0f", ra, rb)
	assert.InDelta(t, 600, ra, 60, "a's part, taken back without waiting for its report")
	assert.InDelta(t, ra, rb, 0.2*ra, "b's part, the room a gave up")
	assert.LessOrEqual(t, ra+rb, 1200*1.01, "the parts never sum past what the bucket can give")
}

// Two nodes split one region bucket by offered rate through its Redis.
func TestTwoNodesSplitOneKey(t *testing.T) {
	l := ledger(t)
	clk := &clock{now: time.Unix(1e6, 0)}
	d := &decider{grant: partsOf(1000)}
	ca, _ := serve(t, rlqs.Config{Decider: d, Ledger: l, Node: "a", Now: clk.Now})
	cb, _ := serve(t, rlqs.Config{Decider: d, Ledger: l, Node: "b", Now: clk.Now})
	sa, err := ca.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	sb, err := cb.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	id := map[string]string{"tenant": "acme"}
	_, err = roundTrip(t, sa, "d", report(id, 0, 1, 0))
	require.NoError(t, err)
	_, err = roundTrip(t, sb, "d", report(id, 0, 1, 0))
	require.NoError(t, err)
	var ra, rb float64
	for range 8 {
		clk.add(time.Second)
		// Usage on virtual time would drain the bucket that Redis
		// refills on its own clock: offered rates alone.
		resp, err := roundTrip(t, sa, "", report(id, time.Second, 0, 5000))
		require.NoError(t, err)
		st, _ := strategy(t, resp)
		ra = rateOf(st.GetTokenBucket())
		resp, err = roundTrip(t, sb, "", report(id, time.Second, 0, 5000))
		require.NoError(t, err)
		st, _ = strategy(t, resp)
		rb = rateOf(st.GetTokenBucket())
	}
	t.Logf("parts: %.1f and %.1f", ra, rb)
	assert.InDelta(t, ra, rb, 0.2*ra, "equal offered rates, equal parts")
	// A full bucket gives its burst over the horizon too: 2,000/s.
	assert.LessOrEqual(t, ra+rb, 2000.0*1.01, "the parts never sum past what the bucket can give")
	assert.Greater(t, ra+rb, 2000.0*0.9)
	assert.Equal(t, [2]int64{2, 16 * 5000}, d.usage["rl:{tenant=acme}:p:l"], "a global key's usage is the coordinator's demand")
}

func TestBlanketAndLocalAnswers(t *testing.T) {
	for _, tc := range []struct {
		grant decide.Grant
		check func(t *testing.T, s *typev3.RateLimitStrategy)
	}{
		{decide.Grant{Kind: decide.GrantAllowAll}, func(t *testing.T, s *typev3.RateLimitStrategy) {
			assert.Equal(t, typev3.RateLimitStrategy_ALLOW_ALL, s.GetBlanketRule())
		}},
		{decide.Grant{Kind: decide.GrantDenyAll}, func(t *testing.T, s *typev3.RateLimitStrategy) {
			assert.Equal(t, typev3.RateLimitStrategy_DENY_ALL, s.GetBlanketRule())
		}},
		{decide.Grant{Kind: decide.GrantLocal, LocalBurst: 50, LocalRate: 25}, func(t *testing.T, s *typev3.RateLimitStrategy) {
			tb := s.GetTokenBucket()
			assert.Equal(t, uint32(50), tb.GetMaxTokens())
			assert.Zero(t, tb.GetFillInterval().GetNanos(), "whole seconds, or Envoy's rate is unbounded")
			assert.InDelta(t, 25, rateOf(tb), 0.25)
		}},
	} {
		c, _ := serve(t, rlqs.Config{Decider: &decider{grant: tc.grant}})
		s, err := c.StreamRateLimitQuotas(context.Background())
		require.NoError(t, err)
		resp, err := roundTrip(t, s, "d", report(map[string]string{"tenant": "a"}, 0, 0, 0))
		require.NoError(t, err)
		st, _ := strategy(t, resp)
		tc.check(t, st)
	}
}

// A store that fails answers by on_store_failure (the decider's
// QuotaFailed), here local: a bounded rate in whole seconds.
func TestStoreFailureAnswersByFallback(t *testing.T) {
	c, _ := serve(t, rlqs.Config{Decider: &decider{grant: partsOf(1000), failed: decide.Grant{Kind: decide.GrantLocal, LocalBurst: 100, LocalRate: 333}}})
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	resp, err := roundTrip(t, s, "d", report(map[string]string{"tenant": "a"}, 0, 0, 0))
	require.NoError(t, err)
	st, _ := strategy(t, resp)
	assert.InDelta(t, 333, rateOf(st.GetTokenBucket()), 3.4)
}

func TestRefusedBucketIDsAreDenied(t *testing.T) {
	d := &decider{grant: decide.Grant{Kind: decide.GrantAllowAll}}
	c, _ := serve(t, rlqs.Config{Decider: d})
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	for _, id := range []map[string]string{
		{"name": "x"}, // a key that names no field
		{"tenant": "a", "remote_address": "1.2.3.4", "ip": "1.2.3.4"}, // one field twice
		{"tenant": strings.Repeat("a", 2000)},                         // too long
		{"ip": "not-an-ip"},
		{},
	} {
		resp, err := roundTrip(t, s, "d", report(id, 0, 0, 0))
		require.NoError(t, err, "%v", id)
		st, _ := strategy(t, resp)
		assert.Equal(t, typev3.RateLimitStrategy_DENY_ALL, st.GetBlanketRule(), "%v", id)
	}
	assert.Empty(t, d.reqs, "a refused id is never decided")
}

// A refused id keeps only its hash, whatever its size, and a good id
// only its keys and values, not the unknown fields its message carried:
// 288 ids of 64 KiB, in reports of 3 MiB, leave the heap as it was.
func TestBucketIDsKeepABoundedSize(t *testing.T) {
	c, rs := serve(t, rlqs.Config{Decider: &decider{grant: decide.Grant{Kind: decide.GrantAllowAll}}})
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	var before, after runtime.MemStats
	// The first report warms gRPC's buffers; the heap is measured from its
	// end, pools emptied (a second GC clears sync.Pool's victims).
	const reports, ids = 7, 48
	for r := range reports {
		if r == 1 {
			runtime.GC()
			runtime.GC()
			runtime.ReadMemStats(&before)
		}
		us := make([]*usage, ids)
		for i := range us {
			if i%2 == 0 { // refused: too long
				us[i] = report(map[string]string{"tenant": fmt.Sprintf("%d-%d-", r, i) + strings.Repeat("a", 64<<10)}, 0, 0, 1)
				continue
			}
			us[i] = report(map[string]string{"tenant": fmt.Sprintf("%d-%d", r, i)}, 0, 1, 0)
			// A tag of field 1000, bytes, with 64 KiB: unknown to BucketId.
			us[i].BucketId.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 1000, protowire.BytesType), make([]byte, 64<<10)))
		}
		domain := ""
		if r == 0 {
			domain = "d"
		}
		resp, err := roundTrip(t, s, domain, us...)
		require.NoError(t, err)
		require.Len(t, resp.BucketAction, ids)
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	_, buckets, _ := rs.Open()
	assert.Equal(t, int64(reports*ids), buckets)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d ids of 64 KiB after the first report's: heap grew %.2f MiB", (reports-1)*ids, float64(grew)/(1<<20))
	assert.Less(t, grew, int64(4<<20), "18 MiB of ids are not kept")
	runtime.KeepAlive(s)
}

// A refused id is a bucket like any other: idle for a minute while its
// stream holds more than half its cap, it is released.
func TestIdleRefusedBucketsAreReleased(t *testing.T) {
	clk := &clock{now: time.Unix(1e6, 0)}
	c, rs := serve(t, rlqs.Config{Decider: &decider{grant: decide.Grant{Kind: decide.GrantAllowAll}}, MaxBuckets: 2, Now: clk.Now})
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	ids := []map[string]string{{"name": "x"}, {"tenant": strings.Repeat("a", 2000)}}
	all := func(elapsed time.Duration, denied uint64) []*usage {
		return []*usage{report(ids[0], elapsed, 0, denied), report(ids[1], elapsed, 0, denied)}
	}
	resp, err := roundTrip(t, s, "d", all(0, 1)...)
	require.NoError(t, err)
	for _, a := range resp.BucketAction {
		assert.Equal(t, typev3.RateLimitStrategy_DENY_ALL, a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule())
	}
	clk.add(30 * time.Second)
	_, err = roundTrip(t, s, "", all(30*time.Second, 0)...)
	require.NoError(t, err)
	clk.add(65 * time.Second)
	resp, err = roundTrip(t, s, "", all(65*time.Second, 0)...)
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, 2)
	assert.NotNil(t, resp.BucketAction[0].GetAbandonAction(), "idle for a minute: released")
	assert.Equal(t, typev3.RateLimitStrategy_DENY_ALL, resp.BucketAction[1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule(), "down to half the cap, the rest are kept")
	_, buckets, _ := rs.Open()
	assert.Equal(t, int64(1), buckets)
}

func TestStreamErrors(t *testing.T) {
	c, _ := serve(t, rlqs.Config{Decider: &decider{grant: decide.Grant{Kind: decide.GrantAllowAll}}})
	id := map[string]string{"tenant": "a"}
	for _, tc := range []struct {
		name string
		msgs [][]*usage
		dom  []string
	}{
		{"no domain", [][]*usage{{report(id, 0, 0, 0)}}, []string{""}},
		{"another domain", [][]*usage{{report(id, 0, 0, 0)}, {report(id, time.Second, 0, 0)}}, []string{"a", "b"}},
		{"a reporting interval under 1 s", [][]*usage{{report(id, 0, 1, 0)}, {report(id, 400*time.Millisecond, 1, 0)}, {report(id, 400*time.Millisecond, 1, 0)}}, []string{"a", "", ""}},
	} {
		s, err := c.StreamRateLimitQuotas(context.Background())
		require.NoError(t, err)
		var last error
		for i, us := range tc.msgs {
			if _, last = roundTrip(t, s, tc.dom[i], us...); last != nil {
				break
			}
		}
		assert.Equal(t, codes.InvalidArgument, status.Code(last), "%s: %v", tc.name, last)
	}
}

// One report of 10,000 bucket ids: the stream lives, the buckets past its
// cap are denied, and the heap stays bounded.
func TestBucketsPastTheCapAreDeniedAndTheStreamLives(t *testing.T) {
	c, rs := serve(t, rlqs.Config{Decider: &decider{grant: decide.Grant{Kind: decide.GrantAllowAll}}})
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	us := make([]*usage, 10000)
	for i := range us {
		us[i] = report(map[string]string{"tenant": fmt.Sprintf("%06d", i)}, 0, 1, 0)
	}
	resp, err := roundTrip(t, s, "d", us...)
	require.NoError(t, err)
	require.Len(t, resp.BucketAction, len(us))
	for i, a := range resp.BucketAction {
		want := typev3.RateLimitStrategy_ALLOW_ALL
		if i >= rlqs.DefaultMaxBuckets {
			want = typev3.RateLimitStrategy_DENY_ALL
		}
		require.Equal(t, want, a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule(), "bucket %d", i)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	_, buckets, _ := rs.Open()
	assert.Equal(t, int64(rlqs.DefaultMaxBuckets), buckets)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("10,000 ids in one report: heap grew %.1f MiB", float64(grew)/(1<<20))
	assert.Less(t, grew, int64(16<<20))
	// The stream still answers.
	resp, err = roundTrip(t, s, "", report(map[string]string{"tenant": "000001"}, time.Second, 1, 0))
	require.NoError(t, err)
	assert.Len(t, resp.BucketAction, 1)
}

// Buckets idle for a minute are released (abandoned) while their stream
// holds more than half its cap, so rotating ids do not fill it with
// dead ones; below half, idle buckets stay and are never denied.
func TestIdleBucketsAreReleasedToMakeRoom(t *testing.T) {
	clk := &clock{now: time.Unix(1e6, 0)}
	c, rs := serve(t, rlqs.Config{Decider: &decider{grant: decide.Grant{Kind: decide.GrantAllowAll}}, MaxBuckets: 4, Now: clk.Now})
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	ids := []map[string]string{{"tenant": "0"}, {"tenant": "1"}, {"tenant": "2"}, {"tenant": "3"}}
	all := func(elapsed time.Duration, allowed uint64, busy bool) []*usage {
		us := make([]*usage, len(ids))
		for i, id := range ids {
			n := allowed
			if busy && i == 0 {
				n = 1
			}
			us[i] = report(id, elapsed, n, 0)
		}
		return us
	}
	_, err = roundTrip(t, s, "d", all(0, 1, false)...)
	require.NoError(t, err)
	clk.add(30 * time.Second)
	resp, err := roundTrip(t, s, "", all(30*time.Second, 0, true)...)
	require.NoError(t, err)
	for _, a := range resp.BucketAction {
		assert.Nil(t, a.GetAbandonAction(), "idle for less than a minute")
	}
	clk.add(65 * time.Second)
	resp, err = roundTrip(t, s, "", all(65*time.Second, 0, true)...)
	require.NoError(t, err)
	released := 0
	for _, a := range resp.BucketAction {
		if a.GetAbandonAction() != nil {
			released++
			assert.NotEqual(t, "0", a.GetBucketId().GetBucket()["tenant"], "a busy bucket is kept")
		}
	}
	assert.Equal(t, 2, released, "released down to half the cap")
	_, buckets, _ := rs.Open()
	assert.Equal(t, int64(2), buckets)
	resp, err = roundTrip(t, s, "", report(map[string]string{"tenant": "new"}, 0, 1, 0))
	require.NoError(t, err)
	st, _ := strategy(t, resp)
	assert.Equal(t, typev3.RateLimitStrategy_ALLOW_ALL, st.GetBlanketRule(), "a new id fits")
}

// A stream with no report for two minutes (twice the longest reporting
// interval), from its start or from its last report, is ended
// DeadlineExceeded; a stream that reports lives.
func TestSilentStreamsEnd(t *testing.T) {
	clk := &clock{now: time.Unix(1e6, 0)}
	ticks := make(chan time.Time)
	c, rs := serve(t, rlqs.Config{Decider: &decider{grant: decide.Grant{Kind: decide.GrantAllowAll}}, Now: clk.Now, Ticks: ticks})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := map[string]string{"tenant": "a"}
	quiet, err := c.StreamRateLimitQuotas(ctx) // never reports
	require.NoError(t, err)
	stopped, err := c.StreamRateLimitQuotas(ctx) // reports once
	require.NoError(t, err)
	_, err = roundTrip(t, stopped, "d", report(id, 0, 1, 0))
	require.NoError(t, err)
	live, err := c.StreamRateLimitQuotas(ctx)
	require.NoError(t, err)
	_, err = roundTrip(t, live, "d", report(id, 0, 1, 0))
	require.NoError(t, err)
	require.Eventually(t, func() bool { n, _, _ := rs.Open(); return n == 3 }, 5*time.Second, 10*time.Millisecond, "the quiet stream is open")

	clk.add(115 * time.Second)
	ticks <- clk.Now()
	_, err = roundTrip(t, live, "", report(id, 115*time.Second, 1, 0))
	require.NoError(t, err, "silent for less than two minutes: open")
	clk.add(5 * time.Second)
	// A stream looks at its silence at the first tick it sees after the
	// clock moved: tick until the two silent ones are gone.
	require.Eventually(t, func() bool {
		ticks <- clk.Now()
		n, _, _ := rs.Open()
		return n == 1
	}, 5*time.Second, 10*time.Millisecond, "the silent streams end")
	for _, s := range []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient{quiet, stopped} {
		_, err := s.Recv()
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "no usage report for 2m0s", "the node's, not this test's deadline")
	}
	_, err = roundTrip(t, live, "", report(id, 5*time.Second, 1, 0))
	require.NoError(t, err, "it reported 5 s ago")
}

// Drain ends open streams at once and refuses new ones; past the stream
// cap a stream is refused.
func TestDrainAndStreamCap(t *testing.T) {
	c, rs := serve(t, rlqs.Config{Decider: &decider{grant: decide.Grant{Kind: decide.GrantAllowAll}}, MaxStreams: 2})
	var ss []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	for i := range 3 {
		s, err := c.StreamRateLimitQuotas(context.Background())
		require.NoError(t, err)
		_ = s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*usage{report(map[string]string{"tenant": "a"}, 0, 0, 0)}})
		_, err = s.Recv()
		if i == 2 {
			assert.Equal(t, codes.ResourceExhausted, status.Code(err), "past the cap")
			break
		}
		require.NoError(t, err)
		ss = append(ss, s)
	}
	rs.Drain()
	for _, s := range ss[:2] {
		_, err := s.Recv()
		assert.Equal(t, codes.Unavailable, status.Code(err), "draining ends the stream")
	}
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	_ = s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*usage{report(map[string]string{"tenant": "a"}, 0, 0, 0)}})
	_, err = s.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err), "refused while draining")
	assert.Eventually(t, func() bool { n, _, _ := rs.Open(); return n == 0 }, 5*time.Second, 10*time.Millisecond)
	_, _, refused := rs.Open()
	assert.Equal(t, int64(2), refused, "one at the cap, one while draining")
}

// A key whose streams have all ended is forgotten once their parts have
// expired.
func TestKeysOfEndedStreamsAreForgotten(t *testing.T) {
	clk := &clock{now: time.Unix(1e6, 0)}
	c, rs := serve(t, rlqs.Config{Decider: &decider{grant: partsOf(1000)}, Ledger: ledger(t), Now: clk.Now})
	for i := range 5 {
		s, err := c.StreamRateLimitQuotas(context.Background())
		require.NoError(t, err)
		_, err = roundTrip(t, s, "d", report(map[string]string{"tenant": fmt.Sprintf("t%d", i)}, 0, 1, 0))
		require.NoError(t, err)
		require.NoError(t, s.CloseSend())
		_, err = s.Recv()
		require.ErrorIs(t, err, io.EOF)
	}
	assert.Eventually(t, func() bool { n, _, _ := rs.Open(); return n == 0 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 5, rs.Keys(), "kept while their parts live")
	clk.add(time.Minute)
	s, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	_, err = roundTrip(t, s, "d", report(map[string]string{"tenant": "new"}, 0, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, 1, rs.Keys(), "the ended streams' keys are forgotten")
}

// A client that never reads its answers blocks only its own stream.
func TestAStreamThatNeverReadsHoldsOnlyItself(t *testing.T) {
	c, rs := serve(t, rlqs.Config{Decider: &decider{grant: decide.Grant{Kind: decide.GrantAllowAll}}})
	ctx, cancel := context.WithCancel(context.Background())
	bad, err := c.StreamRateLimitQuotas(ctx)
	require.NoError(t, err)
	long := map[string]string{"route": strings.Repeat("/x", 400), "tenant": "a"}
	// Reports whose answers are never read: the server's sends fill the
	// stream's window and block, then its reads stop, then ours do.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for {
			if bad.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*usage{report(long, time.Second, 1, 0)}}) != nil {
				return
			}
		}
	}()
	// The bad stream is open with its bucket (its first report was read)
	// before the other one starts: on a loaded machine the sender may not
	// have run yet.
	require.Eventually(t, func() bool { s, b, _ := rs.Open(); return s == 1 && b == 1 }, 10*time.Second, 10*time.Millisecond, "the bad stream's first report is read")
	good, err := c.StreamRateLimitQuotas(context.Background())
	require.NoError(t, err)
	resp, err := roundTrip(t, good, "d", report(map[string]string{"tenant": "b"}, 0, 0, 0))
	require.NoError(t, err)
	assert.Len(t, resp.BucketAction, 1, "another stream is served meanwhile")
	streams, buckets, _ := rs.Open()
	assert.Equal(t, int64(2), streams)
	assert.Equal(t, int64(2), buckets)
	cancel()
	<-sent
	assert.Eventually(t, func() bool { s, _, _ := rs.Open(); return s == 1 }, 5*time.Second, 10*time.Millisecond, "the blocked stream is freed when its client goes")
}
