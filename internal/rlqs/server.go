// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3) from the node's leases: a client
// (Envoy's rate_limit_quota filter, or any RLQS client) reports its usage
// per bucket on a stream, and each report is answered with an assignment
// per bucket that the client enforces itself until its next report.
//
// A bucket of a leased policy is assigned a batch: requests taken from
// this node's lease of the same region bucket that CheckRateLimit and
// every other node spend (decide.Decider.Reserve), sized to the client's
// max-min fair part of the limit among this node's clients of the bucket
// for one reporting interval, and sent as a token bucket that does not
// refill. The overshoot bound of leasing then holds with the assignment's
// TTL added to the lease TTL (ARCHITECTURE.md, "RLQS: assignments from
// leases"). docs/rlqs.md is the user's reference.
package rlqs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/policy"
)

// Reserver takes batches: *decide.Decider.
type Reserver interface {
	Reserve(ctx context.Context, r *policy.Request, size func(rate float64) (n, all int64)) (decide.Grant, error)
}

// RPCDomain is the domain of RLQS clients that check by RPC whatever they
// hold no assignment for (client.WithQuota): a bucket no batch can decide
// (an exact policy) is abandoned for them, where a client with no other
// way to decide (Envoy) is told DENY_ALL.
const RPCDomain = "allot.client"

// Fixed settings (ARCHITECTURE.md, "Fixed settings" gives the reasons).
const (
	// DefaultMaxBuckets caps the buckets of one stream (Config.MaxBuckets).
	DefaultMaxBuckets = 4096
	// firstInterval is the reporting interval assumed until a stream's
	// second report of a bucket shows the real one.
	firstInterval = time.Second
	// minInterval and maxInterval bound the reporting interval a stream's
	// reports may claim: the assignment TTL follows it, and with it the
	// overshoot bound.
	minInterval = 100 * time.Millisecond
	maxInterval = time.Minute
	// batchFill is a batch's refill period: one token an hour, so that in
	// an assignment's TTL (at most maxInterval + 1 s) it never refills a
	// whole token and the client admits at most the batch.
	batchFill = time.Hour
	// growth is how far a batch may exceed the demand a client reported,
	// so that a rising client is not held to last interval's rate.
	growth = 1.25
)

// Event is one bucket's answer, for metrics.
type Event struct {
	// Kind is batch, empty (a batch of 0: the bucket had nothing to
	// give), allow_all, deny_all, local, abandon (an exact policy's
	// bucket, for an RPCDomain client) or invalid (a bad bucket id).
	Kind     string
	Requests int64 // for batch
	PolicyID string
	Degraded bool
}

// Config configures a Server.
type Config struct {
	Reserver Reserver
	// Keys maps bucket id keys to check fields: the Envoy RLS face's
	// mapping (server.DefaultEnvoyKeys), so that one Envoy configuration
	// names the same fields for both filters.
	Keys map[string]policy.Field
	// MaxBuckets caps one stream's buckets; past it the stream ends with
	// ResourceExhausted. Zero means DefaultMaxBuckets.
	MaxBuckets int
	// Observe, if set, is called once per bucket answered.
	Observe func(ctx context.Context, ev Event)
	// Tracer makes one span per report; nil makes none.
	Tracer trace.Tracer
	// Log receives a line per refused bucket id: give it a rate-limited
	// logger (the node's per-request one, internal/ratelog), since a
	// client may send thousands. Nil discards.
	Log *slog.Logger
}

// Server implements rlqsv3.RateLimitQuotaServiceServer.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	cfg  Config
	subs *subscribers
	// streams and buckets count what is open now, for metrics.
	streams, buckets atomic.Int64
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.MaxBuckets <= 0 {
		cfg.MaxBuckets = DefaultMaxBuckets
	}
	if cfg.Tracer == nil {
		cfg.Tracer = tracenoop.NewTracerProvider().Tracer("")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, subs: newSubscribers()}
}

// Open returns the streams and buckets open now.
func (s *Server) Open() (streams, buckets int64) { return s.streams.Load(), s.buckets.Load() }

// bucket is one bucket id of one stream.
type bucket struct {
	id  string
	req policy.Request
	bad error // why the id is refused: answered deny-all
	// demand is the client's offered rate (requests/s) in its last
	// report; +Inf before one shows it.
	demand float64
	seen   bool   // a report of it was answered
	round  uint64 // batches sent: a batch alternates its fill interval
}

