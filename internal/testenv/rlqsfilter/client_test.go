package rlqsfilter_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/internal/testenv/rlqsfilter"
)

// t0 is the virtual monotonic time every scenario starts at.
const t0 = rlqsfilter.MonotonicStart

func sec(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func id(tenant string) rlqsfilter.BucketID { return rlqsfilter.BucketID{"tenant": tenant} }

// Responses' actions.

func withID(tenant string, a *rlqsv3.RateLimitQuotaResponse_BucketAction) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	if tenant != "" {
		a.BucketId = &rlqsv3.BucketId{Bucket: id(tenant)}
	}
	return a
}

func assign(tenant string, ttl time.Duration, s *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return withID(tenant, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: s,
		}}})
}

func blanketRule(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

var (
	allowAll = blanketRule(typev3.RateLimitStrategy_ALLOW_ALL)
	denyAll  = blanketRule(typev3.RateLimitStrategy_DENY_ALL)
)

// tokens is a token bucket strategy; perFill < 0 leaves tokens_per_fill
// unset.
func tokens(maxTokens uint32, perFill int64, fill time.Duration) *typev3.RateLimitStrategy {
	tb := &typev3.TokenBucket{MaxTokens: maxTokens, FillInterval: durationpb.New(fill)}
	if perFill >= 0 {
		tb.TokensPerFill = wrapperspb.UInt32(uint32(perFill))
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tb}}
}

var rptu = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
	RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 100, TimeUnit: typev3.RateLimitUnit_MINUTE}}}

func abandon(tenant string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return withID(tenant, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
		AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}})
}

// Bucket settings.

func settings(noAssign, expired *typev3.RateLimitStrategy, timeout time.Duration) *rlqsfilterv3.RateLimitQuotaBucketSettings {
	s := &rlqsfilterv3.RateLimitQuotaBucketSettings{ReportingInterval: durationpb.New(time.Second)}
	if noAssign != nil {
		s.NoAssignmentBehavior = &rlqsfilterv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
			NoAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: noAssign}}
	}
	if expired != nil {
		s.ExpiredAssignmentBehavior = &rlqsfilterv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
			ExpiredAssignmentBehavior: &rlqsfilterv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: expired}}
		if timeout > 0 {
			s.ExpiredAssignmentBehavior.ExpiredAssignmentBehaviorTimeout = durationpb.New(timeout)
		}
	}
	return s
}

// A scenario's steps, each at a virtual time after t0 (the helpers take
// it in seconds).

type step struct {
	at time.Duration
	do func(t *testing.T, c *rlqsfilter.Client, now time.Duration)
}

func allow(at float64, tenant string, want bool) step {
	return step{sec(at), func(t *testing.T, c *rlqsfilter.Client, now time.Duration) {
		t.Helper()
		assert.Equal(t, want, c.Allow(now, id(tenant)), "request of %s at +%v", tenant, at)
	}}
}

// allowN sends n requests at one instant; want of them pass.
func allowN(at float64, tenant string, n, want int) step {
	return step{sec(at), func(t *testing.T, c *rlqsfilter.Client, now time.Duration) {
		t.Helper()
		got := 0
		for range n {
			if c.Allow(now, id(tenant)) {
				got++
			}
		}
		assert.Equal(t, want, got, "%d requests of %s at +%v", n, tenant, at)
	}}
}

// drain spends a bucket's tokens (at most 100 requests).
func drain(at float64, tenant string) step {
	return step{sec(at), func(t *testing.T, c *rlqsfilter.Client, now time.Duration) {
		for range 100 {
			if !c.Allow(now, id(tenant)) {
				return
			}
		}
		t.Fatalf("%s did not run dry", tenant)
	}}
}

func apply(at float64, actions ...*rlqsv3.RateLimitQuotaResponse_BucketAction) step {
	return step{sec(at), func(_ *testing.T, c *rlqsfilter.Client, now time.Duration) {
		c.Apply(now, &rlqsv3.RateLimitQuotaResponse{BucketAction: actions})
	}}
}

// sent checks the messages handed to the stream since the last check,
// each summed up by summary.
func sent(at float64, want ...string) step {
	return step{sec(at), func(t *testing.T, c *rlqsfilter.Client, now time.Duration) {
		t.Helper()
		c.Advance(now)
		var got []string
		for _, r := range c.Sent() {
			assert.Equal(t, "d", r.GetDomain(), "every report carries the domain")
			got = append(got, summary(r))
		}
		assert.Equal(t, want, got, "sent by +%v", at)
	}}
}

