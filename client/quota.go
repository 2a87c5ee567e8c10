package client

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot/lease"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// Quota configures WithQuota. Zero fields take the defaults.
type Quota struct {
	// ReportInterval is how often usage is reported on the stream: whole
	// seconds, at least 1 s (the node refuses a stream reporting faster,
	// as Envoy's filter reports elapsed time in whole seconds); a shorter
	// one is raised to 1 s, a fraction rounded down. Default 1 s.
	ReportInterval time.Duration
	// HotAfter is how many checks of one request identity within one
	// report interval make it hot: from then on it is decided from its
	// assignment. Default 16.
	HotAfter int
}

// QuotaDomain is the RLQS domain the client's stream names. It tells the node
// that the client checks by RPC what it holds no assignment for: a
// bucket no assignment can decide (one an exact policy limits) is abandoned,
// and the client checks that identity by RPC from then on.
const QuotaDomain = "allot.client"

// maxQuotaKeys caps the hot identities: the buckets a node holds for one
// stream (rlqs.DefaultMaxBuckets; a test keeps them equal).
const maxQuotaKeys = 4096

// unbatchableFor is how long an identity whose bucket the node abandoned
// is checked by RPC before it may be subscribed again (a policy reload
// may have made it leased).
const unbatchableFor = time.Minute

// Quota defaults.
const (
	DefaultReportInterval = time.Second
	DefaultHotAfter       = 16
)

// WithQuota makes the client an RLQS client (Envoy's Rate Limit Quota
// Service, which nodes serve): a request identity checked at least
// HotAfter times in one report interval is subscribed on one stream, and
// while its assignment lives its checks are decided in this process, with
// no RPC: a batch of requests the node took from its lease of the same
// region bucket, or a blanket allow or deny. Usage is reported every
// ReportInterval. Checks of other identities, of an identity whose
// assignment has not arrived or has expired, and checks with a token_cost
// go to the node as before (and so to OnUnreachable when no node answers).
// docs/rlqs.md gives the assignments and the bound they keep.
func WithQuota(q Quota) Option { return func(c *config) { c.quota = &q } }

// Kinds of assignment a quota key holds.
const (
	kindNone int32 = iota
	kindAllow
	kindDeny
	kindBucket // a token bucket: a rate part, or the node's limit/N
)

// qkey is one hot identity.
type qkey struct {
	id  map[string]string
	key denyKey
	// kind, expires (unix ns) and tokens are the assignment: written by
	// the stream's receiver (tokens first, expires last), read by
	// decisions without a lock.
	kind    atomic.Int32
	expires atomic.Int64
	// local is the token bucket of a kindBucket assignment, decided
	// under its lock.
	local struct {
		sync.Mutex
		tokens, max, rate float64
		last              int64
	}
	allowed, denied atomic.Uint64
	// Owned by the stream's goroutines.
	strategy *typev3.RateLimitStrategy
	reported int64
}

// quota is the client's RLQS side: its keys and the goroutine that owns
// the stream.
type quota struct {
	cfg Quota
	// now is a monotonic clock in ns: a 1 ms coarse clock (time.Now costs
	// a third of a decision), or WithClock's.
	now   func() int64
	clock *lease.CoarseClock // nil with WithClock
	rlq   rlqsv3.RateLimitQuotaServiceClient

	mu   sync.RWMutex
	keys map[denyKey]*qkey
	// last is the key live found last: a hot identity checked in a loop
	// compares its fields with it instead of hashing them into keys (the
	// hash of six strings was 40 % of a decision).
	last atomic.Pointer[qkey]

	wmu  sync.Mutex
	warm map[denyKey]int32 // checks this interval of identities not hot
	// unbatchable holds identities whose buckets the node abandoned, until
	// when (q.now) they are checked by RPC without being counted.
	unbatchable map[denyKey]int64

	subscribe chan *qkey // keys to report at once (their first report)
	stop      chan struct{}
	done      chan struct{}
	// messages counts stream messages sent and received.
	messages atomic.Int64
}

func newQuota(q Quota, cfg config, rlq rlqsv3.RateLimitQuotaServiceClient) *quota {
	q.ReportInterval = max(q.ReportInterval.Truncate(time.Second), time.Second)
	if q.HotAfter <= 0 {
		q.HotAfter = DefaultHotAfter
	}
	qt := &quota{
		cfg: q, rlq: rlq,
		keys: map[denyKey]*qkey{}, warm: map[denyKey]int32{}, unbatchable: map[denyKey]int64{},
		subscribe: make(chan *qkey, 64), stop: make(chan struct{}), done: make(chan struct{}),
	}
	if cfg.clockSet {
		qt.now = func() int64 { return cfg.now().UnixNano() }
	} else {
		qt.clock = lease.NewCoarseClock(lease.DefaultTick)
		qt.now = qt.clock.Now
	}
	go qt.run()
	return qt
}