// stream is one client's stream.
type stream struct {
	s        *Server
	domain   string
	buckets  map[string]*bucket
	interval time.Duration // the client's reporting interval, as its reports show it
}

// StreamRateLimitQuotas serves one client: each report is answered with
// an action for each bucket it names, in its order.
func (s *Server) StreamRateLimitQuotas(ss rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	st := &stream{s: s, buckets: map[string]*bucket{}, interval: firstInterval}
	s.streams.Add(1)
	defer func() {
		s.streams.Add(-1)
		s.buckets.Add(-int64(len(st.buckets)))
		for _, b := range st.buckets {
			s.subs.drop(b.id, b)
		}
	}()
	ctx := ss.Context()
	for {
		msg, err := ss.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := st.report(ctx, msg)
		if err != nil {
			return err
		}
		if err := ss.Send(resp); err != nil {
			return err
		}
	}
}

// report answers one usage report.
func (st *stream) report(ctx context.Context, msg *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	s := st.s
	ctx, span := s.cfg.Tracer.Start(ctx, "rlqs.report", trace.WithAttributes(attribute.Int("rlqs.buckets", len(msg.GetBucketQuotaUsages()))))
	defer span.End()
	switch d := msg.GetDomain(); {
	case st.domain == "" && d == "":
		return nil, status.Error(codes.InvalidArgument, "domain: the first report must name a domain")
	case len(d) > decide.MaxIdentityLen:
		return nil, status.Errorf(codes.InvalidArgument, "domain: longer than %d bytes", decide.MaxIdentityLen)
	case st.domain == "":
		st.domain = d
	case d != "" && d != st.domain:
		return nil, status.Errorf(codes.InvalidArgument, "domain: %q after %q; open a new stream for another domain", d, st.domain)
	}
	usages := msg.GetBucketQuotaUsages()
	if len(usages) > s.cfg.MaxBuckets {
		return nil, status.Errorf(codes.InvalidArgument, "bucket_quota_usages: %d in one report; at most %d", len(usages), s.cfg.MaxBuckets)
	}
	type job struct {
		b  *bucket
		id *rlqsv3.BucketId
	}
	jobs := make([]job, 0, len(usages))
	named := make(map[*bucket]bool, len(usages))
	for _, u := range usages {
		b, err := st.bucket(u.GetBucketId())
		if err != nil {
			return nil, err
		}
		st.note(b, u)
		if !named[b] { // a bucket named twice in one report is assigned once
			named[b] = true
			jobs = append(jobs, job{b, u.GetBucketId()})
		}
	}
	// A cold bucket's reservation waits for its lease's refill, and the
	// lease manager joins concurrent refills into shared rounds: the
	// buckets are reserved side by side, reserveParallel at a time, and
	// answered in the report's order.
	actions := make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, len(jobs))
	var g errgroup.Group
	g.SetLimit(reserveParallel)
	for i, j := range jobs {
		g.Go(func() error {
			actions[i] = st.assign(ctx, j.b, j.id)
			return nil
		})
	}
	_ = g.Wait() // assign returns no error: a shed round is no action
	resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, 0, len(jobs))}
	for _, a := range actions {
		if a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
	}
	return resp, nil
}

// reserveParallel bounds the reservations one report runs at once.
const reserveParallel = 64

// bucket finds or makes the stream's bucket for id. A bad id is a bucket
// too (answered deny-all), so that it counts against the cap.
func (st *stream) bucket(id *rlqsv3.BucketId) (*bucket, error) {
	s := st.s
	key, req, bad := bucketID(id, s.cfg.Keys)
	if bad != nil {
		key = refusedID(id)
	}
	if b := st.buckets[key]; b != nil {
		return b, nil
	}
	if len(st.buckets) >= s.cfg.MaxBuckets {
		return nil, status.Errorf(codes.ResourceExhausted, "this stream has %d buckets, the most one stream may hold; open another stream or use fewer bucket ids", len(st.buckets))
	}
	b := &bucket{id: key, req: req, bad: bad, demand: math.Inf(1)}
	st.buckets[key] = b
	s.buckets.Add(1)
	if bad != nil {
		s.cfg.Log.Warn("rlqs: bucket id refused, answered DENY_ALL", "domain", st.domain, "err", bad)
	}
	return b, nil
}

