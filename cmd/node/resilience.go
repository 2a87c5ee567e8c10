package main

import (
	"flag"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// resilienceFlags declares the flags of node.Resilience (Redis deadlines,
// circuit breakers; gossip is in gossip.go) and returns a function
// that reads them after parsing.
func resilienceFlags(fs *flag.FlagSet) func() node.Resilience {
	timeout := fs.Duration("redis-timeout", region.DefaultTimeout, "time budget of a decision waiting on a Redis shard that has stopped answering, the decision by the policy's on_store_failure included: a shard that holds calls and sends nothing back for this less --redis-timeout-margin (the least stall threshold; more when its recent round trips were slow) is judged stalled, its calls are decided by on_store_failure and its breaker opens. Time this node spends queueing or reading late is not counted against the shard")
	margin := fs.Duration("redis-timeout-margin", 0, "part of --redis-timeout kept back from the stall threshold, for waking up after it and deciding without Redis; 0 means min(1ms, --redis-timeout/5), negative none; must be less than --redis-timeout")
	leaseTimeout := fs.Duration("redis-lease-timeout", lease.DefaultCallTimeout, "longest one asynchronous lease refill or return may take on a healthy but busy shard (a stalled shard fails it sooner)")
	maxWait := fs.Duration("redis-max-wait", region.DefaultMaxWait, "longest a check may wait for this node to get an answer from a healthy Redis shard (queue included) before it is shed: answered UNAVAILABLE (HTTP 503) \"node overloaded\" and counted in allot_store_shed_total, never decided as a store failure")
	stallMax := fs.Duration("redis-stall-max", region.DefaultStallMax, "cap of the stall threshold, which grows to 4x a shard's recent slow round trip when round trips are slow")
	pipelines := fs.Int("redis-pipelines", region.DefaultPipelines, "pipelines in flight per Redis shard; concurrent calls beyond wait and go out together in the next pipeline (2 hides a distant Redis's network round trip under load, for twice the round trips)")
	maxBatch := fs.Int("redis-max-batch", region.DefaultMaxBatch, "most script calls in one pipeline")
	window := fs.Duration("breaker-window", region.DefaultBreakerWindow, "circuit breaker: rolling window over which a Redis shard's errors are counted")
	bucket := fs.Duration("breaker-bucket", region.DefaultBreakerBucket, "circuit breaker: the window rolls in steps of this")
	ratio := fs.Float64("breaker-failure-ratio", region.DefaultBreakerFailureRatio, "circuit breaker: fraction of failed round trips in the window that opens a shard's breaker")
	minReq := fs.Uint("breaker-min-requests", region.DefaultBreakerMinRequests, "circuit breaker: least round trips in the window before the ratio counts")
	consecutive := fs.Int("breaker-consecutive-failures", region.DefaultBreakerConsecutive, "circuit breaker: this many failed round trips in a row (a stall opens it at once) also open a shard's breaker (a dead shard under steady traffic would otherwise wait for half a window); negative disables")
	openFor := fs.Duration("breaker-open-for", region.DefaultBreakerOpenFor, "circuit breaker: the longest wait between background probes (PING) of an open breaker; each failed probe doubles the wait from --breaker-open-min up to this")
	openMin := fs.Duration("breaker-open-min", region.DefaultBreakerOpenMin, "circuit breaker: wait before the first probe of a breaker that opened, so a blip costs about this long decided without Redis")
	return func() node.Resilience {
		return node.Resilience{
			RedisTimeout:       *timeout,
			RedisTimeoutMargin: *margin,
			LeaseTimeout:       *leaseTimeout,
			RedisMaxWait:       *maxWait,
			RedisStallMax:      *stallMax,
			RedisPipelines:     *pipelines,
			RedisMaxBatch:      *maxBatch,
			Breaker: region.BreakerOptions{
				Window: *window, Bucket: *bucket, FailureRatio: *ratio,
				MinRequests: uint32(min(*minReq, 1<<31)), OpenFor: *openFor, OpenMin: *openMin, Consecutive: *consecutive,
			},
		}
	}
}
