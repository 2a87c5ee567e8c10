package region

// The store's options and their defaults.

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"
)

// Defaults for Options fields left zero.
const (
	DefaultDialTimeout  = 2 * time.Second
	DefaultReadTimeout  = time.Second
	DefaultWriteTimeout = time.Second
	// DefaultTimeout is a node's default budget for one decision that
	// asks Redis (flag --redis-timeout): a slow Redis is worse than a dead
	// one (seed 001). The Redis call itself gets the budget less a margin
	// (CallTimeout): 4 ms by default. Options.Timeout left zero means
	// ReadTimeout instead, for tools (coordinator, tests) that are not on
	// a request path.
	DefaultTimeout = 5 * time.Millisecond
	// DefaultTimeoutMargin is the most of a decision's budget that
	// CallTimeout keeps back from the Redis call by default (flag
	// --redis-timeout-margin 0): the budget/5 cap leaves at least 80 % of
	// a tight budget to Redis. 1 ms is the Go runtime's timer granularity
	// on an idle process (it sleeps in epoll_wait, whose timeout is whole
	// milliseconds), i.e. how late a deadline's wake-up can be before any
	// scheduling delay; see CallTimeout.
	DefaultTimeoutMargin = time.Millisecond
	// DefaultMaxWait bounds how long a call may wait for this node to get
	// it answered by a healthy shard (queued, sent, replies unread) before
	// it is shed (ErrOverloaded).
	DefaultMaxWait = time.Second
	// DefaultPipelines is how many pipelines may be in flight to one shard
	// at once; calls beyond wait and go out together in the next one. (A
	// pipeline not yet full also yields once before it is sent and takes
	// the calls queued meanwhile: shard.send; ARCHITECTURE.md,
	// "Coalescing".) One: a second pipeline in flight halves the calls
	// each round trip carries, and on a busy node every round trip costs
	// both processes system calls and Redis a script entry, so from 16
	// checks in flight up one pipeline answered as many checks per second
	// or more, with a third fewer round trips (docs/performance.md,
	// "Pipelines per shard"; below that a second is seldom in flight). A
	// second hides a network round trip under load; an operator with a
	// distant Redis may set 2.
	DefaultPipelines = 1
	// DefaultMaxBatch is the most calls one pipeline carries.
	DefaultMaxBatch = 128
	// DefaultMaxQueue is the most calls that may wait for one shard; more
	// are shed at once.
	DefaultMaxQueue = 16384
)

// Options configure the connection to the region's Redis.
type Options struct {
	// Username and Password authenticate (ACL user, or just a password).
	Username string
	Password string
	// TLSConfig, when set, connects over TLS (with a Dialer, the Dialer
	// must do the TLS itself). For a cluster it applies to every shard.
	TLSConfig *tls.Config
	// DialTimeout, ReadTimeout and WriteTimeout bound each network step;
	// zero means the Default* constant.
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// PoolSize is the connection pool size per node; zero means the
	// go-redis default (10 per GOMAXPROCS).
	PoolSize int
	// Timeout is the stall threshold T (stall.go): a shard whose oldest
	// pipeline waited T while nothing arrived from it for T, no reply
	// waits unread, and the check ran on time, is stalled; its calls fail
	// with ErrStalled and its breaker opens. Zero means ReadTimeout.
	// Nodes set CallTimeout(--redis-timeout, 0): 4 ms by default. It is
	// not a deadline of each call: a call queued or unread because this
	// node is busy waits on (up to MaxWait).
	Timeout time.Duration
	// MaxWait bounds how long a call may wait on a shard judged healthy
	// (queue wait included) before it is shed with ErrOverloaded (default
	// DefaultMaxWait); it is also the socket deadline of a pipeline.
	MaxWait time.Duration
	// Pipelines, MaxBatch and MaxQueue shape the coalescing of calls per
	// shard: pipelines in flight at once, calls per pipeline, calls
	// queued (more are shed). Zero means the Default* constant.
	Pipelines int
	MaxBatch  int
	MaxQueue  int
	// Breaker configures the per-shard circuit breakers (breaker.go).
	Breaker BreakerOptions
	// Logger receives breaker state changes; nil discards them.
	Logger *slog.Logger
	// NoWarmUp skips Open's warm-up of each shard (Store.warm): for a store
	// that sends none of the decision scripts and has no busy start, as
	// a coordinator's, the warm-up would only hold Pipelines connections
	// and load scripts it never runs (storeScripts).
	NoWarmUp bool
	// Dialer, when set, opens every connection (addr is the Redis node's
	// own address, as the cluster announces it). A seam for tests that
	// route one shard through a fault-injecting proxy.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
}

// CallTimeout is the deadline of the Redis calls of a decision whose
// whole time budget is budget (a node's --redis-timeout): the budget less
// a margin kept for what follows the deadline. A call that times out is
// not noticed at its deadline but when the runtime wakes its goroutine,
// up to about a millisecond later on an idle process (timers wait in
// epoll_wait, in whole milliseconds) plus the machine's scheduling delay;
// then the decision still has to be made without Redis (by
// on_store_failure, in memory). The margin is for both, so that the
// decision as a whole ends by the budget, not the Redis wait alone.
//
// margin 0 means min(DefaultTimeoutMargin, budget/5); a negative margin
// means none (the call gets the whole budget). A budget that is not
// positive, or a margin that leaves the call no time, is an error.
func CallTimeout(budget, margin time.Duration) (time.Duration, error) {
	if budget <= 0 {
		return 0, fmt.Errorf("region: timeout %v must be positive", budget)
	}
	switch {
	case margin == 0:
		margin = min(DefaultTimeoutMargin, budget/5)
	case margin < 0:
		margin = 0
	case margin >= budget:
		return 0, fmt.Errorf("region: timeout margin %v leaves no time of the %v timeout for the Redis call", margin, budget)
	}
	return budget - margin, nil
}

func (o Options) withDefaults() Options {
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.Timeout <= 0 {
		o.Timeout = o.ReadTimeout
	}
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultMaxWait
	}
	if o.Pipelines <= 0 {
		o.Pipelines = DefaultPipelines
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = DefaultMaxQueue
	}
	o.Breaker = o.Breaker.withDefaults()
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}