func (q *quota) close() {
	close(q.stop)
	<-q.done
	if q.clock != nil {
		q.clock.Stop()
	}
}

// live returns k's key if its assignment lives at now (q.now); nil sends
// the check to a node. A key not hot yet is counted (r).
func (q *quota) live(k denyKey, r *ratelimitv1.RateLimitRequest, now int64) *qkey {
	if b := q.last.Load(); b != nil && b.key == k && now < b.expires.Load() {
		return b
	}
	q.mu.RLock()
	b := q.keys[k]
	q.mu.RUnlock()
	if b == nil {
		q.note(k, r)
		return nil
	}
	if now >= b.expires.Load() {
		return nil // none yet, or expired: never reused
	}
	q.last.Store(b)
	return b
}

// decide answers one check from b's assignment into out, and reports
// whether it could (false: the assignment changed under it to none).
func (b *qkey) decide(now int64, out *ratelimitv1.RateLimitResponse) bool {
	exp := b.expires.Load()
	var ok bool
	var left int64
	switch b.kind.Load() {
	case kindAllow:
		ok = true
	case kindDeny:
	case kindBucket:
		ok, left = b.takeLocal(now)
	default:
		return false
	}
	out.Reset()
	if ok {
		b.allowed.Add(1)
		out.Decision = ratelimitv1.RateLimitResponse_ALLOWED
		out.Remaining = left
		return true
	}
	b.denied.Add(1)
	// Retry at the assignment's end at the latest: the next report's
	// answer may bring a batch sooner, or be empty too.
	wait := time.Duration(max(exp-now, 0))
	out.Decision = ratelimitv1.RateLimitResponse_THROTTLED
	out.RetryAfterMs = ceilDiv(int64(wait), int64(time.Millisecond))
	out.ResetAfterSeconds = ceilDiv(int64(wait), int64(time.Second))
	return true
}

func (b *qkey) takeLocal(now int64) (bool, int64) {
	l := &b.local
	l.Lock()
	defer l.Unlock()
	l.tokens = min(l.max, l.tokens+float64(now-l.last)/1e9*l.rate)
	l.last = now
	if l.tokens >= 1 {
		l.tokens--
		return true, int64(l.tokens)
	}
	return false, 0
}

// note counts a check of an identity that is not hot, and subscribes it
// when it reaches HotAfter in the current interval.
func (q *quota) note(k denyKey, r *ratelimitv1.RateLimitRequest) {
	if r.GetTokenCost() != 0 {
		return // a batch is counted in requests at the route's cost
	}
	q.wmu.Lock()
	if until, ok := q.unbatchable[k]; ok {
		if q.now() < until {
			q.wmu.Unlock()
			return
		}
		delete(q.unbatchable, k)
	}
	n, seen := q.warm[k]
	if !seen && len(q.warm) >= 4*maxQuotaKeys {
		q.wmu.Unlock()
		return
	}
	n++
	q.warm[k] = n
	q.wmu.Unlock()
	if int(n) != q.cfg.HotAfter {
		return
	}
	q.mu.Lock()
	if q.keys[k] != nil || len(q.keys) >= maxQuotaKeys {
		q.mu.Unlock()
		return
	}
	b := &qkey{id: bucketID(r), key: k}
	q.keys[k] = b
	q.mu.Unlock()
	select {
	case q.subscribe <- b:
	default: // the next report subscribes it
	}
}

// bucketID is the RLQS bucket id of a request: its identity fields under
// the node's keys (docs/rlqs.md, "Bucket ids").
func bucketID(r *ratelimitv1.RateLimitRequest) map[string]string {
	id := map[string]string{}
	for _, f := range [...]struct{ k, v string }{
		{"tenant", r.GetTenantId()}, {"client", r.GetClientIdentifier()}, {"route", r.GetRoute()},
		{"method", r.GetMethod()}, {"ip", r.GetIp()}, {"tier", r.GetTier()},
	} {
		if f.v != "" {
			id[f.k] = f.v
		}
	}
	return id
}

func idKey(id map[string]string) denyKey {
	return denyKey{id["tenant"], id["client"], id["route"], id["method"], id["ip"], id["tier"], 0}
}

// run keeps a stream open while the client lives, one session at a time,
// a second apart after a failure.
func (q *quota) run() {
	defer close(q.done)
	for {
		q.session()
		select {
		case <-q.stop:
			return
		case <-time.After(time.Second):
		}
	}
}

