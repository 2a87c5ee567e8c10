package rlqsfilter

import (
	"errors"
	"fmt"
	"strings"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
)

// EnvoyReportInterval is how often the filter reports at the pinned
// commit, whatever the buckets' reporting_interval says: initTlsStore
// (filter_persistence.cc) hardcodes 5,000 ms ("TODO(bsurber): Implement
// report timing ... based on each bucket's reporting_interval").
const EnvoyReportInterval = 5 * time.Second

// Config configures the emulated filter.
type Config struct {
	// Domain is RateLimitQuotaFilterConfig.domain, sent in every report.
	Domain string
	// Settings are the RateLimitQuotaBucketSettings of the matcher every
	// bucket matches (the port takes bucket ids from its caller instead of
	// matching requests). Only no_assignment_behavior,
	// expired_assignment_behavior (fallback_rate_limit, timeout) and
	// bucket_id_builder (BucketIDFor) are read; reporting_interval is not,
	// as Envoy does not. Nil: no settings (ALLOW_ALL until assigned, no
	// fallback).
	Settings *rlqsfilterv3.RateLimitQuotaBucketSettings
	// ReportInterval is the report timer's period. 0 is Envoy's
	// (EnvoyReportInterval); anything else departs from Envoy, for tests
	// that need shorter rounds and say so.
	ReportInterval time.Duration
}

// FromFilterConfig is the Config for a RateLimitQuotaFilterConfig and the
// bucket settings of its matcher number i (bucket_matchers.matcher_list).
func FromFilterConfig(fc *rlqsfilterv3.RateLimitQuotaFilterConfig, i int) (Config, error) {
	ms := fc.GetBucketMatchers().GetMatcherList().GetMatchers()
	if i < 0 || i >= len(ms) {
		return Config{}, fmt.Errorf("rlqsfilter: no matcher %d (the config has %d)", i, len(ms))
	}
	var s rlqsfilterv3.RateLimitQuotaBucketSettings
	if err := ms[i].GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(&s); err != nil {
		return Config{}, fmt.Errorf("rlqsfilter: matcher %d's action: %w", i, err)
	}
	return Config{Domain: fc.GetDomain(), Settings: &s}, nil
}

func (c Config) check() error {
	if c.ReportInterval < 0 {
		return errors.New("rlqsfilter: negative report interval")
	}
	if c.Settings.GetNoAssignmentBehavior().GetFallbackRateLimit().GetTokenBucket() != nil {
		// The default action gets no token bucket (createBucketImpl passes
		// nullptr) and shouldAllowRequest dereferences it: Envoy crashes on
		// the bucket's second request.
		return errors.New("rlqsfilter: a token bucket as no_assignment_behavior crashes Envoy at the pinned commit")
	}
	return nil
}

func (c Config) reportInterval() time.Duration {
	if c.ReportInterval > 0 {
		return c.ReportInterval
	}
	return EnvoyReportInterval
}

// firstRequestAllowed ports noAssignmentBehaviorShouldAllow (filter.cc):
// only a blanket DENY_ALL denies a bucket's first request; a token bucket
// or requests-per-time-unit behaviour lets it pass.
func (c Config) firstRequestAllowed() bool {
	b, ok := c.Settings.GetNoAssignmentBehavior().GetFallbackRateLimit().GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	return !ok || b.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
}

// defaultRule is recordBucketUsage's default_bucket_action strategy: the
// no_assignment_behavior's fallback_rate_limit (an empty strategy if it
// names none: that fails open), or ALLOW_ALL when it is not configured.
func (c Config) defaultRule() *typev3.RateLimitStrategy {
	if nab := c.Settings.GetNoAssignmentBehavior(); nab != nil {
		if s := nab.GetFallbackRateLimit(); s != nil {
			return proto.Clone(s).(*typev3.RateLimitStrategy)
		}
		return &typev3.RateLimitStrategy{}
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
}

// fallback is recordBucketUsage's expiration_fallback_action: only a
// fallback_rate_limit counts (reuse_last_assignment is ignored).
func (c Config) fallback() *typev3.RateLimitStrategy {
	if s := c.Settings.GetExpiredAssignmentBehavior().GetFallbackRateLimit(); s != nil {
		return proto.Clone(s).(*typev3.RateLimitStrategy)
	}
	return nil
}

// fallbackTTL is recordBucketUsage's expiration_fallback_ttl: the whole
// seconds of expired_assignment_behavior_timeout, 0 when unset (the
// fallback then ends as soon as it starts).
func (c Config) fallbackTTL() time.Duration {
	t := c.Settings.GetExpiredAssignmentBehavior().GetExpiredAssignmentBehaviorTimeout()
	return max(time.Duration(t.GetSeconds())*time.Second, 0)
}

// BucketIDFor builds the bucket id settings' bucket_id_builder gives a
// request with these headers (port of generateBucketId, matcher.cc, for
// string_value and custom_value with an HttpRequestHeaderMatchInput;
// pseudo-headers such as ":method" are headers here). A missing header
// fails, as Envoy fails the id (the request then passes unreported); an
// empty one leaves its key out.
func BucketIDFor(settings *rlqsfilterv3.RateLimitQuotaBucketSettings, headers map[string]string) (BucketID, error) {
	lower := make(map[string]string, len(headers))
	for k, v := range headers {
		lower[strings.ToLower(k)] = v
	}
	id := BucketID{}
	for k, vb := range settings.GetBucketIdBuilder().GetBucketIdBuilder() {
		switch v := vb.GetValueSpecifier().(type) {
		case *rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder_StringValue:
			id[k] = v.StringValue
		case *rlqsfilterv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder_CustomValue:
			var in matcherv3.HttpRequestHeaderMatchInput
			if err := v.CustomValue.GetTypedConfig().UnmarshalTo(&in); err != nil {
				return nil, fmt.Errorf("rlqsfilter: bucket id key %q: only HttpRequestHeaderMatchInput is ported: %w", k, err)
			}
			h, ok := lower[strings.ToLower(in.GetHeaderName())]
			if !ok {
				return nil, fmt.Errorf("rlqsfilter: bucket id key %q: no header %q: Failed to generate the id from custom value config", k, in.GetHeaderName())
			}
			if h != "" {
				id[k] = h
			}
		default:
			return nil, fmt.Errorf("rlqsfilter: bucket id key %q has no value (Envoy panics)", k)
		}
	}
	return id, nil
}