// summary is "tenant=a 1/2 5s; ..." (allowed/denied, time_elapsed) per
// usage.
func summary(r *rlqsv3.RateLimitQuotaUsageReports) string {
	var us []string
	for _, u := range r.GetBucketQuotaUsages() {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(u.GetBucketId().GetBucket())) {
			kv = append(kv, k+"="+u.GetBucketId().GetBucket()[k])
		}
		us = append(us, fmt.Sprintf("%s %d/%d %s", strings.Join(kv, ","), u.GetNumRequestsAllowed(), u.GetNumRequestsDenied(), u.GetTimeElapsed().AsDuration()))
	}
	return strings.Join(us, "; ")
}

func state(at float64, tenant string, check func(t *testing.T, b rlqsfilter.Bucket, ok bool)) step {
	return step{sec(at), func(t *testing.T, c *rlqsfilter.Client, now time.Duration) {
		t.Helper()
		b, ok := c.Bucket(now, id(tenant))
		check(t, b, ok)
	}}
}

func streamClosed(at float64) step {
	return step{sec(at), func(_ *testing.T, c *rlqsfilter.Client, now time.Duration) {
		c.Advance(now)
		c.StreamClosed()
	}}
}

// tb remembers a bucket's token bucket across steps.
type tb struct{ serial int }

func (m *tb) keep(at float64, tenant string) step {
	return state(at, tenant, func(t *testing.T, b rlqsfilter.Bucket, ok bool) {
		require.True(t, ok)
		require.NotZero(t, b.TokenBucket)
		m.serial = b.TokenBucket
	})
}

func (m *tb) same(at float64, tenant string, want bool) step {
	return state(at, tenant, func(t *testing.T, b rlqsfilter.Bucket, ok bool) {
		require.True(t, ok)
		require.NotZero(t, b.TokenBucket)
		assert.Equal(t, want, b.TokenBucket == m.serial, "same token bucket at +%v", at)
	})
}

func noAction(t *testing.T, b rlqsfilter.Bucket, ok bool) {
	t.Helper()
	require.True(t, ok)
	assert.Nil(t, b.Action)
	assert.Zero(t, b.TokenBucket)
	assert.False(t, b.Expiring)
	assert.False(t, b.InFallback)
}

type scenario struct {
	name  string
	cfg   rlqsfilter.Config
	opens []bool // the stream's open attempts, in order (then: opens)
	steps []step
}

func run(t *testing.T, sc scenario) {
	sc.cfg.Domain = "d"
	opens := 0
	c, err := rlqsfilter.NewClient(sc.cfg, func() bool {
		opens++
		return opens > len(sc.opens) || sc.opens[opens-1]
	})
	require.NoError(t, err)
	for _, s := range sc.steps {
		s.do(t, c, t0+s.at)
	}
}

