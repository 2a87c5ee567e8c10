package region

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable is returned (wrapped) for calls refused by an open (or
// probing) breaker: not sent, so they cannot have run.
var ErrUnavailable = errors.New("region: redis shard unavailable (circuit breaker open)")

// Breaker defaults (the node's --breaker-* flags).
const (
	DefaultBreakerFailures   = 10
	DefaultBreakerProbeAfter = 50 * time.Millisecond
	DefaultBreakerMaxOpen    = 5 * time.Second
)

// BreakerOptions configure the circuit breaker of each Redis shard, which
// counts round trips (pipelines), not calls:
//
//   - It opens when the shard stalls (stall.go) or when Failures round
//     trips in a row fail (refused connections, LOADING, READONLY, ...).
//   - While open, calls fail at once with ErrUnavailable; a PING probes
//     the shard after ProbeAfter, then after twice the previous wait, up
//     to MaxOpen.
//   - The first answer closes it: a probe's, or on a first opening the
//     late reply of the pipeline judged stalled. Opening again within
//     MaxOpen of closing continues the backoff (and waits for probes).
type BreakerOptions struct {
	Failures   int           // failed round trips in a row that open it; negative: only stalls do
	ProbeAfter time.Duration // wait before the first probe
	MaxOpen    time.Duration // longest wait between probes
	Disabled   bool          // no breakers (a stalled shard still fails the calls it holds)
}

func (o BreakerOptions) withDefaults() BreakerOptions {
	if o.Failures == 0 {
		o.Failures = DefaultBreakerFailures
	}
	if o.MaxOpen <= 0 {
		o.MaxOpen = DefaultBreakerMaxOpen
	}
	if o.ProbeAfter <= 0 {
		o.ProbeAfter = DefaultBreakerProbeAfter
	}
	o.ProbeAfter = min(o.ProbeAfter, o.MaxOpen)
	return o
}

// BreakerState is a breaker's state, as health reports it.
type BreakerState uint8

// Breaker states; half-open is open with a probe in flight.
const (
	BreakerClosed BreakerState = iota
	BreakerHalfOpen
	BreakerOpen
)

func (s BreakerState) String() string {
	return [...]string{"closed", "half-open", "open"}[min(s, BreakerOpen)]
}

// breaker is one shard's circuit breaker: a pure state machine over the
// times it is given (the shard holds its lock and runs its probes).
type breaker struct {
	opts          BreakerOptions
	state         BreakerState
	failed        int           // failed round trips in a row
	wait          time.Duration // the current wait between probes
	closedAt      time.Time
	probeAt       time.Time // when the next probe is due, while open
	openings      uint64
	probeFailures uint64
}

// record counts a round trip's outcome (a stall is a failure that opens
// it at once) and reports whether it opened. While open it ignores late
// outcomes of calls sent before.
func (b *breaker) record(now time.Time, failed, stall bool) bool {
	if b.state != BreakerClosed {
		return false
	}
	if !failed {
		b.failed = 0
		return false
	}
	b.failed++
	if !stall && (b.opts.Failures < 0 || b.failed < b.opts.Failures) {
		return false
	}
	if b.wait == 0 || now.Sub(b.closedAt) >= b.opts.MaxOpen {
		b.wait = b.opts.ProbeAfter
	} else { // reopened soon after closing: continue the backoff
		b.wait = min(2*b.wait, b.opts.MaxOpen)
	}
	b.state, b.probeAt = BreakerOpen, now.Add(b.wait)
	b.openings++
	return true
}

// probeDue reports whether a probe starts now: half-open until probed.
func (b *breaker) probeDue(now time.Time) bool {
	due := b.state == BreakerOpen && !now.Before(b.probeAt)
	if due {
		b.state = BreakerHalfOpen
	}
	return due
}

// probed records a probe's result: ok closes the breaker, a failure
// doubles the wait.
func (b *breaker) probed(now time.Time, ok bool) {
	switch {
	case b.state != BreakerHalfOpen:
	case ok:
		b.close(now)
	default:
		b.probeFailures++
		b.wait = min(2*b.wait, b.opts.MaxOpen)
		b.state, b.probeAt = BreakerOpen, now.Add(b.wait)
	}
}

// answered records the late reply of a pipeline judged stalled: the shard
// was paused, not dead. On a first opening it closes the breaker, as a
// probe would; in a backoff it waits for probes, so that a shard slow for
// good cannot flap the breaker at its own pace. It reports whether it
// closed.
func (b *breaker) answered(now time.Time) bool {
	if b.state == BreakerClosed || b.wait != b.opts.ProbeAfter {
		return false
	}
	b.close(now)
	return true
}

func (b *breaker) close(now time.Time) { b.state, b.closedAt, b.failed = BreakerClosed, now, 0 }

// shardFailure reports whether err says the shard is unhealthy (no answer
// in time, a failed connection, or an answer that it cannot serve); a
// script's own error is the shard working, a shed call is not its doing.
func shardFailure(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrOverloaded) {
		return false
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout), errors.As(err, &ne):
		return true
	}
	for _, p := range []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "BUSY"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	var re redis.Error
	return !errors.As(err, &re) // any other reply is an answer
}
