// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3): a client (Envoy's rate_limit_quota
// filter, or any RLQS client) reports its usage per bucket on a stream,
// and each report is answered with an assignment per bucket that the
// client enforces itself until its next report.
//
// A bucket of leased policies is assigned a rate: a token bucket whose
// rate is the client's max-min fair part of every region bucket the
// bucket spends (decide.Decider.Quota), split among all of that region
// bucket's consumers on every node (RLQS clients and, as one, the leases
// of CheckRateLimit) from the offered rates each node publishes in the region's
// Redis (lua/part.lua: one call per region bucket per node per reporting
// interval, more while parts move or leases share the bucket; see
// keyState.due). What clients admit is charged to the same region bucket
// at each settlement, estimated, and corrected by their reports. Parts a
// settlement moves are sent between reports. The strategy is sent
// byte-identical while the part holds, because Envoy keeps its bucket (and its spent tokens) only for an
// equal strategy, and compares token buckets by max_tokens,
// tokens_per_fill and fill_interval.nanos alone; intervals and TTLs are
// whole seconds, which is all Envoy reads of them (internal/testenv/rlqsfilter
// is a port of Envoy's filter, with the commit it follows).
//
// The bound is in ARCHITECTURE.md ("RLQS: rate parts"); docs/rlqs.md is
// the user's reference.
//
// rlqs owns the streams, each bucket's assignment and this node's side of
// every region bucket's split; it owns no counter: the region buckets are
// Redis's, the split's inputs are the ledger's. It must not decide which
// policies a bucket spends (decide.Decider.Quota does), and it never
// blocks a stream on another.
package rlqs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/policy"
)

// Decider says how a bucket's requests are decided: *decide.Decider.
type Decider interface {
	Quota(r *policy.Request) decide.Grant
	QuotaFailed(g *decide.Grant, cause error) decide.Grant
	QuotaUsage(key string, admitted, denied int64)
}

// RPCDomain is the domain of RLQS clients that check by RPC whatever they
// hold no assignment for (client.WithQuota): a bucket no client can
// decide (an exact policy) is abandoned for them, where a client with no
// other way to decide (Envoy) is told DENY_ALL.
const RPCDomain = "allot.client"

// Fixed settings (ARCHITECTURE.md, "Fixed settings" gives the reasons).
const (
	// DefaultMaxBuckets caps the buckets of one stream (Config.MaxBuckets).
	DefaultMaxBuckets = 4096
	// DefaultMaxStreams caps the node's open streams (Config.MaxStreams).
	DefaultMaxStreams = 2048
	// firstInterval is the reporting interval assumed until a bucket's
	// second report shows the real one: Envoy's (5 s at the commit
	// internal/testenv/rlqsfilter ports, whatever its configuration), so
	// that its first assignment outlives the wait for its next report.
	firstInterval = 5 * time.Second
	// maxInterval bounds the reporting interval a stream's reports may
	// claim: the assignment TTL follows it, and with it the bound.
	maxInterval = time.Minute
	// maxSilence ends a stream that has sent no report for this long
	// since it opened or since its last report: twice the longest
	// reporting interval, so a stream no client reports on does not
	// hold one of the node's streams (a connection's keepalive pings
	// would keep it open forever). Envoy reports when it opens a stream
	// and every 5 s after, buckets or none.
	maxSilence = 2 * maxInterval
)

// Event is one bucket's answer, for metrics.
type Event struct {
	// Kind is rate (a token bucket of the bucket's part), same (the
	// same strategy again), allow_all, deny_all, local, abandon (an exact
	// policy's bucket, for an RPCDomain client), release (idle, abandoned
	// to make room), overflow (past the stream's bucket cap: denied) or
	// invalid (a bad bucket id).
	Kind     string
	Rate     float64 // requests/s, for rate and same
	PolicyID string
	Degraded bool
}

