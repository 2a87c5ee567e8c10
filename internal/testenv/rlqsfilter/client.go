package rlqsfilter

import (
	"container/heap"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// BucketID is a bucket's id: the map of rlqs.proto's BucketId.
type BucketID = map[string]string

type bucketAction = rlqsv3.RateLimitQuotaResponse_BucketAction

// usage ports QuotaUsage (quota_bucket_cache.h).
type usage struct {
	allowed, denied uint64
	lastReport      time.Duration
}

// bucket ports CachedBucket (quota_bucket_cache.h). Envoy swaps in a new
// CachedBucket on every change and its timers die with the old one; here
// the fields change in place and gen counts the swaps, so that a timer
// set for an older generation is recognised as dead.
type bucket struct {
	key          string
	id           *rlqsv3.BucketId
	usage        *usage
	cached       *bucketAction // nil: none (the default applies)
	fallback     *typev3.RateLimitStrategy
	fallbackTTL  time.Duration
	defaultRule  *typev3.RateLimitStrategy // default_action's strategy
	tb           *tokenBucket
	gen          uint64
	actionAt     time.Duration // action_expiration_timer's deadline
	actionSet    bool
	fallbackAt   time.Duration // fallback_expiration_timer's deadline
	fallbackSet  bool
	sawFallbacks int // for tests: fallbacks installed
}

// Client is the pure core of the port: GlobalRateLimitClientImpl (the
// buckets, reports, responses and timers of global_client_impl.cc) plus
// the filter's per-request decision (filter.cc), driven by a monotonic
// clock the caller passes in. It does no I/O: what it sends is queued
// for Sent, and opening the stream is a hook. Not safe for concurrent
// use (Envoy serialises it on its main thread).
type Client struct {
	cfg      Config
	interval time.Duration
	open     func() bool

	buckets   map[string]*bucket
	timers    timerHeap
	seq       uint64
	tbSerial  int
	now       time.Duration // the latest time a timer fired at or a call came
	tried     bool          // stream_tried_by_bucket_creation_
	streamUp  bool          // stream_ != nullptr
	reportSet bool          // send_reports_timer_ enabled
	reportAt  time.Duration
	outbox    []*rlqsv3.RateLimitQuotaUsageReports
	dropped   int // reports built while the stream was down
}

// NewClient makes a core for cfg. open ports startStreamImpl: it is called
// (at the first bucket, and at each report while the stream is down) to
// start a stream, and reports whether it started; nil always starts.
func NewClient(cfg Config, open func() bool) (*Client, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if open == nil {
		open = func() bool { return true }
	}
	c := &Client{cfg: cfg, interval: cfg.reportInterval(), open: open, buckets: map[string]*bucket{}}
	return c, nil
}

func key(id BucketID) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(id)) {
		b.WriteString(k + "=" + id[k] + "\x00")
	}
	return b.String()
}

// Allow decides one request of bucket id at now: filter.cc's
// recordBucketUsage with the bucket already cached (processCachedBucket)
// or not (createBucket, then the no-assignment answer for the first
// request).
func (c *Client) Allow(now time.Duration, id BucketID) bool {
	c.Advance(now)
	if b := c.buckets[key(id)]; b != nil {
		ok := c.shouldAllow(now, b)
		if ok {
			b.usage.allowed++
		} else {
			b.usage.denied++
		}
		return ok
	}
	first := c.cfg.firstRequestAllowed()
	c.createBucket(now, id, first)
	return first
}

// shouldAllow ports filter.cc's shouldAllowRequest: the cached action, or
// the default one, decides; what it cannot enforce passes.
func (c *Client) shouldAllow(now time.Duration, b *bucket) bool {
	var s *typev3.RateLimitStrategy
	if b.cached != nil {
		s = b.cached.GetQuotaAssignmentAction().GetRateLimitStrategy()
	} else {
		s = b.defaultRule
	}
	switch st := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		// A rule number this build does not know falls out of the switch
		// and passes (the function's last line).
		return st.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		if b.tb == nil {
			// Envoy dereferences a null token_bucket_limiter here (a token
			// bucket as no_assignment_behavior); Config.check refuses it.
			panic(fmt.Sprintf("rlqsfilter: bucket %v has a token bucket strategy and no token bucket", b.id.GetBucket()))
		}
		return b.tb.consume1(now)
	default:
		// RequestsPerTimeUnit (not implemented) and an unset strategy
		// both fail open.
		return true
	}
}

// createBucket ports createBucketImpl: the first bucket starts the report
// timer and the stream; a new bucket starts its usage with the request
// that created it and is reported at once, alone.
func (c *Client) createBucket(now time.Duration, id BucketID, allowed bool) {
	if !c.tried {
		c.tried = true
		c.reportSet, c.reportAt = true, now+c.interval
		c.pushTimer(now+c.interval, timerReport, nil)
		c.streamUp = c.open()
	}
	b := &bucket{
		key: key(id), id: &rlqsv3.BucketId{Bucket: maps.Clone(id)},
		usage:    &usage{lastReport: now},
		fallback: c.cfg.fallback(), fallbackTTL: c.cfg.fallbackTTL(), defaultRule: c.cfg.defaultRule(),
	}
	if allowed {
		b.usage.allowed = 1
	} else {
		b.usage.denied = 1
	}
	c.buckets[b.key] = b
	c.send(&rlqsv3.RateLimitQuotaUsageReports{Domain: c.cfg.Domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{c.takeUsage(now, b)}})
}