// session is one stream: every key is subscribed at its start (a new
// stream knows none), reported each interval, and answered assignments
// are applied as they come.
func (q *quota) session() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := q.rlq.StreamRateLimitQuotas(ctx)
	if err != nil {
		return
	}
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			resp, err := s.Recv()
			if err != nil {
				return
			}
			q.messages.Add(1)
			q.apply(resp)
		}
	}()
	domain := QuotaDomain
	send := func(us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) bool {
		if len(us) == 0 {
			return true
		}
		q.messages.Add(1)
		err := s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us})
		domain = ""
		return err == nil
	}
	if !send(q.report(true)) {
		return
	}
	t := time.NewTicker(q.cfg.ReportInterval)
	defer t.Stop()
	for {
		select {
		case <-q.stop:
			_ = s.CloseSend()
			return
		case <-recvDone:
			return
		case b := <-q.subscribe:
			if !send([]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{q.usage(b, q.now())}) {
				return
			}
		case <-t.C:
			q.wmu.Lock()
			clear(q.warm)
			q.wmu.Unlock()
			if !send(q.report(false)) {
				return
			}
		}
	}
}

// report is the usage of every key (all, at a stream's start, as first
// reports).
func (q *quota) report(first bool) []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	now := q.now()
	q.mu.RLock()
	defer q.mu.RUnlock()
	us := make([]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, 0, len(q.keys))
	for _, b := range q.keys {
		if first {
			b.reported = 0
		}
		us = append(us, q.usage(b, now))
	}
	return us
}

// usage is one key's report, its counts since the last one.
func (q *quota) usage(b *qkey, now int64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           &rlqsv3.BucketId{Bucket: b.id},
		NumRequestsAllowed: b.allowed.Swap(0),
		NumRequestsDenied:  b.denied.Swap(0),
	}
	if b.reported != 0 {
		u.TimeElapsed = durationpb.New(time.Duration(now - b.reported))
	} else {
		u.TimeElapsed = durationpb.New(0)
	}
	b.reported = now
	return u
}

// sameStrategy is Envoy's test of whether an assignment keeps the
// bucket's token bucket (protoTokenBucketsEq, internal/testenv/rlqsfilter):
// two token buckets are the same when max_tokens, tokens_per_fill and
// fill_interval.nanos are; anything else by value.
func sameStrategy(a, b *typev3.RateLimitStrategy) bool {
	ta, tb := a.GetTokenBucket(), b.GetTokenBucket()
	if ta != nil && tb != nil {
		return ta.GetMaxTokens() == tb.GetMaxTokens() &&
			ta.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
			ta.GetFillInterval().GetNanos() == tb.GetFillInterval().GetNanos()
	}
	return proto.Equal(a, b)
}

// apply installs a response's assignments: as Envoy's filter does, a
// strategy the same as the bucket's (sameStrategy) only extends the TTL,
// another replaces the bucket (with the old one's ratio of tokens left),
// and abandon forgets the key (it is checked by RPC again, for
// unbatchableFor without being counted).
func (q *quota) apply(resp *rlqsv3.RateLimitQuotaResponse) {
	now := q.now()
	for _, a := range resp.GetBucketAction() {
		k := idKey(a.GetBucketId().GetBucket())
		q.mu.RLock()
		b := q.keys[k]
		q.mu.RUnlock()
		if b == nil {
			continue
		}
		if a.GetAbandonAction() != nil {
			q.mu.Lock()
			delete(q.keys, k)
			q.mu.Unlock()
			b.expires.Store(0) // q.last may still hold it
			q.wmu.Lock()
			if len(q.unbatchable) < maxQuotaKeys {
				q.unbatchable[k] = q.now() + int64(unbatchableFor)
			}
			q.wmu.Unlock()
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		if qa == nil {
			continue
		}
		// Envoy's expiry timer reads the TTL's whole seconds only.
		exp := now + qa.GetAssignmentTimeToLive().GetSeconds()*int64(time.Second)
		s := qa.GetRateLimitStrategy()
		if !sameStrategy(s, b.strategy) {
			b.strategy = s
			kind := kindDeny
			switch {
			case s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL && s.GetTokenBucket() == nil:
				kind = kindAllow
			case s.GetTokenBucket() != nil:
				tb := s.GetTokenBucket()
				per := 1.0
				if tb.GetTokensPerFill() != nil {
					per = float64(tb.GetTokensPerFill().GetValue())
				}
				// As Envoy: tokens_per_fill over the whole seconds of
				// fill_interval (under a second is no limit).
				rate := math.Inf(1)
				if secs := tb.GetFillInterval().GetSeconds(); secs > 0 {
					rate = per / float64(secs)
				}
				kind = kindBucket
				mx := float64(tb.GetMaxTokens())
				l := &b.local
				l.Lock()
				// As Envoy (createTokenBucketFromAction): a bucket that
				// replaces one starts with the old one's ratio of tokens
				// left, in whole tokens; a first one starts full.
				start := mx
				if b.kind.Load() == kindBucket && b.expires.Load() > now && l.max > 0 {
					left := min(l.max, l.tokens+float64(now-l.last)/1e9*l.rate)
					start = min(mx, math.Floor(mx*max(left, 0)/l.max))
				}
				l.max, l.rate, l.tokens, l.last = mx, rate, start, now
				l.Unlock()
			}
			b.kind.Store(kind)
		}
		b.expires.Store(exp)
	}
}