// Cases of GlobalClientTest (client_test.cc) and RateLimitQuotaIntegrationTest
// (integration_test.cc), on virtual time; Envoy's 10 s test interval is
// its 5 s default here.
func TestEnvoyCases(t *testing.T) {
	half := &tb{}
	for _, sc := range []scenario{{
		name: "TestInitialCreation: the first request creates the bucket and reports it alone",
		steps: []step{
			allow(0, "a", true),
			sent(0, "tenant=a 1/0 0s"),
			state(0, "a", func(t *testing.T, b rlqsfilter.Bucket, ok bool) {
				noAction(t, b, ok)
				assert.Equal(t, typev3.RateLimitStrategy_ALLOW_ALL, b.Default.GetBlanketRule())
				assert.Zero(t, b.Allowed, "the immediate report took the count")
			}),
		},
	}, {
		name: "TestCreationWithDefaultDeny, MultiSameRequestNoAssignmentDenyAll: DENY_ALL until assigned",
		cfg:  rlqsfilter.Config{Settings: settings(denyAll, nil, 0)},
		steps: []step{
			allow(0, "a", false), allow(1, "a", false), allow(2, "a", false),
			sent(5, "tenant=a 0/1 0s", "tenant=a 0/2 5s"),
		},
	}, {
		name: "MultiRequestWithUnsupportedDefaultAction: a RequestsPerTimeUnit no-assignment passes",
		cfg:  rlqsfilter.Config{Settings: settings(rptu, nil, 0)},
		steps: []step{
			allow(0, "a", true), allow(1, "a", true),
		},
	}, {
		name: "BasicUsageReporting, BasicFlowPeriodicalReport: every interval, all buckets, counts since the last report",
		steps: []step{
			allow(0, "a", true),
			sent(0, "tenant=a 1/0 0s"),
			allow(1, "a", true),
			apply(1, assign("a", 120*time.Second, denyAll)),
			allow(2, "a", false), allow(2, "a", false),
			sent(5, "tenant=a 1/2 5s"),
			sent(10, "tenant=a 0/0 5s"),
			sent(25.5, "tenant=a 0/0 5s", "tenant=a 0/0 5s", "tenant=a 0/0 5s"),
		},
	}, {
		name: "MultiDifferentRequestNoAssignementAllowAll: each new bucket reports at once, alone",
		steps: []step{
			allow(0, "a", true), allow(1, "b", true), allow(2, "c", true), allow(2, "a", true),
			sent(2, "tenant=a 1/0 0s", "tenant=b 1/0 0s", "tenant=c 1/0 0s"),
			sent(5, "tenant=a 1/0 5s; tenant=b 0/0 4s; tenant=c 0/0 3s"),
		},
	}, {
		name:  "TestStreamCreationFailures: reports are dropped, with their counts, until a report reopens the stream",
		opens: []bool{false, false, false},
		steps: []step{
			allow(0, "a", true), allow(1, "a", true), allow(2, "a", true),
			sent(5),
			allowN(6, "a", 4, 4),
			sent(10),
			allowN(11, "a", 5, 5),
			sent(15, "tenant=a 5/0 5s"),
			step{15 * time.Second, func(t *testing.T, c *rlqsfilter.Client, _ time.Duration) { assert.Equal(t, 3, c.Dropped()) }},
		},
	}, {
		name: "TestStreamFailureMidUse, BasicFlowPeriodicalReportWithStreamClosed: the next report reopens the stream and reports all",
		steps: []step{
			allow(0, "a", true), allow(1, "a", true),
			sent(5, "tenant=a 1/0 0s", "tenant=a 1/0 5s"),
			streamClosed(6),
			allow(7, "b", true), allow(7, "b", true),
			allowN(8, "a", 3, 3),
			sent(8),
			sent(10, "tenant=a 3/0 5s; tenant=b 1/0 3s"),
		},
	}, {
		name: "TestBasicResponseProcessing: deny-all, allow-all and token bucket; a duplicate keeps the token bucket",
		steps: []step{
			allow(0, "a", true), allow(0, "b", true), allow(0, "c", true),
			apply(1, assign("a", 120*time.Second, denyAll), assign("b", 120*time.Second, allowAll),
				assign("c", 120*time.Second, tokens(300, 60, 12*time.Second))),
			allow(1, "a", false), allow(1, "b", true),
			half.keep(1, "c"),
			allowN(1, "c", 301, 300),
			apply(1, assign("c", 120*time.Second, tokens(300, 60, 12*time.Second))),
			half.same(1, "c", true),
			allow(1, "c", false),
			allow(1.25, "c", true), // 5 tokens/s
			allow(1.25, "c", false),
		},
	}, {
		name: "TestDuplicateTokenBucket: a duplicate restarts the TTL; expiry without a fallback drops the action",
		steps: []step{
			allow(0, "a", true),
			apply(1, assign("a", 120*time.Second, tokens(300, 60, 12*time.Second))),
			half.keep(1, "a"),
			allowN(1, "a", 300, 300),
			apply(2, assign("a", 120*time.Second, tokens(300, 60, 12*time.Second))),
			half.same(2, "a", true),
			state(121, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) {
				assert.True(t, b.Expiring)
				assert.Equal(t, t0+122*time.Second, b.Expires)
			}),
			state(122, "a", noAction),
		},
	}, {
		name: "TestResponseProcessingForNonExistentBucket, TestResponseEdgeCases, TestResponseBucketMissingId, BasicFlowEmptyResponse: skipped actions",
		steps: []step{
			allow(0, "a", true), allow(0, "b", true),
			apply(1),
			apply(1, assign("a", 120*time.Second, rptu), assign("b", 120*time.Second, &typev3.RateLimitStrategy{}),
				assign("x", 120*time.Second, denyAll), assign("", 120*time.Second, denyAll)),
			state(1, "a", noAction), state(1, "b", noAction),
			state(1, "x", func(t *testing.T, _ rlqsfilter.Bucket, ok bool) { assert.False(t, ok, "no bucket from a response") }),
			allow(1, "a", true),
			apply(2, assign("", 120*time.Second, allowAll), assign("a", 120*time.Second, denyAll)),
			allow(2, "a", false),
			// A skipped action leaves the bucket's action and TTL as they were.
			apply(3, assign("a", 120*time.Second, rptu)),
			state(3, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) {
				assert.Equal(t, typev3.RateLimitStrategy_DENY_ALL, b.Action.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule())
				assert.Equal(t, t0+122*time.Second, b.Expires)
			}),
		},
	}, {
		name: "TestExpirationAndFallback (deny bucket), MultiSameRequestWithExpirationWithoutFallback: no fallback, back to the default",
		cfg:  rlqsfilter.Config{Settings: settings(allowAll, nil, 0)},
		steps: []step{
			allow(0, "a", true),
			apply(1, assign("a", 15*time.Second, denyAll)),
			allow(15, "a", false),
			allow(16, "a", true),
			state(16, "a", noAction),
		},
	}, {
		name: "MultiSameRequestWithExpirationToDefaultDeny: the fallback for its timeout, then the default",
		cfg:  rlqsfilter.Config{Settings: settings(allowAll, denyAll, 15*time.Second)},
		steps: []step{
			allow(0, "a", true),
			apply(1, assign("a", 15*time.Second, denyAll)),
			allow(15, "a", false),
			state(30, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) {
				assert.True(t, b.InFallback)
				assert.Equal(t, t0+31*time.Second, b.Expires)
			}),
			allow(30, "a", false),
			allow(31, "a", true),
			state(45, "a", noAction),
		},
	}, {
		name: "MultiSameRequestWithExpiredAssignmentDeny, MultiSameRequestWithExpiredAssignmentAllow: the fallback decides; no new report",
		cfg:  rlqsfilter.Config{Settings: settings(nil, allowAll, 15*time.Second)},
		steps: []step{
			allow(0, "a", true),
			sent(0, "tenant=a 1/0 0s"),
			apply(0, assign("a", 2*time.Second, denyAll)),
			allow(1, "a", false),
			allow(3, "a", true),
			sent(3),
		},
	}, {
		name: "TestExpirationAndFallback (token bucket): a different fallback token bucket replaces it, then the default",
		cfg:  rlqsfilter.Config{Settings: settings(nil, tokens(100, 60, 12*time.Second), 300*time.Second)},
		steps: []step{
			allow(0, "a", true),
			apply(1, assign("a", 120*time.Second, tokens(300, 60, 12*time.Second))),
			half.keep(1, "a"),
			state(121, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) {
				assert.True(t, b.InFallback)
				assert.Equal(t, uint32(100), b.Action.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens())
				assert.InDelta(t, 100, b.Tokens, 1e-6, "a full old bucket: a full new one")
			}),
			half.same(121, "a", false),
			state(421, "a", noAction),
		},
	}, {
		name: "TestFallbackToDuplicateTokenBucket: an equal fallback token bucket keeps it",
		cfg:  rlqsfilter.Config{Settings: settings(nil, tokens(100, 60, 12*time.Second), 300*time.Second)},
		steps: []step{
			allow(0, "a", true),
			apply(1, assign("a", 120*time.Second, tokens(100, 60, 12*time.Second))),
			half.keep(1, "a"),
			state(121, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) { assert.True(t, b.InFallback) }),
			half.same(121, "a", true),
		},
	}, {
		name: "TestExpirationAndFallback (allow bucket): a new assignment ends the fallback and its timer",
		cfg:  rlqsfilter.Config{Settings: settings(nil, denyAll, 300*time.Second)},
		steps: []step{
			allow(0, "a", true),
			apply(0, assign("a", 120*time.Second, allowAll)),
			allow(121, "a", false),
			apply(130, assign("a", 120*time.Second, allowAll)),
			allow(130, "a", true),
			state(130, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) {
				assert.True(t, b.Expiring)
				assert.False(t, b.InFallback)
			}),
			// The first fallback would have ended at 420; the second one,
			// from 250, lasts until 550.
			allow(430, "a", false),
			state(430, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) { assert.Equal(t, 2, b.Fallbacks) }),
			allow(550, "a", true),
		},
	}, {
		name: "TestAbandonAction, MultiSameRequestWithAbandonAction: abandon erases; the next request recreates and reports it",
		cfg:  rlqsfilter.Config{Settings: settings(denyAll, nil, 0)},
		steps: []step{
			allow(0, "a", false),
			apply(1, assign("a", 60*time.Second, allowAll)),
			allow(1, "a", true),
			apply(2, abandon("a")),
			state(2, "a", func(t *testing.T, _ rlqsfilter.Bucket, ok bool) { assert.False(t, ok) }),
			sent(5, "tenant=a 0/1 0s", ""),
			allow(6, "a", false),
			sent(6, "tenant=a 0/1 0s"),
		},
	}, {
		name: "MultiRequestWithTokenBucketThrottling: 1 token, 30 per 60 s",
		steps: []step{
			allow(0, "a", true),
			apply(0, assign("a", 120*time.Second, tokens(1, 30, 60*time.Second))),
			allow(0, "a", true), allow(0, "a", false),
			allow(2, "a", true), allow(2, "a", false),
			allow(4, "a", true), allow(4, "a", false),
		},
	}} {
		t.Run(sc.name, func(t *testing.T) { run(t, sc) })
	}
}

