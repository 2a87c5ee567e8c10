package envoy_test

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	// The header input rlqs.yaml builds bucket ids from.
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/internal/testenv/rlqsfilter"
)

// rlqsSettings decodes rlqs.yaml and returns its filter config and the
// bucket settings of each matcher.
func rlqsSettings(t *testing.T, y []byte) (*rlqsfilterv3.RateLimitQuotaFilterConfig, []*rlqsfilterv3.RateLimitQuotaBucketSettings) {
	t.Helper()
	b, err := decode(y)
	require.NoError(t, err)
	var hcm hcmv3.HttpConnectionManager
	require.NoError(t, b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm))
	var cfg rlqsfilterv3.RateLimitQuotaFilterConfig
	require.Equal(t, "envoy.filters.http.rate_limit_quota", hcm.GetHttpFilters()[0].GetName())
	require.NoError(t, hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&cfg))
	var out []*rlqsfilterv3.RateLimitQuotaBucketSettings
	for _, m := range cfg.GetBucketMatchers().GetMatcherList().GetMatchers() {
		var s rlqsfilterv3.RateLimitQuotaBucketSettings
		require.NoError(t, m.GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(&s))
		out = append(out, &s)
	}
	return &cfg, out
}

func TestRLQSExampleDecodesStrictly(t *testing.T) {
	y, err := os.ReadFile("rlqs.yaml")
	require.NoError(t, err)
	cfg, buckets := rlqsSettings(t, y)
	assert.Equal(t, "allot", cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName())
	require.NotEmpty(t, buckets)
	keys := server.DefaultEnvoyKeys()
	for _, s := range buckets {
		for k := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
			_, ok := keys[k]
			assert.True(t, ok, "bucket id key %q names no check field: the node would answer DENY_ALL", k)
		}
		// The overshoot bound counts on expired assignments not being
		// reused.
		assert.Equal(t, typev3.RateLimitStrategy_DENY_ALL, s.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule())
		assert.Positive(t, s.GetExpiredAssignmentBehavior().GetExpiredAssignmentBehaviorTimeout().GetSeconds(), "without a timeout the fallback ends at once")
		ri := s.GetReportingInterval()
		assert.Zero(t, ri.GetNanos(), "whole seconds")
		assert.GreaterOrEqual(t, ri.GetSeconds(), int64(1))
	}
}

func TestRLQSExampleCheckCanFail(t *testing.T) {
	y, err := os.ReadFile("rlqs.yaml")
	require.NoError(t, err)
	for name, edit := range map[string][2]string{
		"misspelt bucket settings field": {"reporting_interval:", "reporting_intervall:"},
		"unknown input type":             {"HttpRequestHeaderMatchInput\n", "HttpRequestHeaderMatchInputt\n"},
		"validation rule inside an Any":  {"reporting_interval: 5s", "reporting_interval: 0s"},
	} {
		t.Run(name, func(t *testing.T) {
			bad := strings.Replace(string(y), edit[0], edit[1], 1)
			require.NotEqual(t, string(y), bad, "the edit must apply")
			_, err := decode([]byte(bad))
			assert.Error(t, err)
		})
	}
	// A bucket key outside the node's mapping is caught by the example's
	// own test.
	bad := strings.Replace(string(y), "                                        method:\n", "                                        verb:\n", 1)
	require.NotEqual(t, string(y), bad)
	_, buckets := rlqsSettings(t, []byte(bad))
	assert.True(t, slices.ContainsFunc(buckets, func(s *rlqsfilterv3.RateLimitQuotaBucketSettings) bool {
		_, ok := s.GetBucketIdBuilder().GetBucketIdBuilder()["verb"]
		return ok
	}))
}

