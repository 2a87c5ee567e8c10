package rlqsfilter_test

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/allot-dev/allot/internal/testenv/rlqsfilter"
)

func TestBucketIDFor(t *testing.T) {
	header := func(name string) *rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder {
		a, err := anypb.New(&matcherv3.HttpRequestHeaderMatchInput{HeaderName: name})
		require.NoError(t, err)
		return &rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder{
			ValueSpecifier: &rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder_CustomValue{
				CustomValue: &corev3.TypedExtensionConfig{Name: name, TypedConfig: a}}}
	}
	s := &rlqsfilterv3.RateLimitQuotaBucketSettings{BucketIdBuilder: &rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder{
		BucketIdBuilder: map[string]*rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder{
			"tenant": header("x-tenant-id"),
			"method": header(":method"),
			"name": {ValueSpecifier: &rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder_StringValue{
				StringValue: "prod"}},
		}}}
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    rlqsfilter.BucketID
		err     bool
	}{
		{"every key", map[string]string{"X-Tenant-ID": "acme", ":method": "GET"}, rlqsfilter.BucketID{"tenant": "acme", "method": "GET", "name": "prod"}, false},
		{"an empty header leaves its key out", map[string]string{"x-tenant-id": "", ":method": "GET"}, rlqsfilter.BucketID{"method": "GET", "name": "prod"}, false},
		{"a missing header fails the id", map[string]string{":method": "GET"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rlqsfilter.BucketIDFor(s, tc.headers)
			if tc.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
