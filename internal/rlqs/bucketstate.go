package rlqs

import (
	"context"
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/policy"
)

// bucket is one bucket id of one stream.
type bucket struct {
	id  string
	req policy.Request
	bad error // why the id is refused: answered deny-all
	// offered is the client's offered rate (requests/s) in its last
	// report; +Inf before one shows it.
	offered float64
	seen    bool // a report of it was answered
	zeros   int  // reports in a row with time_elapsed under 1 s, after the first
	// idleSince is the first of the reports in a row that showed no
	// request; zero while requests come.
	idleSince time.Time
	grant     decide.Grant
	cons      map[string]*consumer // region key -> this bucket's claim on it
	sent      *sent
	pid       *rlqsv3.BucketId // its keys and values, for updates; nil if refused
}

// note updates b from a report of it: whether it is idle, its offered
// rate, its usage (charged to its region buckets at their next
// settlement) and its grant (a policy reload applies from the next
// report). A refused bucket is only idle or not.
func (st *stream) note(b *bucket, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) error {
	allowed, denied := int64(min(u.GetNumRequestsAllowed(), math.MaxInt32)), int64(min(u.GetNumRequestsDenied(), math.MaxInt32))
	if allowed+denied > 0 {
		b.idleSince = time.Time{}
	} else if b.idleSince.IsZero() {
		b.idleSince = now
	}
	if b.bad != nil {
		return nil
	}
	s := st.s
	// Envoy reports whole seconds; other clients are rounded to them.
	el := u.GetTimeElapsed().AsDuration().Round(time.Second)
	if b.seen {
		// Envoy reports time_elapsed in whole seconds: a bucket reported
		// twice in a row under a second apart (after the report its first
		// request sends) has a reporting interval under 1 s, and every
		// report of it would say 0.
		if el < time.Second {
			if b.zeros++; b.zeros >= 2 {
				return status.Error(codes.InvalidArgument, "reporting_interval: reports come less than 1 s apart (time_elapsed 0); set the filter's reporting_interval to a whole number of seconds, at least 1 s")
			}
		} else {
			b.zeros = 0
			st.interval = min(el, maxInterval)
			b.offered = float64(allowed+denied) / el.Seconds()
		}
	}
	b.seen = true
	g := s.cfg.Decider.Quota(&b.req)
	b.grant = g
	keep := make(map[string]bool, len(g.Keys))
	for _, k := range g.Keys {
		keep[k.Key] = true
		c := b.cons[k.Key]
		if c == nil {
			c = &consumer{seq: s.seq.Add(1), moved: st.moved}
			b.cons[k.Key] = c
		}
		s.split.join(k, c, b.offered*float64(g.Cost), st.interval)
		s.split.use(k.Key, c, allowed*g.Cost, now)
		if k.Global {
			s.cfg.Decider.QuotaUsage(k.Key, allowed*g.Cost, denied*g.Cost)
		}
	}
	for k, c := range b.cons {
		if !keep[k] {
			s.split.leave(k, c)
			delete(b.cons, k)
		}
	}
	return nil
}

// leave takes b's claims out of the split (each kept until its part
// expires).
func (b *bucket) leave(sp *splitter) {
	for k, c := range b.cons {
		sp.leave(k, c)
	}
}

// assign answers one bucket; nil if it cannot now (the node shed the
// settlement: the client keeps its assignment until its TTL).
func (st *stream) assign(ctx context.Context, b *bucket, id *rlqsv3.BucketId, states map[string]*keyState, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	s := st.s
	ttl := st.ttl()
	if b.bad != nil {
		st.observe(ctx, Event{Kind: "invalid"})
		return blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl)
	}
	g := b.grant
	if g.Kind == decide.GrantParts {
		rate, err := st.part(b, states)
		if err == nil {
			a, same := st.rate(b, id, rate, now)
			ev := Event{Kind: "rate", Rate: rate, PolicyID: g.PolicyID}
			if same {
				ev.Kind = "same"
			}
			st.observe(ctx, ev)
			return a
		}
		if decide.IsOverloaded(err) {
			s.cfg.Log.Debug("rlqs: settlement shed", "err", err)
			return nil
		}
		g = s.cfg.Decider.QuotaFailed(&b.grant, err)
	}
	b.sent = nil
	ev := Event{PolicyID: g.PolicyID, Degraded: g.Degraded}
	defer func() { st.observe(ctx, ev) }()
	switch g.Kind {
	case decide.GrantLocal:
		ev.Kind = "local"
		n := max(s.split.count(g.Keys), 1)
		rate, burst := g.LocalRate/float64(n), g.LocalBurst/int64(n)
		if rate <= 0 || burst <= 0 {
			return blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl)
		}
		return assignment(id, ttl, tokenBucket(rate, burst))
	case decide.GrantAllowAll:
		ev.Kind = "allow_all"
		return blanket(id, typev3.RateLimitStrategy_ALLOW_ALL, ttl)
	case decide.GrantDenyAll:
		if g.Unbatchable && st.domain == RPCDomain {
			// This client checks by RPC what it holds no assignment for.
			ev.Kind = "abandon"
			return abandon(id)
		}
	}
	ev.Kind = "deny_all"
	return blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl)
}

// part is b's rate in requests/s: the smallest of its parts of its
// region buckets, or the first settlement's error.
func (st *stream) part(b *bucket, states map[string]*keyState) (float64, error) {
	p, err := st.s.split.part(b.cons, states)
	return p / float64(b.grant.Cost), err
}

func (st *stream) observe(ctx context.Context, ev Event) {
	if f := st.s.cfg.Observe; f != nil {
		f(ctx, ev)
	}
}