// Config configures a Server.
type Config struct {
	Decider Decider
	Ledger  Ledger
	// Node names this node in the region's records of parts: unique
	// among the region's nodes (the node's advertised address).
	Node string
	// Keys maps bucket id keys to check fields: the Envoy RLS face's
	// mapping (server.DefaultEnvoyKeys), so that one Envoy configuration
	// names the same fields for both filters.
	Keys map[string]policy.Field
	// MaxBuckets caps one stream's buckets; buckets past it are denied,
	// and the stream lives. Zero means DefaultMaxBuckets.
	MaxBuckets int
	// MaxStreams caps the open streams; past it a new one is refused
	// ResourceExhausted. Zero means DefaultMaxStreams.
	MaxStreams int
	// Observe, if set, is called once per bucket answered.
	Observe func(ctx context.Context, ev Event)
	// Tracer makes one span per report; nil makes none.
	Tracer trace.Tracer
	// Log receives a line per refused bucket id: give it a rate-limited
	// logger (the node's per-request one, internal/ratelog). Nil discards.
	Log *slog.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Ticks paces the settlement of every key with consumers, and the
	// look at each stream's silence (maxSilence); nil ticks once a
	// second. A test on a virtual clock ticks it itself.
	Ticks <-chan time.Time
}

// Server implements rlqsv3.RateLimitQuotaServiceServer.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	cfg   Config
	split *splitter
	seq   atomic.Uint64
	// streams and buckets count what is open now, for metrics; refused
	// counts streams refused at the cap or while draining.
	streams, buckets, refused atomic.Int64
	drainOnce                 sync.Once
	draining                  chan struct{}
	stop                      context.CancelFunc
	done                      chan struct{}
	// tick is closed, and replaced, at each tick of the settlements: it
	// wakes the streams to look at how long they have been silent.
	tick atomic.Pointer[chan struct{}]
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.MaxBuckets <= 0 {
		cfg.MaxBuckets = DefaultMaxBuckets
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.Tracer == nil {
		cfg.Tracer = tracenoop.NewTracerProvider().Tracer("")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Node == "" {
		cfg.Node = "node"
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, split: newSplitter(cfg.Node, cfg.Ledger), draining: make(chan struct{}), stop: stop, done: make(chan struct{})}
	tick := make(chan struct{})
	s.tick.Store(&tick)
	go func() {
		defer close(s.done)
		ticks := cfg.Ticks
		if ticks == nil {
			t := time.NewTicker(settleEvery)
			defer t.Stop()
			ticks = t.C
		}
		s.split.run(ctx, cfg.Now, ticks, func() {
			next := make(chan struct{})
			close(*s.tick.Swap(&next))
		})
	}()
	return s
}

// Close stops the settlements of the server's keys (Drain ends its
// streams). The node calls it on its way out.
func (s *Server) Close() {
	s.stop()
	<-s.done
}

// Open returns the streams and buckets open now, and the streams refused
// so far.
func (s *Server) Open() (streams, buckets, refused int64) {
	return s.streams.Load(), s.buckets.Load(), s.refused.Load()
}

// Keys is how many region buckets the node splits now (for tests and
// metrics).
func (s *Server) Keys() int {
	s.split.mu.Lock()
	defer s.split.mu.Unlock()
	return len(s.split.keys)
}

// Drain ends every stream (Unavailable: the client reconnects to another
// node) and refuses new ones: the node is shutting down.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

var (
	errDraining = status.Error(codes.Unavailable, "rlqs: this node is draining; reconnect to another")
	errSilent   = status.Errorf(codes.DeadlineExceeded, "rlqs: no usage report for %v; a client reports at least every %v (Envoy every 5 s): open a new stream to report again", maxSilence, maxInterval)
)

// StreamRateLimitQuotas serves one client: each report is answered with
// an action for each bucket it names, in its order. A stream silent for
// maxSilence (no report, from its start or its last one) is ended
// DeadlineExceeded, looked at each tick (Config.Ticks) on Config.Now.
func (s *Server) StreamRateLimitQuotas(ss rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	last := s.cfg.Now() // the stream's start (before it counts in Open), then its last report
	select {
	case <-s.draining:
		s.refused.Add(1)
		return errDraining
	default:
	}
	if s.streams.Add(1) > int64(s.cfg.MaxStreams) {
		s.streams.Add(-1)
		s.refused.Add(1)
		return status.Errorf(codes.ResourceExhausted, "rlqs: this node serves %d streams, its most; connect to another node", s.cfg.MaxStreams)
	}
	st := &stream{s: s, buckets: map[string]*bucket{}, interval: firstInterval, moved: make(chan struct{}, 1)}
	defer func() {
		s.streams.Add(-1)
		s.buckets.Add(-int64(len(st.buckets)))
		for _, b := range st.buckets {
			b.leave(s.split)
		}
	}()
	ctx := ss.Context()
	msgs := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	errc := make(chan error, 1)
	go func() { // ends when the stream does (ctx ends as the handler returns)
		for {
			msg, err := ss.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-s.draining:
			return errDraining
		case <-ctx.Done(): // the client went; the receiver may have left first
			return ctx.Err()
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-*s.tick.Load():
			if s.cfg.Now().Sub(last) >= maxSilence {
				return errSilent
			}
		case msg := <-msgs:
			last = s.cfg.Now()
			resp, err := st.report(ctx, msg)
			if err != nil {
				return err
			}
			if err := ss.Send(resp); err != nil {
				return err
			}
		case <-st.moved:
			if resp := st.update(ctx); resp != nil {
				if err := ss.Send(resp); err != nil {
					return err
				}
			}
		}
	}
}

// stream is one client's stream.
type stream struct {
	s        *Server
	domain   string
	buckets  map[string]*bucket
	interval time.Duration // the client's reporting interval, whole seconds
	moved    chan struct{} // a settlement moved one of its parts
}

// ttl is how long an assignment lives, in whole seconds (Envoy reads
// assignment_time_to_live.seconds only): the reporting interval and
// answerWithin more for the next report's answer to arrive. An
// assignment that expires before the next one arrives puts Envoy on its
// expired-assignment fallback and then builds a new, full bucket.
func (st *stream) ttl() time.Duration { return st.interval + answerWithin }

// answerWithin is how late an answer may come: a report's settlement on a
// failing store waits up to the store's call timeout (1 s by default)
// before the fallback decides, and the answer crosses the network.
const answerWithin = 2 * time.Second

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
	if len(usages) > MaxUsages {
		return nil, status.Errorf(codes.InvalidArgument, "bucket_quota_usages: %d in one report; at most %d", len(usages), MaxUsages)
	}
	now := s.cfg.Now()
	type job struct {
		b  *bucket // nil: past the cap
		id *rlqsv3.BucketId
	}
	jobs := make([]job, 0, len(usages))
	named := make(map[*bucket]bool, len(usages))
	var keys []string
	var fresh []*consumer // the report's consumers
	for _, u := range usages {
		b := st.bucket(u.GetBucketId())
		if b == nil {
			jobs = append(jobs, job{nil, u.GetBucketId()})
			continue
		}
		if err := st.note(b, u, now); err != nil {
			return nil, err
		}
		if !named[b] { // a bucket named twice in one report is answered once
			named[b] = true
			jobs = append(jobs, job{b, u.GetBucketId()})
			for _, k := range b.grant.Keys {
				keys = append(keys, k.Key)
			}
			for _, c := range b.cons {
				fresh = append(fresh, c)
			}
		}
	}
	// Keys with a new consumer are settled now; the others answer from
	// their last settlement (parts that move are sent between reports).
	states := s.split.settle(ctx, now, keys, fresh)
	resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, 0, len(jobs))}
	for _, j := range jobs {
		var a *rlqsv3.RateLimitQuotaResponse_BucketAction
		if j.b == nil {
			st.observe(ctx, Event{Kind: "overflow"})
			a = blanket(j.id, typev3.RateLimitStrategy_DENY_ALL, st.ttl())
		} else if st.releasable(j.b, now) {
			st.observe(ctx, Event{Kind: "release"})
			a = abandon(j.id)
			j.b.leave(s.split)
			delete(st.buckets, j.b.id)
			s.buckets.Add(-1)
		} else {
			a = st.assign(ctx, j.b, j.id, states, now)
		}
		if a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
	}
	return resp, nil
}

