package region

import (
	"errors"
	"time"
)

// ErrUnavailable is returned (wrapped) for calls to a shard whose circuit
// breaker is open or probing: the call was not sent, so it cannot have
// run. Callers decide by on_store_failure.
var ErrUnavailable = errors.New("region: redis shard unavailable (circuit breaker open)")

// Breaker defaults.
const (
	DefaultBreakerWindow       = 10 * time.Second
	DefaultBreakerBucket       = time.Second
	DefaultBreakerFailureRatio = 0.5
	DefaultBreakerMinRequests  = 20
	// DefaultBreakerOpenFor is the longest a breaker stays open between
	// probes; the first probe comes after DefaultBreakerOpenMin, and each
	// failed probe doubles the wait up to this.
	DefaultBreakerOpenFor = 5 * time.Second
	// DefaultBreakerOpenMin is the wait before the first probe of a
	// breaker that opened: a blip of a few milliseconds costs about this
	// much time decided without Redis, not a whole OpenFor.
	DefaultBreakerOpenMin = 50 * time.Millisecond
	// DefaultBreakerConsecutive opens a breaker after this many failed
	// round trips in a row, whatever the window holds. Without it a shard
	// that dies under steady traffic opens only when failures reach half
	// of a window full of earlier successes, about Window/2 later.
	DefaultBreakerConsecutive = 10
)

// BreakerOptions configure the circuit breaker of each Redis shard.
//
// The breaker counts round trips (one pipeline to the shard), not calls:
// one stall or broken connection that fails every call in flight is one
// event. It opens when, over the rolling Window, at least MinRequests
// round trips were made and at least FailureRatio of them failed, when
// Consecutive round trips in a row failed, or at once when the shard
// stalled (calls outstanding, nothing received for the stall threshold;
// see Options.Timeout). While open, calls fail at once with
// ErrUnavailable and a background PING probes the shard: after OpenMin,
// then after twice the previous wait up to OpenFor. The first probe
// answered in time closes the breaker. A breaker that opens again within
// a Window of closing continues the backoff where it stopped, so a
// flapping shard is probed less and less often.
type BreakerOptions struct {
	// Window is the rolling window failures are counted over, in steps of
	// Bucket (a bucket's counts leave the window whole).
	Window time.Duration
	Bucket time.Duration
	// FailureRatio in (0, 1] of failed round trips opens the breaker.
	FailureRatio float64
	// MinRequests is the least number of round trips in the window before
	// the ratio counts, so that one failure on an idle node does not open.
	MinRequests uint32
	// OpenFor is the longest wait between probes of an open breaker.
	OpenFor time.Duration
	// OpenMin is the wait before the first probe (default
	// DefaultBreakerOpenMin, at most OpenFor).
	OpenMin time.Duration
	// Consecutive failed round trips in a row also open the breaker (a
	// dead shard refusing connections); zero means
	// DefaultBreakerConsecutive, negative disables the rule.
	Consecutive int
	// Disabled turns breakers off (every call goes to Redis; a stalled
	// shard still fails the calls it holds). For benchmarks that compare.
	Disabled bool
}

func (o BreakerOptions) withDefaults() BreakerOptions {
	if o.Window <= 0 {
		o.Window = DefaultBreakerWindow
	}
	if o.Bucket <= 0 || o.Bucket > o.Window {
		o.Bucket = min(DefaultBreakerBucket, o.Window)
	}
	if o.FailureRatio <= 0 || o.FailureRatio > 1 {
		o.FailureRatio = DefaultBreakerFailureRatio
	}
	if o.MinRequests == 0 {
		o.MinRequests = DefaultBreakerMinRequests
	}
	if o.OpenFor <= 0 {
		o.OpenFor = DefaultBreakerOpenFor
	}
	if o.OpenMin <= 0 {
		o.OpenMin = DefaultBreakerOpenMin
	}
	o.OpenMin = min(o.OpenMin, o.OpenFor)
	if o.Consecutive == 0 {
		o.Consecutive = DefaultBreakerConsecutive
	}
	return o
}

// BreakerState is a breaker's state, as health reports it.
type BreakerState uint8

// Breaker states.
const (
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: open, with a probe in flight.
	BreakerHalfOpen
	BreakerOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return "unknown"
}

// breaker is one shard's circuit breaker: a pure state machine over the
// times it is given (no clock, timer or lock of its own; the shard holds
// its lock and schedules its probes).
type breaker struct {
	opts  BreakerOptions
	state BreakerState
	// Rolling window: counts per bucket, buckets[i] covering the bucket
	// that started at epoch+i*Bucket (a ring of len(buckets)).
	buckets     []bucketCounts
	head        int       // index of the current bucket
	headStart   time.Time // start of the current bucket
	consecutive int
	// Backoff: the wait before the next probe, when the breaker last
	// closed, and how many times it opened.
	wait     time.Duration
	closedAt time.Time
	probeAt  time.Time
	openings uint64
	// probeFailures counts failed probes.
	probeFailures uint64
}

