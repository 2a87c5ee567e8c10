package rlqsfilter

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
)

// MonotonicStart is where a Filter's monotonic clock starts: an Envoy up
// for 11.6 days, not one whose clock is near zero (token buckets are
// built from the clock's seconds; see the package doc).
const MonotonicStart = 1_000_000 * time.Second

type quotaStream = grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]

// Filter runs a Client over a real RLQS stream on real time: a report
// timer, a receiver per stream, and the reconnects the core asks for.
type Filter struct {
	rpc    rlqsv3.RateLimitQuotaServiceClient
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // wakes the loop: something to send, or a timer to arm

	mu        sync.Mutex
	core      *Client
	start     time.Time     // wall time of MonotonicStart
	last      time.Duration // latest monotonic time given to the core
	stream    quotaStream   // nil: down
	closed    bool
	err       error
	recvd     int
	streams   int
	loopTimer bool // the loop has seen the report timer armed
}

// Start makes a filter for the RLQS server on conn. Like Envoy, it opens
// the stream at its first bucket, not before.
func Start(ctx context.Context, conn grpc.ClientConnInterface, cfg Config) (*Filter, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := &Filter{
		rpc: rlqsv3.NewRateLimitQuotaServiceClient(conn), ctx: ctx, cancel: cancel,
		kick: make(chan struct{}, 1), start: time.Now(), last: MonotonicStart,
	}
	core, err := NewClient(cfg, f.openStream)
	if err != nil {
		cancel()
		return nil, err
	}
	f.core = core
	f.wg.Add(1)
	go f.loop()
	return f, nil
}

// Close ends the stream and waits for the filter's goroutines.
func (f *Filter) Close() {
	f.mu.Lock()
	f.closed = true // no stream opens from here on
	f.mu.Unlock()
	f.cancel()
	f.wg.Wait()
}

// Err is why the last stream ended or failed to open (nil while one is
// up, after a clean end, or after Close).
func (f *Filter) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Responses is how many responses the server sent, over all streams.
func (f *Filter) Responses() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recvd
}

// Streams is how many streams the filter opened.
func (f *Filter) Streams() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.streams
}

// Allow decides one request of bucket id at now (a wall time; the filter
// maps it onto its monotonic clock, which never runs back).
func (f *Filter) Allow(id map[string]string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ok := f.core.Allow(f.mono(now), id)
	f.wake()
	return ok
}

// Strategy is bucket id's cached strategy now (the server's assignment,
// or the expired-assignment fallback; nil: none, the no-assignment
// behaviour applies) and when it ends.
func (f *Filter) Strategy(id map[string]string) (*typev3.RateLimitStrategy, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.core.Bucket(f.mono(time.Now()), id)
	f.wake()
	if !ok || b.Action == nil {
		return nil, time.Time{}
	}
	return b.Action.GetQuotaAssignmentAction().GetRateLimitStrategy(), f.start.Add(b.Expires - MonotonicStart)
}

// Bucket is bucket id's state now (false: not cached).
func (f *Filter) Bucket(id map[string]string) (Bucket, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.core.Bucket(f.mono(time.Now()), id)
	f.wake()
	return b, ok
}

// mono maps a wall time onto the monotonic clock; callers' times may
// interleave, Envoy's monotonic clock does not run back.
func (f *Filter) mono(t time.Time) time.Duration {
	f.last = max(f.last, MonotonicStart+t.Sub(f.start))
	return f.last
}

// wake kicks the loop when the core has something to send or armed the
// report timer the loop does not wait for yet. Called with f.mu held.
func (f *Filter) wake() {
	if _, armed := f.core.NextReport(); f.core.Pending() == 0 && armed == f.loopTimer {
		return
	}
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// openStream is the core's startStreamImpl hook, called with f.mu held.
func (f *Filter) openStream() bool {
	if f.closed {
		return false
	}
	s, err := f.rpc.StreamRateLimitQuotas(f.ctx)
	if err != nil {
		f.err = err
		return false
	}
	f.stream, f.err = s, nil
	f.streams++
	f.wg.Add(1)
	go f.receive(s)
	return true
}

// receive applies one stream's responses; its end is onRemoteClose.
func (f *Filter) receive(s quotaStream) {
	defer f.wg.Done()
	for {
		resp, err := s.Recv()
		f.mu.Lock()
		if err != nil {
			if f.stream == s {
				f.stream = nil
				f.core.StreamClosed()
				if !f.closed && !errors.Is(err, io.EOF) {
					f.err = err
				}
			}
			f.mu.Unlock()
			return
		}
		f.recvd++
		f.core.Apply(f.mono(time.Now()), resp)
		f.wake()
		f.mu.Unlock()
	}
}

// loop fires the core's timers on real time and is the stream's only
// sender, so reports go out in the order the core made them.
func (f *Filter) loop() {
	defer f.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		f.mu.Lock()
		f.core.Advance(f.mono(time.Now()))
		msgs, s := f.core.Sent(), f.stream
		next, armed := f.core.NextReport()
		f.loopTimer = armed
		wait := next - f.last
		f.mu.Unlock()
		for _, m := range msgs {
			if s != nil {
				// A failed send ends the stream: its Recv reports why.
				_ = s.Send(m)
			}
		}
		var fire <-chan time.Time
		if armed {
			t.Reset(max(wait, 0))
			fire = t.C
		}
		select {
		case <-f.ctx.Done():
			t.Stop()
			return
		case <-f.kick:
		case <-fire:
		}
		t.Stop()
	}
}