// idleRelease is how long a bucket's reports must show no request before
// it may be released (ARCHITECTURE.md, "Fixed settings").
const idleRelease = time.Minute

// releasable says whether b is released (abandoned: the client forgets
// it, and a request of it later makes a new bucket) with this answer:
// when it has been idle for idleRelease and its stream holds more than
// half its cap of buckets. Only then: a released bucket's next request is
// decided by the client's no_assignment_behavior until its first answer
// (DENY_ALL denies it), so a caller that comes back every few minutes to
// a stream with room is not made to pay for it.
func (st *stream) releasable(b *bucket, now time.Time) bool {
	return !b.idleSince.IsZero() && now.Sub(b.idleSince) >= idleRelease && 2*len(st.buckets) > st.s.cfg.MaxBuckets
}

// update answers, between reports, the buckets whose parts a settlement
// moved past hysteresis from what was sent (RLQS lets the server send an
// assignment at any time; Envoy applies it as it would an answer):
// a part taken back reaches its client within a settlement, a second,
// rather than at its next report, and so does the room it frees. Nil
// when none moved.
func (st *stream) update(ctx context.Context) *rlqsv3.RateLimitQuotaResponse {
	now := st.s.cfg.Now()
	var acts []*rlqsv3.RateLimitQuotaResponse_BucketAction
	for _, b := range st.buckets {
		if b.bad != nil || b.grant.Kind != decide.GrantParts {
			continue
		}
		keys := make([]string, 0, len(b.grant.Keys))
		for _, k := range b.grant.Keys {
			keys = append(keys, k.Key)
		}
		rate, err := st.part(b, st.s.split.current(keys))
		if err != nil || b.sent != nil && math.Abs(rate-b.sent.rate) <= hysteresis*b.sent.rate || b.sent == nil && rate <= 0 {
			continue // a failed store is answered at the next report
		}
		a, _ := st.rate(b, b.pid, rate, now)
		st.observe(ctx, Event{Kind: "rate", Rate: rate, PolicyID: b.grant.PolicyID})
		acts = append(acts, a)
	}
	if len(acts) == 0 {
		return nil
	}
	return &rlqsv3.RateLimitQuotaResponse{BucketAction: acts}
}