// takeUsage ports getUsageFromBucket: the counts since the last report,
// reset, and time_elapsed in whole seconds (duration_cast truncates).
func (c *Client) takeUsage(now time.Duration, b *bucket) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           proto.Clone(b.id).(*rlqsv3.BucketId),
		NumRequestsAllowed: b.usage.allowed, NumRequestsDenied: b.usage.denied,
		TimeElapsed: &durationpb.Duration{Seconds: int64((now - b.usage.lastReport) / time.Second)},
	}
	b.usage.allowed, b.usage.denied, b.usage.lastReport = 0, 0, now
	return u
}

// send ports sendUsageReportImpl: a report built while the stream is down
// is dropped (its counts were reset all the same).
func (c *Client) send(r *rlqsv3.RateLimitQuotaUsageReports) {
	if !c.streamUp {
		c.dropped++
		return
	}
	c.outbox = append(c.outbox, r)
}

// report ports onSendReportsTimer: every bucket (none is fine: the report
// then carries only the domain), built before the stream is retried.
// Envoy iterates a hash map; the port sorts by bucket id.
func (c *Client) report(now time.Duration) {
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: c.cfg.Domain}
	for _, k := range slices.Sorted(maps.Keys(c.buckets)) {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, c.takeUsage(now, c.buckets[k]))
	}
	if !c.streamUp {
		c.streamUp = c.open()
	}
	c.send(r)
}

// StreamClosed ports onRemoteClose: the stream is gone until the next
// report reopens it; reports until then are dropped.
func (c *Client) StreamClosed() { c.streamUp = false }

// Sent drains what the client handed to the stream, in order.
func (c *Client) Sent() []*rlqsv3.RateLimitQuotaUsageReports {
	out := c.outbox
	c.outbox = nil
	return out
}

// Pending is how many messages Sent would return.
func (c *Client) Pending() int { return len(c.outbox) }

// Dropped is how many reports were built while the stream was down.
func (c *Client) Dropped() int { return c.dropped }

// NextReport is when the report timer fires next (false before the
// first bucket).
func (c *Client) NextReport() (time.Duration, bool) { return c.reportAt, c.reportSet }

// Apply ports onQuotaResponseImpl at now.
func (c *Client) Apply(now time.Duration, resp *rlqsv3.RateLimitQuotaResponse) {
	c.Advance(now)
	for _, a := range resp.GetBucketAction() {
		c.apply(now, a)
	}
}

func (c *Client) apply(now time.Duration, a *bucketAction) {
	if len(a.GetBucketId().GetBucket()) == 0 {
		return // "a bucket is missing its id": skipped
	}
	b := c.buckets[key(a.GetBucketId().GetBucket())]
	if b == nil {
		return // a bucket this client never reported: skipped
	}
	var tb *tokenBucket
	if qa := a.GetQuotaAssignmentAction(); qa != nil {
		s := qa.GetRateLimitStrategy()
		switch s.GetStrategy().(type) {
		case *typev3.RateLimitStrategy_BlanketRule_:
		case *typev3.RateLimitStrategy_TokenBucket:
			if c.shouldReplaceTokenBucket(b, s) {
				tb = c.newTokenBucket(s, b.tb, now)
			} else {
				tb = b.tb
			}
		default:
			// RequestsPerTimeUnit or no strategy: logged and skipped, the
			// bucket and its timers untouched.
			return
		}
	} else if a.GetAbandonAction() != nil {
		delete(c.buckets, b.key)
		return
	}
	// An action that is neither (only a bucket id) is cached as it is: it
	// passes requests (no strategy) and expires at once (a TTL of 0).
	b.gen++
	b.cached = proto.Clone(a).(*bucketAction)
	b.tb = tb
	b.fallbackSet = false
	c.startActionExpiration(now, b)
}

// shouldReplaceTokenBucket ports the function of that name: keep the old
// bucket, spent tokens and all, when the cached action is a token bucket
// "equal" by protoTokenBucketsEq.
func (c *Client) shouldReplaceTokenBucket(b *bucket, s *typev3.RateLimitStrategy) bool {
	old := b.cached.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	return old == nil || !tokenBucketsEq(s.GetTokenBucket(), old)
}

func (c *Client) newTokenBucket(s *typev3.RateLimitStrategy, old *tokenBucket, now time.Duration) *tokenBucket {
	c.tbSerial++
	return tokenBucketFromStrategy(c.tbSerial, s, old, now)
}

