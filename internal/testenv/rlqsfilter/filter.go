// Package rlqsfilter is an RLQS client that enforces its assignments the
// way Envoy's rate_limit_quota filter documents (no Envoy binary can be
// installed on the machines these tests run on): the first request of a
// bucket sends an immediate report, which subscribes it; every bucket is
// reported each reporting interval; an assignment lives for its TTL, and
// then the expired-assignment behaviour applies; an assignment repeating
// the bucket's strategy only extends its TTL, another strategy replaces
// it (a token bucket starts full); abandon forgets the bucket.
package rlqsfilter

import (
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Config configures a Filter.
type Config struct {
	Domain         string
	ReportInterval time.Duration
	// AllowUnassigned is the no-assignment behaviour: what a bucket does
	// before its first assignment (false: deny).
	AllowUnassigned bool
	// AllowExpired is the expired-assignment fallback (false: deny).
	AllowExpired bool
}

// Filter is one client's stream and buckets.
type Filter struct {
	cfg    Config
	stream grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel context.CancelFunc
	wg     sync.WaitGroup

	sendMu sync.Mutex
	sent   bool // the domain went out

	mu      sync.Mutex
	buckets map[string]*bucket
	err     error // why the stream ended
	recvd   int   // responses received
}

type bucket struct {
	id       map[string]string
	strategy *typev3.RateLimitStrategy // nil: no assignment
	expires  time.Time
	tokens   float64
	max      float64
	rate     float64 // tokens/s
	last     time.Time
	allowed  uint64
	denied   uint64
	reported time.Time
}

// Start opens a stream on conn and starts reporting.
func Start(ctx context.Context, conn grpc.ClientConnInterface, cfg Config) (*Filter, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	f := &Filter{cfg: cfg, stream: s, cancel: cancel, buckets: map[string]*bucket{}}
	f.wg.Add(2)
	go f.receive()
	go f.report(ctx)
	return f, nil
}

// Close ends the stream and waits for the filter's goroutines.
func (f *Filter) Close() {
	f.cancel()
	f.wg.Wait()
}

// Err is why the stream ended (nil while it is up, or after Close).
func (f *Filter) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Responses is how many responses the server sent.
func (f *Filter) Responses() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recvd
}

func key(id map[string]string) string {
	ks := slices.Sorted(maps.Keys(id))
	var b strings.Builder
	for _, k := range ks {
		b.WriteString(k + "=" + id[k] + "\x00")
	}
	return b.String()
}

// Allow decides one request of bucket id at now.
func (f *Filter) Allow(id map[string]string, now time.Time) bool {
	k := key(id)
	f.mu.Lock()
	b := f.buckets[k]
	var subscribe []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	if b == nil {
		b = &bucket{id: maps.Clone(id), reported: now}
		f.buckets[k] = b
		subscribe = append(subscribe, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: b.id}, TimeElapsed: durationpb.New(0),
		})
	}
	ok := b.decide(now, f.cfg)
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
	f.mu.Unlock()
	if subscribe != nil {
		_ = f.send(subscribe)
	}
	return ok
}

// Strategy is bucket id's current strategy and expiry (nil: none).
func (f *Filter) Strategy(id map[string]string) (*typev3.RateLimitStrategy, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.buckets[key(id)]
	if b == nil {
		return nil, time.Time{}
	}
	return b.strategy, b.expires
}

func (b *bucket) decide(now time.Time, cfg Config) bool {
	switch {
	case b.strategy == nil:
		return cfg.AllowUnassigned
	case !now.Before(b.expires):
		return cfg.AllowExpired
	}
	switch s := b.strategy.Strategy.(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return s.BlanketRule == typev3.RateLimitStrategy_ALLOW_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		// A caller's now may precede the assignment's arrival: time
		// never runs back for the bucket.
		if now.After(b.last) {
			b.tokens = min(b.max, b.tokens+now.Sub(b.last).Seconds()*b.rate)
			b.last = now
		}
		if b.tokens >= 1 {
			b.tokens--
			return true
		}
		return false
	}
	return false // a strategy this filter does not know denies
}

func (f *Filter) send(us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) error {
	f.sendMu.Lock()
	defer f.sendMu.Unlock()
	msg := &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: us}
	if !f.sent {
		msg.Domain = f.cfg.Domain
		f.sent = true
	}
	return f.stream.Send(msg)
}

func (f *Filter) report(ctx context.Context) {
	defer f.wg.Done()
	t := time.NewTicker(f.cfg.ReportInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f.mu.Lock()
			var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
			for _, b := range f.buckets {
				us = append(us, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
					BucketId: &rlqsv3.BucketId{Bucket: b.id}, TimeElapsed: durationpb.New(now.Sub(b.reported)),
					NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied,
				})
				b.allowed, b.denied, b.reported = 0, 0, now
			}
			f.mu.Unlock()
			if len(us) > 0 && f.send(us) != nil {
				return
			}
		}
	}
}

func (f *Filter) receive() {
	defer f.wg.Done()
	for {
		resp, err := f.stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				f.mu.Lock()
				f.err = err
				f.mu.Unlock()
			}
			return
		}
		now := time.Now()
		f.mu.Lock()
		f.recvd++
		for _, a := range resp.GetBucketAction() {
			f.apply(a, now)
		}
		f.mu.Unlock()
	}
}

func (f *Filter) apply(a *rlqsv3.RateLimitQuotaResponse_BucketAction, now time.Time) {
	k := key(a.GetBucketId().GetBucket())
	b := f.buckets[k]
	if b == nil {
		return // not subscribed: nothing to apply it to
	}
	if a.GetAbandonAction() != nil {
		delete(f.buckets, k)
		return
	}
	qa := a.GetQuotaAssignmentAction()
	if qa == nil {
		return
	}
	b.expires = now.Add(qa.GetAssignmentTimeToLive().AsDuration())
	s := qa.GetRateLimitStrategy()
	if proto.Equal(s, b.strategy) {
		return // the same strategy: only the TTL moves
	}
	b.strategy = s
	if tb := s.GetTokenBucket(); tb != nil {
		b.max = float64(tb.GetMaxTokens())
		b.tokens = b.max
		per := float64(1)
		if tb.GetTokensPerFill() != nil {
			per = float64(tb.GetTokensPerFill().GetValue())
		}
		b.rate = per / tb.GetFillInterval().AsDuration().Seconds()
		b.last = now
	}
}
