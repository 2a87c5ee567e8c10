package envoy_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	// The header input rlqs.yaml builds bucket ids from.
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/server"
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
		assert.Equal(t, time.Second, s.GetReportingInterval().AsDuration())
	}
}

func TestRLQSExampleCheckCanFail(t *testing.T) {
	y, err := os.ReadFile("rlqs.yaml")
	require.NoError(t, err)
	for name, edit := range map[string][2]string{
		"misspelt bucket settings field": {"reporting_interval:", "reporting_intervall:"},
		"unknown input type":             {"HttpRequestHeaderMatchInput\n", "HttpRequestHeaderMatchInputt\n"},
		"validation rule inside an Any":  {"reporting_interval: 1s", "reporting_interval: 0s"},
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