type bucketCounts struct{ requests, failures uint32 }

func newBreaker(opts BreakerOptions) *breaker {
	n := int((opts.Window + opts.Bucket - 1) / opts.Bucket)
	return &breaker{opts: opts, buckets: make([]bucketCounts, max(n, 1))}
}

// roll advances the window to now, emptying buckets that left it.
func (b *breaker) roll(now time.Time) {
	if b.headStart.IsZero() {
		b.headStart = now
		return
	}
	steps := int(now.Sub(b.headStart) / b.opts.Bucket)
	if steps <= 0 {
		return
	}
	for i := range min(steps, len(b.buckets)) {
		b.buckets[(b.head+1+i)%len(b.buckets)] = bucketCounts{}
	}
	b.head = (b.head + steps) % len(b.buckets)
	b.headStart = b.headStart.Add(time.Duration(steps) * b.opts.Bucket)
}

func (b *breaker) counts() (requests, failures uint32) {
	for _, c := range b.buckets {
		requests += c.requests
		failures += c.failures
	}
	return requests, failures
}

// allow reports whether a call may be sent now.
func (b *breaker) allow() bool { return b.state == BreakerClosed }

// success records a round trip the shard answered.
func (b *breaker) success(now time.Time) {
	if b.state != BreakerClosed {
		return // a late answer of a call sent before the breaker opened
	}
	b.roll(now)
	b.buckets[b.head].requests++
	b.consecutive = 0
}

// failure records a failed round trip; it reports whether the breaker
// opened.
func (b *breaker) failure(now time.Time) bool {
	if b.state != BreakerClosed {
		return false
	}
	b.roll(now)
	b.buckets[b.head].requests++
	b.buckets[b.head].failures++
	b.consecutive++
	r, f := b.counts()
	if (b.opts.Consecutive > 0 && b.consecutive >= b.opts.Consecutive) ||
		(r >= b.opts.MinRequests && float64(f) >= b.opts.FailureRatio*float64(r)) {
		b.open(now)
		return true
	}
	return false
}

// stall records that the shard stopped answering calls it holds; it opens
// the breaker at once (it reports whether it did).
func (b *breaker) stall(now time.Time) bool {
	if b.state != BreakerClosed {
		return false
	}
	b.roll(now)
	b.buckets[b.head].requests++
	b.buckets[b.head].failures++
	b.consecutive++
	b.open(now)
	return true
}

func (b *breaker) open(now time.Time) {
	switch {
	case b.wait == 0 || b.closedAt.IsZero() || now.Sub(b.closedAt) >= b.opts.Window:
		b.wait = b.opts.OpenMin
	default: // reopened soon after closing: continue the backoff
		b.wait = min(2*b.wait, b.opts.OpenFor)
	}
	b.state = BreakerOpen
	b.probeAt = now.Add(b.wait)
	b.openings++
}

// probeDue reports whether a probe should start now; if so the breaker is
// half-open until probed reports its result.
func (b *breaker) probeDue(now time.Time) bool {
	if b.state != BreakerOpen || now.Before(b.probeAt) {
		return false
	}
	b.state = BreakerHalfOpen
	return true
}

// nextProbe is when the next probe is due (zero unless open).
func (b *breaker) nextProbe() time.Time {
	if b.state != BreakerOpen {
		return time.Time{}
	}
	return b.probeAt
}

// answered records that the shard answered a pipeline judged stalled:
// it was paused, not dead, and has just shown it is back, which is what a
// probe would learn. A breaker opened once (its first wait, OpenMin)
// closes at once, as on a probe answered in time: a pause of a few tens
// of milliseconds then costs its own length decided without Redis, not
// OpenMin. A breaker that reopened within a window of closing (in its
// backoff: a shard slow for good, whose replies all come late) waits for
// its probes, so a slow shard cannot flap the breaker at its own pace.
// It reports whether the breaker closed.
func (b *breaker) answered(now time.Time) bool {
	if b.state == BreakerClosed || b.wait != b.opts.OpenMin {
		return false
	}
	b.close(now)
	return true
}

func (b *breaker) close(now time.Time) {
	b.state = BreakerClosed
	b.closedAt = now
	b.consecutive = 0
	clear(b.buckets)
	b.headStart = now
}

// probed records a probe's result: ok closes the breaker with an empty
// window; a failure waits twice as long before the next probe.
func (b *breaker) probed(now time.Time, ok bool) {
	if b.state != BreakerHalfOpen {
		return
	}
	if ok {
		b.close(now)
		return
	}
	b.probeFailures++
	b.wait = min(2*b.wait, b.opts.OpenFor)
	b.state = BreakerOpen
	b.probeAt = now.Add(b.wait)
}