// note updates b's demand and the stream's interval from a report of it.
// The first report of a bucket subscribes it (rlqs.proto): what it counts
// is from before the client had an assignment, so the demand stays
// unknown until the second.
func (st *stream) note(b *bucket, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	if b.bad != nil {
		return
	}
	el := u.GetTimeElapsed()
	if b.seen && el.IsValid() && el.AsDuration() > 0 {
		d := el.AsDuration()
		st.interval = min(max(d, minInterval), maxInterval)
		n := float64(u.GetNumRequestsAllowed()) + float64(u.GetNumRequestsDenied())
		b.demand = n / max(d, minInterval).Seconds()
	}
	b.seen = true
	st.s.subs.set(b.id, b, b.demand*growth)
}

// ttl is how long an assignment lives: the reporting interval, plus as
// much again (at most a second) for the next report's answer to arrive.
func (st *stream) ttl() time.Duration { return st.interval + min(st.interval, time.Second) }

// assign answers one bucket; nil if it cannot now (the node shed the
// round: the client keeps its assignment until its TTL).
func (st *stream) assign(ctx context.Context, b *bucket, id *rlqsv3.BucketId) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	s := st.s
	ttl := st.ttl()
	if b.bad != nil {
		st.observe(ctx, Event{Kind: "invalid"})
		return blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl)
	}
	var subscribers int
	g, err := s.cfg.Reserver.Reserve(ctx, &b.req, func(rate float64) (int64, int64) {
		part, all := s.subs.part(b.id, b, rate)
		batch := func(r float64) int64 { return int64(math.Ceil(min(r*st.interval.Seconds(), math.MaxUint32))) }
		return batch(part), batch(all)
	})
	if err != nil {
		s.cfg.Log.Debug("rlqs: round shed", "err", err)
		return nil
	}
	ev := Event{PolicyID: g.PolicyID, Degraded: g.Degraded}
	defer func() { st.observe(ctx, ev) }()
	switch g.Kind {
	case decide.GrantBatch:
		if g.Requests <= 0 {
			ev.Kind = "empty"
			return blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl)
		}
		ev.Kind, ev.Requests = "batch", g.Requests
		b.round++
		// A repeated strategy only extends the TTL of the client's bucket
		// (rlqs.proto, QuotaAssignmentAction): each batch must differ from
		// the last to be a fresh one.
		fill := batchFill + time.Duration(b.round%2)*time.Second
		return assignment(id, ttl, &typev3.TokenBucket{
			MaxTokens: uint32(g.Requests), TokensPerFill: wrapperspb.UInt32(1), FillInterval: durationpb.New(fill),
		})
	case decide.GrantLocal:
		ev.Kind = "local"
		subscribers = s.subs.count(b.id)
		rate := g.LocalRate / float64(subscribers)
		burst := g.LocalBurst / int64(subscribers)
		if rate <= 0 || burst <= 0 {
			return blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl)
		}
		return assignment(id, ttl, &typev3.TokenBucket{
			MaxTokens: uint32(min(burst, math.MaxUint32)), TokensPerFill: wrapperspb.UInt32(1),
			FillInterval: durationpb.New(time.Duration(float64(time.Second) / rate)),
		})
	case decide.GrantAllowAll:
		ev.Kind = "allow_all"
		return blanket(id, typev3.RateLimitStrategy_ALLOW_ALL, ttl)
	case decide.GrantDenyAll:
		if g.Unbatchable && st.domain == RPCDomain {
			// This client checks by RPC what it holds no assignment for.
			ev.Kind = "abandon"
			return &rlqsv3.RateLimitQuotaResponse_BucketAction{
				BucketId:     id,
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
			}
		}
		ev.Kind = "deny_all"
		return blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl)
	default:
		ev.Kind = "deny_all"
		return blanket(id, typev3.RateLimitStrategy_DENY_ALL, ttl)
	}
}

func (st *stream) observe(ctx context.Context, ev Event) {
	if f := st.s.cfg.Observe; f != nil {
		f(ctx, ev)
	}
}

func blanket(id *rlqsv3.BucketId, rule typev3.RateLimitStrategy_BlanketRule, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return action(id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}})
}

func assignment(id *rlqsv3.BucketId, ttl time.Duration, tb *typev3.TokenBucket) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return action(id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tb}})
}

func action(id *rlqsv3.BucketId, ttl time.Duration, strategy *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl),
				RateLimitStrategy:    strategy,
			},
		},
	}
}