// startActionExpiration ports startActionExpirationTimer: the TTL's whole
// seconds only (nanos dropped: a TTL under 1 s expires at once).
func (c *Client) startActionExpiration(now time.Duration, b *bucket) {
	ttl := max(time.Duration(b.cached.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds())*time.Second, 0)
	b.actionSet, b.actionAt = true, now+ttl
	c.pushTimer(b.actionAt, timerAction, b)
}

// onActionExpiration ports onActionExpirationTimer: the configured
// fallback for its TTL, else straight to the default.
func (c *Client) onActionExpiration(now time.Duration, b *bucket) {
	b.gen++
	b.actionSet = false
	if b.fallback == nil {
		b.cached, b.tb = nil, nil
		return
	}
	next := &bucketAction{BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
		QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			RateLimitStrategy: proto.Clone(b.fallback).(*typev3.RateLimitStrategy),
		}}}
	var tb *tokenBucket
	if b.fallback.GetTokenBucket() != nil {
		if c.shouldReplaceTokenBucket(b, b.fallback) {
			tb = c.newTokenBucket(b.fallback, b.tb, now)
		} else {
			tb = b.tb
		}
	}
	b.cached, b.tb = next, tb
	b.sawFallbacks++
	b.fallbackSet, b.fallbackAt = true, now+b.fallbackTTL
	c.pushTimer(b.fallbackAt, timerFallback, b)
}

// onFallbackExpiration ports onFallbackExpirationTimer: back to the
// default (no_assignment_behavior).
func (c *Client) onFallbackExpiration(b *bucket) {
	b.gen++
	b.fallbackSet = false
	b.cached, b.tb = nil, nil
}

// Advance fires, in order, every timer due at or before now, each at its
// own deadline: report, action expiry and fallback expiry timers.
func (c *Client) Advance(now time.Duration) {
	for len(c.timers) > 0 && c.timers[0].at <= now {
		t := heap.Pop(&c.timers).(timer)
		c.now = max(c.now, t.at)
		switch t.kind {
		case timerReport:
			// Re-armed from when it fired (send_reports_timer_'s callback).
			c.report(t.at)
			c.reportAt = t.at + c.interval
			c.pushTimer(c.reportAt, timerReport, nil)
		case timerAction:
			if c.live(t) {
				c.onActionExpiration(t.at, t.b)
			}
		case timerFallback:
			if c.live(t) {
				c.onFallbackExpiration(t.b)
			}
		}
	}
	c.now = max(c.now, now)
}

// live is the timers' check that their bucket is still the one in the
// cache (not abandoned, not replaced since).
func (c *Client) live(t timer) bool { return c.buckets[t.b.key] == t.b && t.b.gen == t.gen }

// Bucket is one bucket's state, for tests and for Filter.Strategy.
type Bucket struct {
	// Action is the cached action: the server's last assignment, or the
	// expired-assignment fallback (nil: none, the default applies). It is
	// the client's own: read it, do not modify it.
	Action *rlqsv3.RateLimitQuotaResponse_BucketAction
	// Default is the no-assignment strategy.
	Default *typev3.RateLimitStrategy
	// TokenBucket identifies the bucket's token bucket (0: none): equal
	// numbers are the same bucket, kept with its tokens.
	TokenBucket int
	Tokens      float64 // the token bucket's remaining tokens
	// Expires is when the action's TTL ends (Expiring), or, in fallback,
	// when the fallback's does (InFallback).
	Expires              time.Duration
	Expiring, InFallback bool
	// Fallbacks is how many times the expired-assignment fallback took
	// over.
	Fallbacks       int
	Allowed, Denied uint64 // since the last report
}

// Bucket returns bucket id's state at now (false: not cached).
func (c *Client) Bucket(now time.Duration, id BucketID) (Bucket, bool) {
	c.Advance(now)
	b := c.buckets[key(id)]
	if b == nil {
		return Bucket{}, false
	}
	out := Bucket{Action: b.cached, Default: b.defaultRule, Expiring: b.actionSet, InFallback: b.fallbackSet,
		Fallbacks: b.sawFallbacks, Allowed: b.usage.allowed, Denied: b.usage.denied}
	switch {
	case b.actionSet:
		out.Expires = b.actionAt
	case b.fallbackSet:
		out.Expires = b.fallbackAt
	}
	if b.tb != nil {
		out.TokenBucket, out.Tokens = b.tb.serial, b.tb.remaining(max(now, c.now))
	}
	return out, true
}

// Buckets is how many buckets are cached.
func (c *Client) Buckets() int { return len(c.buckets) }

type timerKind int

const (
	timerReport timerKind = iota
	timerAction
	timerFallback
)

// timer is one armed timer; equal deadlines fire in the order they were
// armed.
type timer struct {
	at   time.Duration
	seq  uint64
	kind timerKind
	b    *bucket
	gen  uint64
}

func (c *Client) pushTimer(at time.Duration, kind timerKind, b *bucket) {
	c.seq++
	t := timer{at: at, seq: c.seq, kind: kind, b: b}
	if b != nil {
		t.gen = b.gen
	}
	heap.Push(&c.timers, t)
}

type timerHeap []timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}