// MaxUsages bounds one report's buckets (the node's codec refuses a
// report of more before decoding it: server.FanOut).
const MaxUsages = 4 * DefaultMaxBuckets

// bucket finds or makes the stream's bucket for id; nil past the cap. A
// bad id is a bucket too (answered deny-all, and released when idle like
// any other), so that it counts against the cap; it keeps only the hash
// of the id and why it is refused, whatever the id's size. A good id
// keeps its keys and values (MaxIDBytes), not the message they came in
// (which may carry unknown fields of any size): each report's answer
// names the id as that report did.
func (st *stream) bucket(id *rlqsv3.BucketId) *bucket {
	s := st.s
	key, req, bad := bucketID(id, s.cfg.Keys)
	if bad != nil {
		key = refusedID(id)
	}
	if b := st.buckets[key]; b != nil {
		return b
	}
	if len(st.buckets) >= s.cfg.MaxBuckets {
		return nil
	}
	b := &bucket{id: key, req: req, bad: bad, offered: math.Inf(1), cons: map[string]*consumer{}}
	if bad == nil {
		b.pid = &rlqsv3.BucketId{Bucket: maps.Clone(id.GetBucket())}
	}
	st.buckets[key] = b
	s.buckets.Add(1)
	if bad != nil {
		s.cfg.Log.Warn("rlqs: bucket id refused, answered DENY_ALL", "domain", st.domain, "err", bad)
	}
	return b
}