// TestRLQSExampleThroughTheEmulator drives each of rlqs.yaml's bucket
// settings through the port of Envoy's filter (internal/testenv/rlqsfilter):
// what Envoy does with this file, whatever its comments expect.
func TestRLQSExampleThroughTheEmulator(t *testing.T) {
	y, err := os.ReadFile("rlqs.yaml")
	require.NoError(t, err)
	fc, _ := rlqsSettings(t, y)
	for i := range fc.GetBucketMatchers().GetMatcherList().GetMatchers() {
		cfg, err := rlqsfilter.FromFilterConfig(fc, i)
		require.NoError(t, err)
		c, err := rlqsfilter.NewClient(cfg, nil)
		require.NoError(t, err)
		id, err := rlqsfilter.BucketIDFor(cfg.Settings, map[string]string{"x-tenant-id": "acme", ":method": "GET"})
		require.NoError(t, err)
		require.NotEmpty(t, id)
		noAssign := cfg.Settings.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL
		t0 := rlqsfilter.MonotonicStart

		// The first request: no_assignment_behavior, and a report of it alone.
		assert.Equal(t, noAssign, c.Allow(t0, id))
		sent := c.Sent()
		require.Len(t, sent, 1)
		assert.Equal(t, fc.GetDomain(), sent[0].GetDomain())
		require.Len(t, sent[0].GetBucketQuotaUsages(), 1)
		assert.True(t, maps.Equal(id, sent[0].GetBucketQuotaUsages()[0].GetBucketId().GetBucket()))
		// Envoy reports every 5 s, whatever reporting_interval says.
		next, _ := c.NextReport()
		assert.Equal(t, t0+rlqsfilter.EnvoyReportInterval, next)

		// A DENY_ALL assignment for 2 s; then the expired-assignment
		// fallback for its timeout's whole seconds; then no_assignment.
		c.Apply(t0, &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{
			BucketId: &rlqsv3.BucketId{Bucket: id},
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(2 * time.Second),
				RateLimitStrategy:    &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}},
			}},
		}}})
		assert.False(t, c.Allow(t0+time.Second, id))
		eab := cfg.Settings.GetExpiredAssignmentBehavior()
		timeout := time.Duration(eab.GetExpiredAssignmentBehaviorTimeout().GetSeconds()) * time.Second
		expired := t0 + 2*time.Second
		if eab.GetFallbackRateLimit() != nil && timeout > 0 {
			want := eab.GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL
			assert.Equal(t, want, c.Allow(expired+timeout-time.Millisecond, id), "the fallback, before its timeout")
		}
		assert.Equal(t, noAssign, c.Allow(expired+timeout, id), "no_assignment_behavior once the fallback's timeout is over")
		b, ok := c.Bucket(expired+timeout, id)
		require.True(t, ok)
		assert.Nil(t, b.Action)
		t.Logf("matcher %d: expired assignments fall back for %v, then no_assignment_behavior (first request allowed: %v)", i, timeout, noAssign)
	}
}

// TestRLQSExampleEnforcesOnANode runs rlqs.yaml's filter (the port of
// Envoy's code) against a node serving policies.yaml: a tenant's two
// methods are two buckets of one per-tenant region bucket, and share its
// rate.
func TestRLQSExampleEnforcesOnANode(t *testing.T) {
	if testing.Short() {
		t.Skip("6 s of load")
	}
	redistest.Require(t)
	n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", Redis: []string{redistest.Server(t).Addr}, PoliciesPath: "policies.yaml"})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	y, err := os.ReadFile("rlqs.yaml")
	require.NoError(t, err)
	fc, _ := rlqsSettings(t, y)
	cfg, err := rlqsfilter.FromFilterConfig(fc, 0)
	require.NoError(t, err)
	f, err := rlqsfilter.Start(context.Background(), conn, cfg)
	require.NoError(t, err)
	t.Cleanup(f.Close)
	var ids []rlqsfilter.BucketID
	for _, method := range []string{"GET", "POST"} {
		id, err := rlqsfilter.BucketIDFor(cfg.Settings, map[string]string{"x-tenant-id": "t1", ":method": method})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	// 200/s offered on each method for 6 s against the free tier's
	// 50/s (burst 100).
	const run = 6 * time.Second
	start := time.Now()
	admitted := make([]int, len(ids))
	sent := 0
	for now := time.Now(); now.Before(start.Add(run)); now = time.Now() {
		for due := int(400 * now.Sub(start).Seconds()); sent < due; sent++ {
			if f.Allow(ids[sent%2], now) {
				admitted[sent%2]++
			}
		}
		time.Sleep(time.Millisecond)
	}
	total := admitted[0] + admitted[1]
	// The bound (docs/rlqs.md): b + r·(T + TTL + A + I + 0.1 s).
	bound := 100 + 50*(run.Seconds()+2+7+5+0.1)
	t.Logf("GET %d, POST %d: %d of the tenant's ideal %.0f, bound %.0f", admitted[0], admitted[1], total, 100+50*run.Seconds(), bound)
	assert.Positive(t, admitted[0])
	assert.Positive(t, admitted[1])
	assert.LessOrEqual(t, float64(total), bound)
	for _, id := range ids {
		s, _ := f.Strategy(id)
		require.NotNil(t, s.GetTokenBucket(), "a leased policy's bucket is assigned a rate")
		assert.LessOrEqual(t, float64(s.GetTokenBucket().GetTokensPerFill().GetValue())/float64(s.GetTokenBucket().GetFillInterval().GetSeconds()), 100.0,
			"the two methods share the tenant's rate (over the horizon: 50/s + its burst of 100 / 5 s at most)")
	}
	require.NoError(t, f.Err())
}