// The behaviours issue 43 reads in Envoy's code, on the port.
func TestEnvoyCodeNotComments(t *testing.T) {
	m := &tb{}
	var left float64
	for _, sc := range []scenario{{
		name: "protoTokenBucketsEq ignores fill_interval.seconds: the spent bucket is kept",
		steps: []step{
			allow(0, "a", true),
			apply(1, assign("a", 10*time.Second, tokens(100, 1, time.Hour))),
			m.keep(1, "a"),
			allowN(1, "a", 100, 100),
			apply(2, assign("a", 10*time.Second, tokens(100, 1, time.Hour+time.Second))),
			m.same(2, "a", true),
			allow(2, "a", false),
			apply(3, assign("a", 10*time.Second, tokens(100, 1, time.Hour))),
			m.same(3, "a", true),
			allow(3, "a", false),
			// The TTL moved with each: the first would have ended at 11.
			state(12, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) { assert.Equal(t, t0+13*time.Second, b.Expires) }),
		},
	}, {
		name: "a change in fill_interval.nanos or max_tokens replaces it, with the old ratio of tokens",
		steps: []step{
			allow(0, "a", true),
			apply(0, assign("a", 60*time.Second, tokens(100, 3600, time.Hour))),
			allowN(0, "a", 50, 50),
			m.keep(0, "a"),
			apply(0, assign("a", 60*time.Second, tokens(200, 3600, time.Hour))),
			m.same(0, "a", false),
			state(0, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) { assert.InDelta(t, 100, b.Tokens, 1e-6) }),
			allowN(0, "a", 200, 100),
			m.keep(0, "a"),
			// Empty: the next one starts empty too.
			apply(0, assign("a", 60*time.Second, tokens(200, 3600, time.Hour+time.Second/2))),
			m.same(0, "a", false),
			allow(0, "a", false),
		},
	}, {
		name: "a blanket rule drops the token bucket: the same token bucket again starts full",
		steps: []step{
			allow(0, "a", true),
			apply(0, assign("a", 60*time.Second, tokens(10, 1, time.Hour))),
			allowN(0, "a", 10, 10),
			apply(0, assign("a", 60*time.Second, allowAll)),
			apply(0, assign("a", 60*time.Second, tokens(10, 1, time.Hour))),
			allowN(0, "a", 11, 10),
		},
	}, {
		name: "an expired token bucket is gone: the same assignment again starts full",
		steps: []step{
			allow(0, "a", true),
			apply(0, assign("a", 2*time.Second, tokens(10, 1, time.Hour))),
			allowN(0, "a", 10, 10),
			apply(2, assign("a", 2*time.Second, tokens(10, 1, time.Hour))),
			allowN(2, "a", 11, 10),
		},
	}, {
		name: "a fill interval under 1 s divides by zero seconds: no limit",
		steps: []step{
			allow(0, "a", true), allow(0, "b", true),
			apply(0, assign("a", 60*time.Second, tokens(5, 1000, 500*time.Millisecond)),
				assign("b", 60*time.Second, tokens(5, 0, 999*time.Millisecond))),
			allowN(0, "a", 10000, 10000),
			allowN(0.001, "a", 10000, 10000),
			allowN(0, "b", 10000, 10000),
		},
	}, {
		name: "tokens_per_fill unset is 0: one token a year",
		steps: []step{
			allow(0, "a", true),
			apply(0, assign("a", 2*time.Hour, tokens(2, -1, time.Second))),
			drain(0, "a"),
			state(0, "a", func(_ *testing.T, b rlqsfilter.Bucket, _ bool) { left = b.Tokens }),
			allow(3600, "a", false),
			state(3600, "a", func(t *testing.T, b rlqsfilter.Bucket, _ bool) {
				assert.InDelta(t, 3600.0/(365*24*3600), b.Tokens-left, 1e-9)
			}),
		},
	}, {
		name: "a new bucket starts full however long max_tokens / fill_rate is (no clock check at the pinned commit)",
		steps: []step{
			allow(0, "a", true),
			// 10 tokens at 1 per 10^6 s: a window of 10^7 s, past the
			// clock's 10^6 s, where later versions start empty.
			apply(0, assign("a", 60*time.Second, tokens(10, 1, 1_000_000*time.Second))),
			allowN(0, "a", 11, 10),
		},
	}, {
		name: "fill_interval in whole seconds: 1.9 s is 1 s",
		steps: []step{
			allow(0, "a", true),
			apply(0, assign("a", 60*time.Second, tokens(1, 1, sec(1.9)))),
			allow(0, "a", true), allow(0, "a", false),
			allow(1, "a", true), allow(1, "a", false),
		},
	}, {
		name: "the TTL's nanos are dropped: 1.9 s lasts 1 s, 0.5 s expires at once",
		steps: []step{
			allow(0, "a", true),
			apply(1, assign("a", sec(1.9), denyAll)),
			allow(1.99, "a", false),
			allow(2, "a", true),
			apply(3, assign("a", 500*time.Millisecond, denyAll)),
			allow(3, "a", true),
		},
	}, {
		name: "a fallback without a timeout ends as it starts (deploy/envoy/rlqs.yaml's shape)",
		cfg:  rlqsfilter.Config{Settings: settings(allowAll, denyAll, 0)},
		steps: []step{
			allow(0, "a", true),
			apply(0, assign("a", 2*time.Second, denyAll)),
			allow(1, "a", false),
			allow(2, "a", true),
			state(2, "a", func(t *testing.T, b rlqsfilter.Bucket, ok bool) {
				noAction(t, b, ok)
				assert.Equal(t, 1, b.Fallbacks)
			}),
		},
	}, {
		name: "an action with only a bucket id expires as it comes",
		cfg:  rlqsfilter.Config{Settings: settings(denyAll, nil, 0)},
		steps: []step{
			allow(0, "a", false),
			apply(1, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: id("a")}}),
			state(1, "a", noAction),
			allow(1, "a", false),
		},
	}, {
		name: "time_elapsed is truncated to whole seconds, per bucket",
		steps: []step{
			allow(0, "a", true), allow(2.7, "b", true),
			sent(4.99, "tenant=a 1/0 0s", "tenant=b 1/0 0s"),
			sent(5, "tenant=a 0/0 5s; tenant=b 0/0 2s"),
		},
	}, {
		name: "the report timer is armed by the first bucket and re-armed when it fires",
		steps: []step{
			step{0, func(t *testing.T, c *rlqsfilter.Client, _ time.Duration) {
				_, armed := c.NextReport()
				assert.False(t, armed)
			}},
			allow(0.3, "a", true),
			step{sec(0.3), func(t *testing.T, c *rlqsfilter.Client, _ time.Duration) {
				at, armed := c.NextReport()
				assert.True(t, armed)
				assert.Equal(t, t0+sec(5.3), at)
			}},
			sent(5.2, "tenant=a 1/0 0s"),
			sent(5.3, "tenant=a 0/0 5s"),
		},
	}} {
		t.Run(sc.name, func(t *testing.T) { run(t, sc) })
	}
}

func TestConfigRefusesATokenBucketNoAssignment(t *testing.T) {
	_, err := rlqsfilter.NewClient(rlqsfilter.Config{Settings: settings(tokens(10, 1, time.Second), nil, 0)}, nil)
	assert.ErrorContains(t, err, "crashes Envoy")
}

// The report interval is Envoy's 5 s unless a test sets one.
func TestReportIntervalIsEnvoys(t *testing.T) {
	for _, tc := range []struct {
		set, want time.Duration
	}{{0, 5 * time.Second}, {time.Second, time.Second}} {
		c, err := rlqsfilter.NewClient(rlqsfilter.Config{ReportInterval: tc.set}, nil)
		require.NoError(t, err)
		c.Allow(t0, id("a"))
		at, armed := c.NextReport()
		require.True(t, armed)
		assert.Equal(t, t0+tc.want, at)
	}
}
